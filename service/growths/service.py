"""A job's growth events (issue 40), as stored with its runs (``run_growths``, ``runs/service.ingest``):
what the growth guard did in the window, and its newest events. Read on a bare connection."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, exists, func, or_, select, true
from sqlalchemy.ext.asyncio import AsyncConnection

from service.jobs.service import WINDOW_DAYS
from service.runs.schemas import GROWTH_RESULTS
from service.tables import Run, RunContainer, RunGrowth
from service.wire import to_rfc3339

_runs = Run.__table__  # type: ignore[attr-defined]
_containers = RunContainer.__table__  # type: ignore[attr-defined]
_growths = RunGrowth.__table__  # type: ignore[attr-defined]


def _event(result: str) -> Any:
    return exists().where(_growths.c.run_pk == _runs.c.id, _growths.c.result == result)


#: a container the kernel killed (rule S1's kill signals; a too_late event is stored as one, G7)
_KILLED = exists().where(
    _containers.c.run_pk == _runs.c.id,
    or_(_containers.c.oom_killed == true(), _containers.c.oom_kill_events > 0),
)
#: a container whose peak went past the limit it started with (its first event's from_bytes): without
#: growth the kernel would have killed it
_PAST_FIRST_LIMIT = exists().where(
    _containers.c.run_pk == _runs.c.id,
    _growths.c.run_pk == _containers.c.run_pk,
    _growths.c.position == _containers.c.position,
    _growths.c.seq == 0,
    _containers.c.memory_peak_bytes > _growths.c.from_bytes,
)
_WINDOW = and_(_runs.c.job_id == bindparam("job_id"), _runs.c.finished_at >= bindparam("since"))
_PER_RUN = select(
    _event("grown").label("grew"),
    _KILLED.label("killed"),
    _event("too_late").label("too_late"),
    _PAST_FIRST_LIMIT.label("past_first_limit"),
).where(_WINDOW)
_BY_RESULT = (
    select(_growths.c.result, func.count())
    .join_from(_growths, _runs, _runs.c.id == _growths.c.run_pk)
    .where(_WINDOW)
    .group_by(_growths.c.result)
)
_RECENT = (
    select(
        _runs.c.run_id,
        _runs.c.finished_at,
        _containers.c.name,
        _growths.c.at,
        _growths.c.from_bytes,
        _growths.c.to_bytes,
        _growths.c.result,
    )
    .join_from(_growths, _runs, _runs.c.id == _growths.c.run_pk)
    .join(_containers, and_(_containers.c.run_pk == _growths.c.run_pk, _containers.c.position == _growths.c.position))
    .where(_runs.c.job_id == bindparam("job_id"))
    .order_by(_runs.c.finished_at.desc(), _runs.c.id.desc(), _growths.c.at.desc(), _growths.c.seq.desc())
    .limit(bindparam("limit"))
)


@dataclass
class JobGrowths:
    """What the growth guard did to one job's runs in the window (``window_days``)."""

    window_days: int = WINDOW_DAYS
    runs: int = 0
    runs_grown: int = 0
    #: runs that grew past the limit they started with and in which no container was killed
    kills_avoided: int = 0
    runs_too_late: int = 0
    events: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GROWTH_RESULTS, 0))
    recent: list[dict[str, Any]] = field(default_factory=list)

    @property
    def refused(self) -> int:
        """Resizes the cluster refused in the window (Deferred or Infeasible)."""
        return self.events["deferred"] + self.events["infeasible"]


async def of_job(*, conn: AsyncConnection, job_id: int | None, now: datetime, recent: int = 50) -> JobGrowths:
    """The job's growth figures over the last ``WINDOW_DAYS`` days and its newest ``recent`` events
    (a job never seen: all zero)."""
    out = JobGrowths()
    if job_id is None:
        return out
    window = {"job_id": job_id, "since": now - timedelta(days=WINDOW_DAYS)}
    for grew, killed, too_late, past_first_limit in await conn.execute(_PER_RUN, window):
        out.runs += 1
        out.runs_grown += bool(grew)
        out.kills_avoided += bool(grew) and not killed and bool(past_first_limit)
        out.runs_too_late += bool(too_late)
    for result, count in await conn.execute(_BY_RESULT, window):
        out.events[result] = int(count)
    out.recent = [
        {
            "run_id": r.run_id,
            "finished_at": to_rfc3339(r.finished_at) or "",
            "container": r.name,
            "at": to_rfc3339(r.at) or "",
            "from_bytes": r.from_bytes,
            "to_bytes": r.to_bytes,
            "result": r.result,
        }
        for r in await conn.execute(_RECENT, {"job_id": job_id, "limit": recent})
    ]
    return out
