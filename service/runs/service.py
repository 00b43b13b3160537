"""Ingest of finished runs (rules I1-I5a, S1-S2)."""

from __future__ import annotations

import hashlib
import time
from array import array
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, Literal

import orjson
from sqlalchemy import bindparam, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from service import core
from service.errors import Conflict
from service.observability.metrics import SIX_STATS_DURATION
from service.runs.schemas import ContainerCreate, RunCreate, RunPublic
from service.sizing import priors
from service.sizing import state as job_state
from service.tables import Job, Run, RunContainer, RunGrowth
from service.wire import STAT_NAMES, to_rfc3339, utcnow

Result = Literal["created", "duplicate"]


def is_oom_suspect(
    *,
    memory_peak_bytes: int,
    memory_limit_bytes: int | None,
    oom_killed: bool | None,
    oom_kill_events: int | None,
    grew: bool = False,
    too_late: bool = False,
) -> bool:
    """Rule S1 (the 95% test in integers: peak >= 0.95 * limit  <=>  20 * peak >= 19 * limit), with
    growth (docs/sizing.md): a ``too_late`` growth event is a kill (G7); a container that grew (a
    ``grown`` event) and was not killed is not suspect by the 95 % clause (G6): it ended near the limit
    it grew to, which the guard raised ahead of its use, and its peak is a real sample."""
    if oom_killed or too_late:
        return True
    if oom_kill_events is not None and oom_kill_events > 0:
        return True
    if grew:
        return False
    return memory_limit_bytes is not None and 20 * memory_peak_bytes >= 19 * memory_limit_bytes


def reduce_cpu(
    container: ContainerCreate,
) -> tuple[float, float, float, float, float, float]:
    """Rule I2: the six stats, computed by the core from samples, or as given."""
    if container.cpu_samples_millicores is not None:
        started = time.perf_counter()
        stats = core.six_stats(array("d", container.cpu_samples_millicores))
        SIX_STATS_DURATION.observe(time.perf_counter() - started)
        return stats
    s = container.cpu_stats_millicores
    assert s is not None  # guaranteed by ContainerCreate's validator (rule I1)
    return s.peak, s.p99, s.p95, s.p75, s.p50, s.avg


def time_errors(body: RunCreate, *, now: datetime, max_ahead: timedelta, max_age: timedelta) -> list[dict[str, str]]:
    """The run's timestamps against a window around the server's clock (naive UTC ``now``):
    ``finished_at`` at most ``max_ahead`` ahead (a run stamped in the future would stay the
    job's newest, pinning its sizing and never pruned), ``started_at`` and ``finished_at`` at
    most ``max_age`` in the past. Errors name the field relative to the run."""
    errors: list[dict[str, str]] = []
    if body.finished_at - now > max_ahead:
        errors.append(
            {
                "field": "finished_at",
                "message": f"is more than {max_ahead.total_seconds():g}s ahead of the server's clock",
            }
        )
    for name in ("started_at", "finished_at"):
        value: datetime | None = getattr(body, name)
        if value is not None and now - value > max_age:
            errors.append({"field": name, "message": f"is more than {max_age / timedelta(days=1):g} days in the past"})
    return errors


@dataclass(frozen=True)
class PreparedRun:
    """A validated run reduced to what is stored, with its content hash (rule I4)."""

    body: RunCreate
    containers: list[dict[str, Any]]  # RunContainer columns, without run_pk
    clean: bool
    content_hash: str
    #: RunGrowth columns, without run_pk: the growth events of every container (issue 40)
    growths: tuple[dict[str, Any], ...] = ()


