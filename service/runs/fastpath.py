"""``POST /api/v1/runs`` of a new run answered before routing, on PostgreSQL, in ONE statement.

The route (``runs/router.py``) takes a session, a unit of work and about seven round trips (BEGIN,
the job's id, the run, its containers, NOTIFY, COMMIT). This pure-ASGI middleware stores a new run
with one statement on the lean asyncpg pool (``service/pgpool.py``), in its implicit transaction:
the job found or created, the run inserted ``ON CONFLICT DO NOTHING`` (rule I4), its containers from
arrays (``unnest``). One statement is atomic: a fault or a timeout stores all of it or nothing. Once it
has committed, the worker's ``changes.Notifier`` announces the job to the other workers and replicas,
in one notification for all the jobs committed meanwhile (a ``pg_notify`` in the statement itself put
every POST's commit behind one lock, issue 38). The POST answers without waiting for that
notification: the wait was one more round trip, often two (the batch in flight, then its own), and
the POST's slowest answers (docs/performance.md, "The announcement's wait, removed").

It only answers what it is sure of, and hands everything else, body and all, to the route, which
answers as it always does (through the shared problem+json handlers):

- a body the worker process should reduce (``bodies.MIN_BYTES`` and over), or one that does not
  parse or validate (422), a caller without a valid ingest token or not allowed the org (401/403),
  timestamps outside the allowed window (422);
- a run already stored: the route reads it back and answers 200 (same content) or 409 (rule I4);
- a run with growth events (issue 40): the route stores them in ``run_growths`` with the run (rare:
  only runs the growth guard acted on carry any), so the statement stays as it is for every other run.

What it answers itself: 201 with the stored run (the route's body), or 503 with ``Retry-After``
when the database fails or does not commit within the ingest timeout (nothing half-written). After
the commit it does what the route's after-commit hooks do: this worker's cached answer invalidated,
the job noted for retention and for its summary, the ingest metrics.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth import TokenStore, principal_from
from service.db import DB_FAULTS
from service.errors import PROBLEM_JSON, ServiceError, Unavailable, problem_response
from service.keys import ScopeKey
from service.observability.metrics import DATABASE_ERRORS, OOM_SUSPECT_RUNS, RUNS_CREATED
from service.observability.middleware import RouteLabel
from service.pgpool import Pool, PoolClosed
from service.runs import bodies
from service.runs import service as runs_service
from service.runs.schemas import RunCreate
from service.sizing import priors
from service.sizing import state as job_state
from service.wire import STAT_NAMES, utcnow

PATH = "/api/v1/runs"
log = logging.getLogger("ci_sizer.runs")
_FAULTS: tuple[type[Exception], ...] = (*DB_FAULTS, PoolClosed)

# $1-$4 the job's key, $5 now (created_at, ingested_at), $6-$12 the run, $13-$26 its containers as
# arrays, $27 the run's peak for the first-run prior (-1: none,
# the run is no sample). A job created here by a concurrent request after this statement's snapshot
# gives no job id (the insert does nothing on the unique key): the caller runs the statement again,
# which sees it.
STATEMENT = f"""
WITH found AS (
    SELECT id FROM jobs WHERE org = $1::varchar AND repo = $2::varchar AND workflow = $3::varchar AND job = $4::varchar
),
created_job AS (
    INSERT INTO jobs (org, repo, workflow, job, created_at)
    SELECT $1::varchar, $2::varchar, $3::varchar, $4::varchar, $5::timestamp WHERE NOT EXISTS (SELECT 1 FROM found)
    ON CONFLICT DO NOTHING
    RETURNING id
),
job AS (SELECT id FROM found UNION ALL SELECT id FROM created_job),
run AS (
    INSERT INTO runs (job_id, run_id, started_at, finished_at, ingested_at, node_memory_bytes,
        pod_memory_peak_bytes, clean, content_hash)
    SELECT id, $6::varchar, $7::timestamp, $8::timestamp, $5::timestamp, $9::bigint, $10::bigint, $11::boolean,
        $12::varchar
    FROM job
    ON CONFLICT (job_id, run_id) DO NOTHING
    RETURNING id
),
stored AS (
    INSERT INTO run_containers (run_pk, position, name, cpu_peak, cpu_p99, cpu_p95, cpu_p75, cpu_p50, cpu_avg,
        memory_peak_bytes, memory_limit_bytes, cpu_request_millicores, oom_killed, oom_kill_events, oom_suspect)
    SELECT run.id, c.* FROM run,
        unnest($13::integer[], $14::varchar[], $15::float8[], $16::float8[], $17::float8[], $18::float8[],
            $19::float8[], $20::float8[], $21::bigint[], $22::bigint[], $23::float8[], $24::boolean[],
            $25::bigint[], $26::boolean[]) AS c
    RETURNING 1
),
state AS (
    -- the job's build-path state (sizing/state.py): the run counted in; a job created here gets its
    -- row with this run, a job that had none an invalid row (rebuilt from its runs later)
    INSERT INTO job_state AS s ({job_state.COLUMNS})
    SELECT job.id, 1, CASE WHEN EXISTS (SELECT 1 FROM created_job) THEN 1 END,
        CASE WHEN EXISTS (SELECT 1 FROM created_job) THEN CASE WHEN $11::boolean THEN 1 ELSE 0 END END,
        CASE WHEN EXISTS (SELECT 1 FROM created_job) THEN CASE WHEN $27::bigint >= 0 THEN 1 ELSE 0 END END,
        $9::bigint, CASE WHEN $9::bigint IS NOT NULL THEN $8::timestamp END,
        CASE WHEN $9::bigint IS NOT NULL THEN run.id END
    FROM job, run
    {job_state.upsert_sql(clean="$11::boolean", sample="$27::bigint >= 0", node_memory="$9::bigint", finished_at="$8::timestamp")}
    RETURNING s.samples
),
first_sample AS (
    -- rule E6: the run is its job's first stored sample (E1); counted by the job's state, or (an
    -- invalid state) no other stored run is one
    SELECT CASE WHEN (SELECT samples FROM state) IS NOT NULL THEN (SELECT samples FROM state) = 1
        ELSE NOT EXISTS (
            SELECT 1 FROM runs AS r
            WHERE r.job_id = (SELECT id FROM job) AND r.id <> (SELECT id FROM run) AND {job_state.SAMPLE_SQL})
        END AS first
),
prior AS (
    -- rule E6 (sizing/priors.py): the org's first-run prior, for a stored run that was not killed ($27 >= 0,
    -- its highest container peak): one more sampled job for the job's first sample, the higher peak.
    -- Written only when one of them changes (most runs change neither), after the job's state (the
    -- lock order of the route's ingest)
    INSERT INTO fleet_priors (org, sampled_jobs, peak_bytes, updated_at)
    SELECT $1::varchar, 1, $27::bigint, $5::timestamp FROM (SELECT 1 FROM state LIMIT 1) AS after_state
    WHERE $27::bigint >= 0 AND ((SELECT first FROM first_sample) OR NOT EXISTS (
        SELECT 1 FROM fleet_priors p WHERE p.org = $1::varchar AND p.peak_bytes >= $27::bigint))
    ON CONFLICT (org) DO UPDATE SET
        sampled_jobs = fleet_priors.sampled_jobs + CASE WHEN (SELECT first FROM first_sample) THEN 1 ELSE 0 END,
        peak_bytes = greatest(fleet_priors.peak_bytes, EXCLUDED.peak_bytes),
        updated_at = EXCLUDED.updated_at
    RETURNING 1
)
SELECT (SELECT id FROM job) AS job_id, (SELECT id FROM run) AS run_pk,
    (SELECT count(*) FROM prior) AS prior
