"""The per-job summaries the jobs list reads (``job_summaries``), and what keeps them current.

Sorting 10,000 jobs by the capacity their answers would save must not compute 10,000 answers per
request. Each job therefore has a stored summary: its answer's pod totals, as computed by the
sizing service (``sizing.recommend``, the default parameters, the app's policy: the very answer
``GET /api/v1/sizing`` gives), what its newest run ran with, its runs and OOM kills in the window,
and the saving per day. A summary is recomputed off the request path by ``SummaryRefresher``:

- at once (within a few seconds) for a job that got a run, and for every job an override's scope
  covers after an override is written in this process;
- otherwise when it is missing (jobs seen before the table existed), when an override it applied
  expires, or when it is older than ``STALE_AFTER`` (the window moves on; writes made in another
  process), a bounded batch per pass.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, exists, or_, select, true
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.jobs import risk
from service.jobs.service import WINDOW_DAYS
from service.keys import ScopeKey
from service.observability.metrics import DATABASE_ERRORS
from service.sizing import service as sizing_service
from service.sizing.answer import Answer
from service.sizing.params import DEFAULT
from service.tables import Job, JobSummary, Run, RunContainer
from service.wire import utcnow

log = logging.getLogger("ci_sizer.jobs")

#: a summary older than this is recomputed in the background (the window moves on)
STALE_AFTER = timedelta(hours=1)
#: summaries recomputed per background pass beyond the noted jobs
SWEEP_BATCH = 200
GIB = 1 << 30

_jobs = Job.__table__  # type: ignore[attr-defined]
_summaries = JobSummary.__table__  # type: ignore[attr-defined]
_runs = Run.__table__  # type: ignore[attr-defined]
_containers = RunContainer.__table__  # type: ignore[attr-defined]


@dataclass
class RunStats:
    last_run_at: datetime | None = None
    window_runs: int = 0
    window_oom_kills: int = 0
    run_hours_per_day: float | None = None
    in_force_cpu_request_millicores: float | None = None
    in_force_memory_limit_bytes: int | None = None
    #: per container of the newest run: (memory limit, CPU request) it reported running with
    ran_with: dict[str, tuple[int | None, float | None]] = field(default_factory=dict)
    #: per container: what it used over the newest runs (``risk.usage``)
    used: dict[str, risk.Usage] = field(default_factory=dict)


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
    select(
        _runs.c.finished_at, _containers.c.name, _containers.c.memory_limit_bytes, _containers.c.cpu_request_millicores
    )
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
        stats.ran_with = {r.name: (r.memory_limit_bytes, r.cpu_request_millicores) for r in newest}
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
    stats.used = (await risk.usage(conn=conn, job_ids=[job_id])).get(job_id, {})
    return stats


def summary_row(*, job_id: int, answer: Answer, fresh_until: float, stats: RunStats, now: datetime) -> dict[str, Any]:
    """The stored summary of one job from its answer and its run statistics."""
    cs = answer.containers
    answer_cpu = sum(c.cpu.request_millicores for c in cs)
    answer_memory = sum(c.memory.limit_bytes for c in cs)
    assessed = risk.assess(answer, stats.used, stats.ran_with)
    # a job kept below what it uses by a pin saves nothing: it is killed or throttled instead
    below_peak = any(c.below_peak for c in assessed)
    throttled_by_pin = any(c.throttled and c.cpu_limit_source != "algorithm" for c in assessed)
    saved_memory = saved_cpu = None
    if stats.run_hours_per_day is not None:
        if stats.in_force_memory_limit_bytes is not None and not below_peak:
            saved_memory = (stats.in_force_memory_limit_bytes - answer_memory) / GIB * stats.run_hours_per_day
        if stats.in_force_cpu_request_millicores is not None and not throttled_by_pin:
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
        "risk": risk.flags_of(assessed),
        "containers": risk.dump(assessed),
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
    stmt = select(_jobs.c.id, _jobs.c.org, _jobs.c.repo, _jobs.c.workflow, _jobs.c.job)
    return stmt.where(*risk.scope_where(key)).order_by(_jobs.c.id)


def _key(row: Any) -> tuple[int, ScopeKey]:
    return row.id, ScopeKey(row.org, row.repo, row.workflow, row.job)


@dataclass
class SummaryRefresher:
    """Keeps ``job_summaries`` current, off the request path (one per app)."""

    batch: int = SWEEP_BATCH
    #: a job whose runs keep coming is refreshed at most this often (seconds; 0: on every pass). Under a
    #: steady stream of runs every job was recomputed every pass, a full answer per job every two
    #: seconds, which cost the build path on the same cores a third of its throughput
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
