"""One job's sizing answer read with ONE statement on a bare asyncpg connection (PostgreSQL only).

The same history and overrides as ``history.load_history`` and ``overrides.service.applicable``
(three statements through SQLAlchemy), in one round trip and without SQLAlchemy's per-statement
work: the job's summary (id; its clean runs and newest node memory from its build-path state,
``sizing/state.py``, so that no statement counts its runs), the window of runs with their
containers (rule S3: from the oldest of the newest ``max(runs, 3)`` clean runs on, or every run when
none is clean) and the overrides that bear on the job (O2), as one result. The answer is computed by
the same ``sizing.service.compute`` (the core's ``size_run``), so the policy has one home.

Every row carries the job's columns and the overrides (as JSON, usually null); a job never seen gives
one row with no job; a window row per container of each run, newest run first.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import orjson

from service.keys import ScopeKey
from service.observability.metrics import SIZE_JOB_DURATION
from service.overrides.service import PinRow, is_expired
from service.sizing.history import _PHASE_SAMPLES, History, HistoryRun, run_seconds
from service.sizing.params import SizingParams
from service.sizing.service import Policy, Recommendation, choose, compute
from service.sizing.state import StateRepair
from service.wire import utcnow

# $1-$4 the job's key, $5 how many clean runs the window reaches back to
STATEMENT = """
WITH j AS (
    -- the counts from the job's build-path state (sizing/state.py); from its runs when that is
    -- invalid or missing (the row is then noted for repair: ``stale``)
    SELECT jobs.id, s.clean_runs IS NULL AS stale,
        CASE WHEN s.clean_runs IS NOT NULL THEN s.clean_runs
            ELSE (SELECT count(*) FROM runs WHERE runs.job_id = jobs.id AND runs.clean) END AS clean_samples,
        CASE WHEN s.clean_runs IS NOT NULL THEN s.node_memory_bytes
            ELSE (SELECT runs.node_memory_bytes FROM runs
                  WHERE runs.job_id = jobs.id AND runs.node_memory_bytes IS NOT NULL
                  ORDER BY runs.finished_at DESC, runs.id DESC LIMIT 1) END AS node_memory_bytes
    FROM jobs LEFT JOIN job_state AS s ON s.job_id = jobs.id
    WHERE jobs.org = $1 AND jobs.repo = $2 AND jobs.workflow = $3 AND jobs.job = $4
),
newest_clean AS (
    SELECT runs.finished_at, runs.id FROM runs
    WHERE runs.job_id = (SELECT id FROM j) AND runs.clean
    ORDER BY runs.finished_at DESC, runs.id DESC LIMIT $5
),
boundary AS (
    SELECT finished_at, id FROM newest_clean ORDER BY finished_at, id LIMIT 1
),
o AS (
    SELECT json_agg(ov) AS pins FROM overrides ov
    WHERE ov.org = $1 AND (
        (ov.repo = '' AND ov.workflow = '' AND ov.job = '')
        OR (ov.repo = $2 AND ov.workflow = '' AND ov.job = '')
        OR (ov.repo = $2 AND ov.workflow = $3 AND ov.job = '')
        OR (ov.repo = $2 AND ov.workflow = $3 AND ov.job = $4))
)
SELECT o.pins, j.id AS job_id, j.stale, j.clean_samples, j.node_memory_bytes,
    w.id, w.clean, w.pod_memory_peak_bytes, w.started_at, w.finished_at, w.name, w.cpu_peak, w.cpu_p99, w.cpu_p95, w.cpu_p75,
    w.cpu_p50, w.cpu_avg, w.memory_peak_bytes, w.memory_limit_bytes, w.oom_suspect