"""
_COLUMNS = (
    "position",
    "name",
    *(f"cpu_{k}" for k in STAT_NAMES),
    "memory_peak_bytes",
    "memory_limit_bytes",
    "cpu_request_millicores",
    "oom_killed",
)


def arguments(prepared: runs_service.PreparedRun, *, now: Any) -> list[Any]:
    """The statement's arguments for one prepared run."""
    body = prepared.body
    rows = prepared.containers
    return [
        body.org,
        body.repo,
        body.workflow,
        body.job,
        now,
        body.run_id,
        body.started_at,
        body.finished_at,
        body.node_memory_bytes,
        body.pod_memory_peak_bytes,
        prepared.clean,
        prepared.content_hash,
        *([r[c] for r in rows] for c in _COLUMNS),
        [r["oom_kill_events"] for r in rows],
        [r["oom_suspect"] for r in rows],
        priors.sample_peak(prepared.clean, [SimpleNamespace(**r) for r in rows]),
    ]


class FastRuns:
    def __init__(self, app: ASGIApp, *, tokens: TokenStore, state: Any) -> None:
        self.app = app
        self.tokens = tokens
        self.state = state  #: the app's state: its ``pgpool`` (PostgreSQL only), settings, caches
        self.route = RouteLabel(PATH)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pool: Pool | None = getattr(self.state, "pgpool", None)
        if (
            pool is None
            or scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != PATH
            or scope.get("root_path")
            or scope.get("query_string")
        ):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        prepared = self._accept(scope, body)
        if prepared is not None:
            scope["route"] = self.route
            answered = await self._store(pool, scope, send, prepared)
            if answered:
                return
        await self.app(scope, _replay(body, receive), send)

    def _accept(self, scope: Scope, body: bytes) -> runs_service.PreparedRun | None:
        """The run, prepared for storing, if this path may store it; None hands it to the route."""
        if not body or len(body) >= bodies.MIN_BYTES:
            return None
        header = ""
        content_type = b""
        for name, value in scope["headers"]:
            if name == b"authorization" and not header:
                header = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value
        if not content_type.startswith(b"application/json"):
            return None
        try:
            principal = principal_from(self.tokens, header)
            if "ingest" not in principal.roles:
                return None
            run = RunCreate.model_validate(orjson.loads(body))
        except (ServiceError, ValidationError, orjson.JSONDecodeError):
            return None
        if not principal.may_access_org(run.org):
            return None
        if any(c.growths for c in run.containers):  # growth events (issue 40) are stored by the route
            return None
        if runs_service.time_errors(run, now=utcnow(), **_window(self.state.settings)):
            return None
        return runs_service.prepare(run)

    async def _store(self, pool: Pool, scope: Scope, send: Send, prepared: runs_service.PreparedRun) -> bool:
        """Store the run; True when answered (201 or 503), False when it was already stored (the
        route answers 200 or 409)."""
        state = self.state
        settings = state.settings
        args = arguments(prepared, now=utcnow())
        marks: list[float] | None = [time.perf_counter()] if settings.slow_post_log_ms else None
        try:
            # the deadline inline (see sizing/fastpath.py): a cancelled statement's connection is
            # terminated, so the server rolls back whatever did not commit
            async with asyncio.timeout(settings.write_timeout):
                row = await (_execute(pool, args) if marks is None else _execute_timed(pool, args, marks))
        except TimeoutError:
            await _send(
                send,
                _unavailable(f"the database did not commit the run within {settings.write_timeout:g}s; retry"),
            )
            return True
        except _FAULTS as exc:
            DATABASE_ERRORS.inc()
            log.warning("database error on %s: %s", PATH, type(exc).__name__)
            await _send(send, _unavailable("the database is unavailable; retry later"))
            return True
        if row is None:
            return False
        job_id, _run_pk = row
        body = prepared.body
        key = ScopeKey(body.org, body.repo, body.workflow, body.job)
        # after the commit (the statement's own): this worker reads its own writes; the others are told
        # in the Notifier's next batch, which the answer does not wait for
        state.answers.invalidate(key)
        state.notifier.note(key)
        if marks is not None:
            marks.append(time.perf_counter())
        state.pruner.note(job_id, key)
        state.summaries.note(job_id, key)
        RUNS_CREATED.inc()
        if not prepared.clean:
            OOM_SUSPECT_RUNS.inc()
        values = {"run_id": body.run_id, "finished_at": body.finished_at, "clean": prepared.clean}
        content = orjson.dumps(
            runs_service.run_document(body, _Row(values), [_Row(c) for c in prepared.containers], "created")
        )
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-length", str(len(content)).encode()), (b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": content})
        if marks is not None:
            _log_phases(settings.slow_post_log_ms, marks)
        return True