def prepare(body: RunCreate) -> PreparedRun:
    containers: list[dict[str, Any]] = []
    canonical: list[dict[str, Any]] = []
    growths: list[dict[str, Any]] = []
    for position, c in enumerate(body.containers):
        stats = reduce_cpu(c)
        events = c.growths or []
        too_late = any(e.result == "too_late" for e in events)
        suspect = is_oom_suspect(
            memory_peak_bytes=c.memory_peak_bytes,
            memory_limit_bytes=c.memory_limit_bytes,
            oom_killed=c.oom_killed,
            oom_kill_events=c.oom_kill_events,
            grew=any(e.result == "grown" for e in events),
            too_late=too_late,
        )
        growths += (
            {
                "position": position,
                "seq": seq,
                "at": e.at,
                "from_bytes": e.from_bytes,
                "to_bytes": e.to_bytes,
                "result": e.result,
            }
            for seq, e in enumerate(events)
        )
        containers.append(
            {
                "position": position,
                "name": c.name,
                **{f"cpu_{k}": v for k, v in zip(STAT_NAMES, stats, strict=True)},
                "memory_peak_bytes": c.memory_peak_bytes,
                "memory_limit_bytes": c.memory_limit_bytes,
                "cpu_request_millicores": c.cpu_request_millicores,
                # G7: a too_late event is the collector's report of a kill: stored as one, so every count of
                # kills (E1's samples, the OOM streak, the jobs list) sees it whatever the flags said
                "oom_killed": True if too_late else c.oom_killed,
                "oom_kill_events": c.oom_kill_events,
                "oom_suspect": suspect,
            }
        )
        doc = {
            "name": c.name,
            "cpu": list(stats),
            "memory_peak_bytes": c.memory_peak_bytes,
            "memory_limit_bytes": c.memory_limit_bytes,
            "oom_killed": c.oom_killed,
            "oom_kill_events": c.oom_kill_events,
        }
        if c.cpu_request_millicores is not None:  # only when given: runs stored before it keep their hash
            doc["cpu_request_millicores"] = c.cpu_request_millicores
        if events:  # I4: the events are part of the run's content (only when given, as above)
            doc["growths"] = [[to_rfc3339(e.at), e.from_bytes, e.to_bytes, e.result] for e in events]
        canonical.append(doc)
    document = {
        "started_at": to_rfc3339(body.started_at),
        "finished_at": to_rfc3339(body.finished_at),
        "node_memory_bytes": body.node_memory_bytes,
        "pod_memory_peak_bytes": body.pod_memory_peak_bytes,
        "containers": canonical,
    }
    digest = hashlib.sha256(orjson.dumps(document, option=orjson.OPT_SORT_KEYS)).hexdigest()
    clean = not any(c["oom_suspect"] for c in containers)  # rule S2
    return PreparedRun(body=body, containers=containers, clean=clean, content_hash=digest, growths=tuple(growths))


def run_document(body: RunCreate, run: Any, containers: list[Any], result: Result) -> dict[str, Any]:
    """The run as answered (``RunPublic``'s fields, in its order) as plain values: the route
    validates it into the model, the one-statement POST writes it as JSON as it is. ``run`` and
    ``containers``: rows or models with the Run and RunContainer columns. The growth events are the
    body's: a stored run's are the same content (I4)."""
    events = {c.name: c.growths for c in body.containers if c.growths}
    return {
        "org": body.org,
        "repo": body.repo,
        "workflow": body.workflow,
        "job": body.job,
        "run_id": run.run_id,
        "finished_at": to_rfc3339(run.finished_at) or "",
        "result": result,
        "clean": run.clean,
        "oom_suspect_containers": [c.name for c in containers if c.oom_suspect],
        "containers": [
            {
                "name": c.name,
                "cpu_stats_millicores": {k: getattr(c, f"cpu_{k}") for k in STAT_NAMES},
                "memory_peak_bytes": c.memory_peak_bytes,
                "oom_suspect": c.oom_suspect,
                "growths": [
                    {"at": to_rfc3339(e.at), "from_bytes": e.from_bytes, "to_bytes": e.to_bytes, "result": e.result}
                    for e in events.get(c.name, ())
                ],
            }
            for c in containers
        ],
    }


def run_public(body: RunCreate, run: Any, containers: list[Any], result: Result) -> RunPublic:
    """``run_document`` as the model."""
    return RunPublic.model_validate(run_document(body, run, containers, result))


# The write path of one run, in Core statements built once: no ORM unit of work. Jobs are never
# deleted, so a job id, once read back from the database, is remembered in process.
_jobs = Job.__table__  # type: ignore[attr-defined]
_runs = Run.__table__  # type: ignore[attr-defined]
_containers = RunContainer.__table__  # type: ignore[attr-defined]
_JOB_ID = select(_jobs.c.id).where(
    _jobs.c.org == bindparam("org"),
    _jobs.c.repo == bindparam("repo"),
    _jobs.c.workflow == bindparam("workflow"),
    _jobs.c.job == bindparam("job"),
)
_NEW_JOB = insert(_jobs).returning(_jobs.c.id)
_EXISTING_RUN = select(_runs).where(_runs.c.job_id == bindparam("job_id"), _runs.c.run_id == bindparam("run_id"))
_STORED_CONTAINERS = (
    select(_containers).where(_containers.c.run_pk == bindparam("run_pk")).order_by(_containers.c.position)
)
_NEW_CONTAINERS = insert(_containers)
_NEW_GROWTHS = insert(RunGrowth.__table__)  # type: ignore[attr-defined]


def _new_run(dialect: str) -> Any:
    """INSERT ... ON CONFLICT (job_id, run_id) DO NOTHING RETURNING id: no id back means the run
    is already stored (rule I4), without a failed statement or a prior lookup."""
    stmt = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(_runs)
    return stmt.on_conflict_do_nothing(index_elements=["job_id", "run_id"]).returning(_runs.c.id)


_NEW_RUN = {name: _new_run(name) for name in ("postgresql", "sqlite")}