FROM o
LEFT JOIN j ON true
LEFT JOIN LATERAL (
    SELECT r.id, r.clean, r.pod_memory_peak_bytes, r.started_at, r.finished_at, c.position, c.name, c.cpu_peak,
        c.cpu_p99, c.cpu_p95, c.cpu_p75, c.cpu_p50, c.cpu_avg, c.memory_peak_bytes,
        c.memory_limit_bytes, c.oom_suspect
    FROM runs r JOIN run_containers c ON c.run_pk = r.id
    WHERE r.job_id = j.id
      AND (r.finished_at, r.id) >= (
          coalesce((SELECT finished_at FROM boundary), '-infinity'::timestamp),
          coalesce((SELECT id FROM boundary), 0))
) w ON true
ORDER BY w.finished_at DESC, w.id DESC, w.position
"""


def _pin(raw: dict[str, Any]) -> PinRow:
    """An override as ``compute`` reads it (the table's columns as attributes)."""
    expires = raw.get("expires_at")
    raw["expires_at"] = None if expires is None else datetime.fromisoformat(expires)
    return SimpleNamespace(**raw)


def history_of(rows: list[Any], *, need_node_memory: bool) -> tuple[int | None, History, dict[str, PinRow]]:
    """The job's id, history and applicable (unexpired) overrides from the statement's rows."""
    history = History()
    if not rows:  # the statement always gives a row; none only if the tables vanished
        return None, history, {}
    first = rows[0]
    pins_json = first["pins"]
    pins: dict[str, PinRow] = {}
    if pins_json is not None:
        now = utcnow()
        for raw in orjson.loads(pins_json):
            pin = _pin(raw)
            if not is_expired(pin, now):
                pins[pin.scope] = pin
    job_id: int | None = first["job_id"]
    if job_id is None:
        return None, history, pins
    history.clean_samples = first["clean_samples"]
    if need_node_memory:
        history.newest_node_memory_bytes = first["node_memory_bytes"]
    current: HistoryRun | None = None
    for row in rows:
        run_id = row["id"]
        if run_id is None:
            continue
        if current is None or current.id != run_id:
            current = HistoryRun(
                id=run_id,
                clean=row["clean"],
                pod_memory_peak_bytes=row["pod_memory_peak_bytes"],
                seconds=run_seconds(row["started_at"], row["finished_at"]),
            )
            history.window.append(current)
        current.containers[row["name"]] = row  # an asyncpg Record: stats by attribute below
    for run in history.window:
        run.containers = {name: _Stats(r) for name, r in run.containers.items()}
    return job_id, history, pins


class _Stats:
    """A window row's container columns as attributes (what ``compute`` reads)."""

    __slots__ = (
        "cpu_avg",
        "cpu_p50",
        "cpu_p75",
        "cpu_p95",
        "cpu_p99",
        "cpu_peak",
        "memory_limit_bytes",
        "memory_peak_bytes",
        "oom_suspect",
    )

    def __init__(self, row: Any) -> None:
        self.cpu_peak = row["cpu_peak"]
        self.cpu_p99 = row["cpu_p99"]
        self.cpu_p95 = row["cpu_p95"]
        self.cpu_p75 = row["cpu_p75"]
        self.cpu_p50 = row["cpu_p50"]
        self.cpu_avg = row["cpu_avg"]
        self.memory_peak_bytes = row["memory_peak_bytes"]
        self.memory_limit_bytes = row["memory_limit_bytes"]
        self.oom_suspect = row["oom_suspect"]


async def recommend(
    *, conn: Any, key: ScopeKey, params: SizingParams, policy: Policy, repair: StateRepair | None = None
) -> Recommendation | None:
    """``sizing.service.recommend`` in one statement on an asyncpg connection (a job whose build-path
    state is invalid or missing is noted for ``repair``); None for a job the ``efficient`` policy
    sizes (by the setting or an override): its window and first-run prior are read by
    ``sizing.service.recommend`` on the route."""
    rows = await conn.fetch(STATEMENT, key.org, key.repo, key.workflow, key.job, max(params.runs, _PHASE_SAMPLES))
    job_id, history, pins = history_of(rows, need_node_memory=policy.max_memory is None)
    if repair is not None and job_id is not None and rows[0]["stale"]:
        repair.note(job_id)
    if choose(pins, policy) != "seed":
        return None
    started = time.perf_counter()
    computed = compute(key=key, history=history, pins=pins, params=params, policy=policy)
    SIZE_JOB_DURATION.observe(time.perf_counter() - started)
    expiries = [o.expires_at.replace(tzinfo=UTC).timestamp() for o in pins.values() if o.expires_at is not None]
    return Recommendation(answer=computed, job_id=job_id, fresh_until=min(expiries, default=math.inf))


async def prime(conn: Any) -> None:
    """Plan STATEMENT on a new connection (asyncpg keeps it planned per connection) by running it for
    a job that cannot exist (names are never empty, rule I3)."""
    await conn.fetch(STATEMENT, "", "", "", "", _PHASE_SAMPLES)