class _Row:
    """A mapping's items as attributes (what ``run_document`` reads)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


async def _execute(pool: Pool, args: list[Any]) -> tuple[int, int] | None:
    """(job id, run pk) of a stored run; None when the run was already stored."""
    async with pool.acquire() as conn:
        for _ in range(3):
            row = await conn.fetchrow(STATEMENT, *args)
            if row["job_id"] is not None:
                return None if row["run_pk"] is None else (row["job_id"], row["run_pk"])
            # the job was created concurrently, after this statement's snapshot: again, which sees it
    return None


async def _execute_timed(pool: Pool, args: list[Any], marks: list[float]) -> tuple[int, int] | None:
    """``_execute`` with its phases marked (``CI_SIZER_SLOW_POST_LOG_MS``, a debug aid): the pool's
    checkout, the statement, the commit (then ``_store`` marks the answer).
    The statement runs in an explicit transaction here (BEGIN, the statement, COMMIT: two more round
    trips) so that the commit's own wait shows apart."""
    async with pool.acquire() as conn:
        marks.append(time.perf_counter())  # checked out
        async with conn.transaction():
            found: tuple[int, int] | None = None
            for _ in range(3):
                row = await conn.fetchrow(STATEMENT, *args)
                if row["job_id"] is not None:
                    found = None if row["run_pk"] is None else (row["job_id"], row["run_pk"])
                    break
            marks.append(time.perf_counter())  # BEGIN and the statement done
        marks.append(time.perf_counter())  # committed
    return found


def _log_phases(threshold_ms: float, marks: list[float]) -> None:
    """One line for a POST whose phases took ``threshold_ms`` or more in all."""
    marks.append(time.perf_counter())  # answered
    if len(marks) < 6 or (marks[-1] - marks[0]) * 1000 < threshold_ms:
        return
    checkout, statement, commit, release, answer = ((b - a) * 1000 for a, b in itertools.pairwise(marks))
    log.warning(
        "slow POST of a run: %.1f ms (pool checkout %.1f, statement %.1f, commit %.1f, release %.1f, answer %.1f)",
        (marks[-1] - marks[0]) * 1000,
        checkout,
        statement,
        commit,
        release,
        answer,
    )


def _window(settings: Any) -> dict[str, Any]:
    return {
        "max_ahead": timedelta(seconds=settings.finished_at_max_ahead_seconds),
        "max_age": timedelta(days=settings.finished_at_max_age_days),
    }


def _unavailable(detail: str) -> Response:
    return problem_response(503, detail=detail, type_=Unavailable.type_, instance=PATH, headers={"Retry-After": "2"})


async def _send(send: Send, response: Response) -> None:
    assert response.media_type == PROBLEM_JSON
    await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