class JobIds:
    """Job ids by key, one per app (per database), bounded (oldest first out). Only ids read back
    from the database, which are committed, are kept; an id that fails its foreign key (a job
    deleted by hand) is forgotten when the ingest retries."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._ids: dict[tuple[str, str, str, str], int] = {}

    def get(self, key: tuple[str, str, str, str]) -> int | None:
        return self._ids.get(key)

    def put(self, key: tuple[str, str, str, str], job_id: int) -> None:
        self._ids[key] = job_id
        if len(self._ids) > self.capacity:
            del self._ids[next(iter(self._ids))]

    def forget(self, key: tuple[str, str, str, str]) -> None:
        self._ids.pop(key, None)


async def job_id_for(*, session: AsyncSession, job_ids: JobIds, org: str, repo: str, workflow: str, job: str) -> int:
    """The job's id; the job is created on first sight. Raises IntegrityError when a concurrent
    insert of the same job won (the caller rolls back and tries again)."""
    key = (org, repo, workflow, job)
    cached = job_ids.get(key)
    if cached is not None:
        return cached
    params = {"org": org, "repo": repo, "workflow": workflow, "job": job}
    conn = await session.connection()  # Core statements: no ORM session machinery per statement
    found: int | None = (await conn.execute(_JOB_ID, params)).scalar_one_or_none()
    if found is not None:
        job_ids.put(key, found)
        return found
    created: int = (await conn.execute(_NEW_JOB, {**params, "created_at": utcnow()})).scalar_one()
    return created


@dataclass(frozen=True)
class Ingested:
    run: RunPublic
    job_id: int
    #: the result of each growth event newly stored with the run (none for a duplicate): what
    #: ``ci_sizer_growths_total`` counts once the run is committed
    growths: tuple[str, ...] = ()


async def _ingest_once(session: AsyncSession, prepared: PreparedRun, job_ids: JobIds) -> Ingested:
    body = prepared.body
    job_id = await job_id_for(
        session=session, job_ids=job_ids, org=body.org, repo=body.repo, workflow=body.workflow, job=body.job
    )
    values = {
        "job_id": job_id,
        "run_id": body.run_id,
        "started_at": body.started_at,
        "finished_at": body.finished_at,
        "ingested_at": utcnow(),
        "node_memory_bytes": body.node_memory_bytes,
        "pod_memory_peak_bytes": body.pod_memory_peak_bytes,
        "clean": prepared.clean,
        "content_hash": prepared.content_hash,
    }
    conn = await session.connection()
    run_pk: int | None = (await conn.execute(_NEW_RUN[conn.dialect.name], values)).scalar_one_or_none()
    if run_pk is None:  # rule I4: already stored
        existing = (await conn.execute(_EXISTING_RUN, {"job_id": job_id, "run_id": body.run_id})).one()
        if existing.content_hash != prepared.content_hash:
            raise Conflict(
                f"run {body.run_id!r} of this job was already stored with different content; nothing was changed"
            )
        stored = list((await conn.execute(_STORED_CONTAINERS, {"run_pk": existing.id})).all())
        return Ingested(run_public(body, existing, stored, "duplicate"), job_id)
    containers = [{"run_pk": run_pk, **row} for row in prepared.containers]
    await conn.execute(_NEW_CONTAINERS, containers)
    if prepared.growths:  # issue 40: the growth events, in the run's transaction
        await conn.execute(_NEW_GROWTHS, [{"run_pk": run_pk, **g} for g in prepared.growths])
    rows: list[Any] = [SimpleNamespace(**c) for c in containers]
    # the job's build-path state (PostgreSQL), before the org's prior: the fast path's lock order
    await job_state.rebuild(conn=conn, job_ids=[job_id])
    await priors.record(conn=conn, org=body.org, job_id=job_id, run_pk=run_pk, clean=prepared.clean, containers=rows)
    run = SimpleNamespace(**values, id=run_pk)
    return Ingested(run_public(body, run, rows, "created"), job_id, tuple(g["result"] for g in prepared.growths))


async def ingest(
    *, session: AsyncSession, body: RunCreate, job_ids: JobIds, prepared: PreparedRun | None = None
) -> Ingested:
    """Store one run unless it is already there (rule I4).

    Returns the run with ``result`` "created" or "duplicate"; raises ``Conflict`` for the same
    key with other content. The same run posted concurrently is stored once (the insert does
    nothing on the unique key and the loser reads the winner's run). A concurrent first insert of
    the same job loses on the unique constraint; the transaction is then rolled back and the
    lookup repeated.
    """
    prepared = prepared or prepare(body)
    key = (body.org, body.repo, body.workflow, body.job)
    for _ in range(3):
        try:
            return await _ingest_once(session, prepared, job_ids)
        except IntegrityError:
            await session.rollback()
            job_ids.forget(key)
    return await _ingest_once(session, prepared, job_ids)
