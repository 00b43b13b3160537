"""The jobs list (``GET /api/v1/jobs``) and the per-job summaries it reads.

Sorting 10,000 jobs by the capacity their answers would save must not compute 10,000 answers per
request. Each job therefore has a stored summary (``job_summaries``): its answer's pod totals, as
computed by the sizing service (``sizing.recommend``, the default parameters, the app's policy:
the very answer ``GET /api/v1/sizing`` gives), what its newest run ran with, its runs and OOM
kills in the window, and the saving per day. A summary is recomputed off the request path by
``SummaryRefresher``:

- at once (within a few seconds) for a job that got a run, and for every job an override's scope
  covers after an override is written in this process;
- otherwise when it is missing (jobs seen before the table existed), when an override it applied
  expires, or when it is older than ``STALE_AFTER`` (the window moves on; writes made in another
  process), a bounded batch per pass.

A request then reads one page of summary rows (one indexed query) and one aggregate for the totals.
"""

from __future__ import annotations

import base64
import logging
import math
import time
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import orjson
from sqlalchemy import (
    ColumnElement,
    and_,
    bindparam,
    case,
    exists,
    false,
    func,
    literal,
    or_,
    select,
    true,
    tuple_,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.auth import Principal
from service.errors import InvalidInput
from service.keys import ScopeKey
from service.observability.metrics import DATABASE_ERRORS
from service.sizing import service as sizing_service
from service.sizing.answer import Answer
from service.sizing.params import DEFAULT
from service.tables import Job, JobSummary, Run, RunContainer
from service.wire import to_rfc3339, utcnow

log = logging.getLogger("ci_sizer.jobs")

WINDOW_DAYS = 7
#: a summary older than this is recomputed in the background (the window moves on)
STALE_AFTER = timedelta(hours=1)
#: summaries recomputed per background pass beyond the noted jobs
SWEEP_BATCH = 200
GIB = 1 << 30

Sort = Literal["waste_memory", "waste_cpu", "oom", "last_run", "name"]
SORTS: tuple[Sort, ...] = ("waste_memory", "waste_cpu", "oom", "last_run", "name")
Phase = Literal["unknown", "learning", "confident"]

_jobs = Job.__table__  # type: ignore[attr-defined]
_summaries = JobSummary.__table__  # type: ignore[attr-defined]
_runs = Run.__table__  # type: ignore[attr-defined]
_containers = RunContainer.__table__  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- computing a summary


@dataclass
class RunStats:
    last_run_at: datetime | None = None
    window_runs: int = 0
    window_oom_kills: int = 0
    run_hours_per_day: float | None = None
    in_force_cpu_request_millicores: float | None = None
    in_force_memory_limit_bytes: int | None = None


_oom_killed = exists().where(
    _containers.c.run_pk == _runs.c.id,
    or_(_containers.c.oom_killed == true(), _containers.c.oom_kill_events > 0),
)
_WINDOW_RUNS = select(_runs.c.started_at, _runs.c.finished_at, _oom_killed.label("oom_killed")).where(
    _runs.c.job_id == bindparam("job_id"), _runs.c.finished_at >= bindparam("since")
)
_newest = (
    select(_runs.c.id)
    .where(_runs.c.job_id == bindparam("job_id"))
    .order_by(_runs.c.finished_at.desc(), _runs.c.id.desc())
    .limit(1)
    .scalar_subquery()
)
_NEWEST_RUN = (
    select(_runs.c.finished_at, _containers.c.memory_limit_bytes, _containers.c.cpu_request_millicores)
    .join_from(_runs, _containers, _containers.c.run_pk == _runs.c.id)
    .where(_runs.c.id == _newest)
)


async def run_stats(*, conn: AsyncConnection, job_id: int, now: datetime) -> RunStats:
    """The newest run's time and what it ran with; runs, OOM kills and run-hours in the window.

    In force: the sum over the newest run's containers of the memory limit and of the CPU request
    they reported, when every container reported it. Run-hours per day: the window's runs that
    report ``started_at`` give the mean duration, times the window's runs, over the window's days."""
    stats = RunStats()
    newest = list(await conn.execute(_NEWEST_RUN, {"job_id": job_id}))
    if newest:
        stats.last_run_at = newest[0].finished_at
        mems = [r.memory_limit_bytes for r in newest]
        cpus = [r.cpu_request_millicores for r in newest]
        if all(m is not None for m in mems):
            stats.in_force_memory_limit_bytes = sum(m for m in mems if m is not None)
        if all(c is not None for c in cpus):
            stats.in_force_cpu_request_millicores = sum(c for c in cpus if c is not None)
    durations: list[float] = []
    for r in await conn.execute(_WINDOW_RUNS, {"job_id": job_id, "since": now - timedelta(days=WINDOW_DAYS)}):
        stats.window_runs += 1
        stats.window_oom_kills += bool(r.oom_killed)
        if r.started_at is not None:
            durations.append((r.finished_at - r.started_at).total_seconds())
    if durations:
        mean_hours = sum(durations) / len(durations) / 3600
        stats.run_hours_per_day = mean_hours * stats.window_runs / WINDOW_DAYS
    return stats


def summary_row(*, job_id: int, answer: Answer, fresh_until: float, stats: RunStats, now: datetime) -> dict[str, Any]:
    """The stored summary of one job from its answer and its run statistics."""
    cs = answer.containers
    answer_cpu = sum(c.cpu.request_millicores for c in cs)
    answer_memory = sum(c.memory.limit_bytes for c in cs)
    saved_memory = saved_cpu = None
    if stats.run_hours_per_day is not None:
        if stats.in_force_memory_limit_bytes is not None:
            saved_memory = (stats.in_force_memory_limit_bytes - answer_memory) / GIB * stats.run_hours_per_day
        if stats.in_force_cpu_request_millicores is not None:
            saved_cpu = (stats.in_force_cpu_request_millicores - answer_cpu) / 1000 * stats.run_hours_per_day
    return {
        "job_id": job_id,
        "phase": answer.meta.phase,
        "override_scope": answer.meta.override_scope,
        "oom_backoff": any(c.oom.consecutive > 0 for c in cs),
        "last_run_at": stats.last_run_at,
        "window_runs": stats.window_runs,
        "window_oom_kills": stats.window_oom_kills,
        "run_hours_per_day": stats.run_hours_per_day,
        "answer_cpu_request_millicores": answer_cpu,
        "answer_memory_limit_bytes": answer_memory,
        "in_force_cpu_request_millicores": stats.in_force_cpu_request_millicores,
        "in_force_memory_limit_bytes": stats.in_force_memory_limit_bytes,
        "saved_memory_gib_hours_per_day": saved_memory,
        "saved_cpu_core_hours_per_day": saved_cpu,
        "refreshed_at": now,
        "fresh_until": None
        if math.isinf(fresh_until)
        else datetime.fromtimestamp(fresh_until, UTC).replace(tzinfo=None),
    }


def _upsert(dialect: str) -> Any:
    stmt = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(_summaries)
    columns = [c.name for c in _summaries.columns if c.name != "job_id"]
    return stmt.on_conflict_do_update(
        index_elements=["job_id"], set_={name: getattr(stmt.excluded, name) for name in columns}
    )


_UPSERT = {name: _upsert(name) for name in ("postgresql", "sqlite")}


async def refresh(
    *,
    engine: AsyncEngine,
    jobs: Iterable[tuple[int, ScopeKey]],
    policy: sizing_service.Policy,
    write_engine: AsyncEngine | None = None,
) -> int:
    """Recompute and store the summaries of ``jobs`` (id, key); returns how many were stored.
    Each answer comes from ``sizing.recommend`` with the default parameters. Read on ``engine``,
    written in one short transaction on ``write_engine`` (SQLite: the one that takes the write lock)."""
    rows = []
    params = DEFAULT
    async with engine.connect() as conn:
        for job_id, key in jobs:
            now = utcnow()
            rec = await sizing_service.recommend(conn=conn, key=key, params=params, policy=policy)
            stats = await run_stats(conn=conn, job_id=job_id, now=now)
            rows.append(
                summary_row(job_id=job_id, answer=rec.answer, fresh_until=rec.fresh_until, stats=stats, now=now)
            )
    if rows:
        async with (write_engine or engine).begin() as conn:
            await conn.execute(_UPSERT[conn.dialect.name], rows)
    return len(rows)


def _stale_query(limit: int) -> Any:
    s = _summaries
    return (
        select(_jobs.c.id, _jobs.c.org, _jobs.c.repo, _jobs.c.workflow, _jobs.c.job)
        .outerjoin(s, s.c.job_id == _jobs.c.id)
        .where(
            or_(
                s.c.job_id.is_(None),
                s.c.refreshed_at < bindparam("stale_before"),
                s.c.fresh_until <= bindparam("now"),
            )
        )
        .order_by(s.c.refreshed_at.is_not(None), s.c.refreshed_at, _jobs.c.id)
        .limit(limit)
    )


def _scope_query(key: ScopeKey) -> Any:
    stmt = select(_jobs.c.id, _jobs.c.org, _jobs.c.repo, _jobs.c.workflow, _jobs.c.job).where(_jobs.c.org == key.org)
    for column, value in ((_jobs.c.repo, key.repo), (_jobs.c.workflow, key.workflow), (_jobs.c.job, key.job)):
        if value:
            stmt = stmt.where(column == value)
    return stmt.order_by(_jobs.c.id)


def _key(row: Any) -> tuple[int, ScopeKey]:
    return row.id, ScopeKey(row.org, row.repo, row.workflow, row.job)


@dataclass
class SummaryRefresher:
    """Keeps ``job_summaries`` current, off the request path (one per app)."""

    batch: int = SWEEP_BATCH
    #: a job whose runs keep coming is refreshed at most this often (seconds; 0: on every pass). Under a
    #: steady stream of runs every job was recomputed every pass, a full answer per job every two
    #: seconds, which cost the build path on the same cores more than a third of its throughput
    #: (docs/performance.md); a job's first run after a quiet spell is still summarised on the next pass.
    min_interval: float = 0.0
    pending: dict[int, ScopeKey] = field(default_factory=dict)
    scopes: list[ScopeKey] = field(default_factory=list)
    _refreshed: dict[int, float] = field(default_factory=dict)  #: monotonic time of a noted job's last refresh

    def note(self, job_id: int, key: ScopeKey) -> None:
        """A run of this job was stored."""
        self.pending[job_id] = key

    def _due(self) -> dict[int, ScopeKey]:
        """The noted jobs to refresh now; those refreshed within ``min_interval`` stay pending."""
        if self.min_interval <= 0:
            due, self.pending = self.pending, {}
            return due
        now = time.monotonic()
        recent = {j: t for j, t in self._refreshed.items() if now - t < self.min_interval}
        due = {j: k for j, k in self.pending.items() if j not in recent}
        deferred = {j: k for j, k in self.pending.items() if j in recent}
        self._refreshed = {**recent, **dict.fromkeys(due, now)}
        self.pending = deferred
        return due

    def note_scope(self, key: ScopeKey) -> None:
        """An override at this scope was written: every job under it may answer differently."""
        self.scopes.append(key)

    async def run_once(
        self, engine: AsyncEngine, policy: sizing_service.Policy, write_engine: AsyncEngine | None = None
    ) -> int:
        jobs = self._due()
        scopes, self.scopes = self.scopes, []
        done = 0
        try:
            async with engine.connect() as conn:
                for scope in scopes:
                    jobs.update(_key(r) for r in await conn.execute(_scope_query(scope)))
                now = utcnow()
                stale = await conn.execute(_stale_query(self.batch), {"stale_before": now - STALE_AFTER, "now": now})
                for row in stale:
                    jobs.setdefault(*_key(row))
            items = sorted(jobs.items())
            for start in range(0, len(items), 100):
                done += await refresh(
                    engine=engine, jobs=items[start : start + 100], policy=policy, write_engine=write_engine
                )
        except Exception as exc:  # keep what was noted for the next pass
            DATABASE_ERRORS.inc()
            log.warning("job summaries not refreshed: %s", type(exc).__name__)
            for job_id, key in jobs.items():
                self.pending.setdefault(job_id, key)
        return done


# --------------------------------------------------------------------------- listing


@dataclass(frozen=True)
class JobFilter:
    org: str | None = None
    repo: str | None = None
    workflow: str | None = None
    job: str | None = None
    phase: Phase | None = None
    q: str | None = None  #: a substring of any of the four names, case-insensitive


#: sort -> (value expression, descending); NULLs sort as the sentinel, i.e. last
_FLOOR = -1e300
_OLDEST = datetime(1970, 1, 1)
_SORT_EXPR: dict[str, tuple[ColumnElement[Any], bool]] = {
    "waste_memory": (func.coalesce(_summaries.c.saved_memory_gib_hours_per_day, literal(_FLOOR)), True),
    "waste_cpu": (func.coalesce(_summaries.c.saved_cpu_core_hours_per_day, literal(_FLOOR)), True),
    "oom": (func.coalesce(_summaries.c.window_oom_kills, literal(-1)), True),
    "last_run": (func.coalesce(_summaries.c.last_run_at, literal(_OLDEST)), True),
}


def encode_cursor(sort: str, value: Any, job_id: int) -> str:
    raw = orjson.dumps([sort, value.isoformat() if isinstance(value, datetime) else value, job_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, sort: str) -> tuple[Any, int]:
    try:
        got = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        name, value, job_id = got
        if name != sort or not isinstance(job_id, int) or not 0 <= job_id < 2**63:
            raise ValueError
        if sort == "last_run":
            value = datetime.fromisoformat(value)
        elif sort == "name":
            if not (isinstance(value, list) and len(value) == 4 and all(isinstance(v, str) for v in value)):
                raise ValueError
        elif sort == "oom":
            if not isinstance(value, int) or isinstance(value, bool) or not -(2**31) <= value < 2**31:
                raise ValueError
        elif not isinstance(value, int | float) or isinstance(value, bool) or not abs(value) <= 1e300:
            raise ValueError
        return value, job_id
    except (ValueError, TypeError, orjson.JSONDecodeError, UnicodeDecodeError):
        raise InvalidInput(
            "the cursor is not valid",
            errors=[{"field": "query/cursor", "message": "not a cursor from this API for this sort"}],
        ) from None


def _like(text: str) -> str:
    return "%" + text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _where(flt: JobFilter, orgs: frozenset[str] | None) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    for column, value in (
        (_jobs.c.org, flt.org),
        (_jobs.c.repo, flt.repo),
        (_jobs.c.workflow, flt.workflow),
        (_jobs.c.job, flt.job),
    ):
        if value is not None:
            where.append(column == value)
    if flt.phase is not None:
        where.append(_summaries.c.phase == flt.phase)
    if flt.q:
        pattern = _like(flt.q)
        where.append(
            or_(
                *(
                    func.lower(c).like(pattern, escape="\\")
                    for c in (_jobs.c.org, _jobs.c.repo, _jobs.c.workflow, _jobs.c.job)
                )
            )
        )
    if orgs is not None:
        where.append(_jobs.c.org.in_(sorted(orgs)) if orgs else false())
    return where


def check_names(**values: str | None) -> None:
    """Names in a query string: no control characters (rule I3), so none reaches the database."""
    for name, value in values.items():
        if value is not None and any(unicodedata.category(ch) == "Cc" for ch in value):
            raise InvalidInput(
                f"query parameter {name!r} must not contain control characters",
                errors=[{"field": f"query/{name}", "message": "must not contain control characters"}],
            )


def job_filter(
    principal: Principal,
    *,
    org: str | None,
    repo: str | None,
    workflow: str | None,
    job: str | None,
    phase: Phase | None,
    q: str | None,
) -> JobFilter:
    """The filter a caller asked for; naming an org the token may not read is a 403."""
    check_names(org=org, repo=repo, workflow=workflow, job=job, q=q)
    if org is not None:
        principal.ensure_org(org)
    return JobFilter(org=org, repo=repo, workflow=workflow, job=job, phase=phase, q=q or None)


@dataclass(frozen=True)
class Page:
    rows: list[Any]
    next_cursor: str | None


async def list_jobs(
    *,
    conn: AsyncConnection,
    flt: JobFilter,
    sort: Sort,
    limit: int,
    cursor: str | None,
    orgs: frozenset[str] | None,
) -> Page:
    """One page of jobs with their summaries (keyset pagination on the sort value, then id)."""
    base = select(_jobs, *(c for c in _summaries.columns if c.name != "job_id")).outerjoin(
        _summaries, _summaries.c.job_id == _jobs.c.id
    )
    where = _where(flt, orgs)
    if sort == "name":
        value: ColumnElement[Any] = tuple_(_jobs.c.org, _jobs.c.repo, _jobs.c.workflow, _jobs.c.job, _jobs.c.id)
        order = [_jobs.c.org, _jobs.c.repo, _jobs.c.workflow, _jobs.c.job, _jobs.c.id]
        if cursor:
            names, after_id = decode_cursor(cursor, sort)
            where.append(value > tuple_(*(literal(n) for n in names), literal(after_id)))
    else:
        expr, _desc = _SORT_EXPR[sort]
        order = [expr.desc(), _jobs.c.id]
        if cursor:
            after, after_id = decode_cursor(cursor, sort)
            where.append(or_(expr < after, and_(expr == after, _jobs.c.id > after_id)))
    stmt = base.where(*where).order_by(*order).limit(limit + 1)
    rows = list(await conn.execute(stmt))
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more and rows:
        last = rows[-1]
        if sort == "name":
            next_cursor = encode_cursor(sort, [last.org, last.repo, last.workflow, last.job], last.id)
        else:
            next_cursor = encode_cursor(sort, _sort_value(sort, last), last.id)
    return Page(rows=rows, next_cursor=next_cursor)


async def read_page(
    *, engine: AsyncEngine, principal: Principal, flt: JobFilter, sort: Sort, limit: int, cursor: str | None
) -> tuple[Page, dict[str, Any]]:
    """One page and the totals, as the API and the operator's page both read them."""
    async with engine.connect() as conn:
        page = await list_jobs(conn=conn, flt=flt, sort=sort, limit=limit, cursor=cursor, orgs=principal.orgs)
        return page, await totals(conn=conn, flt=flt, orgs=principal.orgs)


def _sort_value(sort: str, row: Any) -> Any:
    if sort == "waste_memory":
        return _FLOOR if row.saved_memory_gib_hours_per_day is None else row.saved_memory_gib_hours_per_day
    if sort == "waste_cpu":
        return _FLOOR if row.saved_cpu_core_hours_per_day is None else row.saved_cpu_core_hours_per_day
    if sort == "oom":
        return -1 if row.window_oom_kills is None else row.window_oom_kills
    return _OLDEST if row.last_run_at is None else row.last_run_at


async def totals(*, conn: AsyncConnection, flt: JobFilter, orgs: frozenset[str] | None) -> dict[str, Any]:
    """Over every job the filter selects: how many, by phase and in OOM backoff, and the capacity
    saved per day if every answer were applied."""
    s = _summaries
    stmt = (
        select(
            func.count(),
            func.count(s.c.job_id),
            func.sum(case((s.c.phase == "unknown", 1), else_=0)),
            func.sum(case((s.c.phase == "learning", 1), else_=0)),
            func.sum(case((s.c.phase == "confident", 1), else_=0)),
            func.sum(case((s.c.oom_backoff == true(), 1), else_=0)),
            func.sum(s.c.saved_memory_gib_hours_per_day),
            func.sum(s.c.saved_cpu_core_hours_per_day),
            func.min(s.c.refreshed_at),
        )
        .select_from(_jobs)
        .outerjoin(s, s.c.job_id == _jobs.c.id)
        .where(*_where(flt, orgs))
    )
    row = (await conn.execute(stmt)).one()
    jobs, summarised, unknown, learning, confident, backoff, mem, cpu, oldest = row
    return {
        "jobs": jobs or 0,
        "summarised": summarised or 0,
        "unknown": unknown or 0,
        "learning": learning or 0,
        "confident": confident or 0,
        "oom_backoff": backoff or 0,
        "saved_memory_gib_hours_per_day": round(float(mem or 0.0), 3),
        "saved_cpu_core_hours_per_day": round(float(cpu or 0.0), 3),
        "oldest_summary_at": to_rfc3339(oldest),
    }


def public(row: Any) -> dict[str, Any]:
    """One row of the list in its wire shape (``models.JobPublic``)."""
    summarised = row.phase is not None

    def r(value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    return {
        "org": row.org,
        "repo": row.repo,
        "workflow": row.workflow,
        "job": row.job,
        "phase": row.phase,
        "override_scope": row.override_scope,
        "oom_backoff": row.oom_backoff,
        "last_run_at": to_rfc3339(row.last_run_at),
        "window_days": WINDOW_DAYS,
        "runs": row.window_runs,
        "oom_kills": row.window_oom_kills,
        "run_hours_per_day": r(row.run_hours_per_day),
        "in_force": {
            "cpu_request_millicores": row.in_force_cpu_request_millicores,
            "memory_limit_bytes": row.in_force_memory_limit_bytes,
        },
        "answer": None
        if not summarised
        else {
            "cpu_request_millicores": row.answer_cpu_request_millicores,
            "memory_limit_bytes": row.answer_memory_limit_bytes,
        },
        "saved_per_day": {
            "memory_gib_hours": r(row.saved_memory_gib_hours_per_day),
            "cpu_core_hours": r(row.saved_cpu_core_hours_per_day),
        },
        "summarised_at": to_rfc3339(row.refreshed_at),
    }


# --------------------------------------------------------------------------- one job's runs (the job view's plot)

_RECENT = (
    select(
        _runs.c.id,
        _runs.c.run_id,
        _runs.c.finished_at,
        _containers.c.name,
        _containers.c.memory_peak_bytes,
        _containers.c.memory_limit_bytes,
        _containers.c.oom_killed,
        _containers.c.oom_kill_events,
        _containers.c.oom_suspect,
        _containers.c.cpu_peak,
    )
    .join_from(_runs, _containers, _containers.c.run_pk == _runs.c.id)
    .where(
        _runs.c.id.in_(
            select(_runs.c.id)
            .where(_runs.c.job_id == bindparam("job_id"))
            .order_by(_runs.c.finished_at.desc(), _runs.c.id.desc())
            .limit(bindparam("limit"))
            .scalar_subquery()
        )
    )
    .order_by(_runs.c.finished_at, _runs.c.id, _containers.c.position)
)


async def recent_runs(*, conn: AsyncConnection, job_id: int, limit: int = 60) -> list[Any]:
    """The job's newest ``limit`` runs, oldest first, one row per container."""
    return list(await conn.execute(_RECENT, {"job_id": job_id, "limit": limit}))


async def job_id_of(*, conn: AsyncConnection, key: ScopeKey) -> int | None:
    stmt = select(_jobs.c.id).where(
        _jobs.c.org == key.org, _jobs.c.repo == key.repo, _jobs.c.workflow == key.workflow, _jobs.c.job == key.job
    )
    found: int | None = (await conn.execute(stmt)).scalar_one_or_none()
    return found


def keys_of(rows: Sequence[Any]) -> list[ScopeKey]:
    return [ScopeKey(r.org, r.repo, r.workflow, r.job) for r in rows]
