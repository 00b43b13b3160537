"""Trends over the stored runs, per day: of the fleet, an org, a repo or one job (issue 34).

Each day of the last ``days`` (UTC) counts the runs that finished that day and those with a container
OOM-killed, and, over the runs that report ``started_at`` and what they ran with: the memory they
reserved (their memory limits x duration, GiB-hours), the memory they used (their peaks x duration),
and what they reserved above the job's answer today (``could save``: (ran with - answer) x duration,
memory and CPU request, and in money at the operator's prices). A job the jobs list counts no saving
for (``risk``: kept below what it uses by a pin; or what it ran with is not reported) counts none
here either. Retention keeps the newest ``--retention-runs`` runs per job, so a busy job's older days
are incomplete.

``growths`` counts the kills avoided (issue 40), as the job page's figure does (``growths/service.py``):
runs that grew in place (a ``grown`` event), went past the limit they started with (a container's peak
above its first event's ``from_bytes``), and had no container killed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import Float, and_, case, cast, exists, func, literal, or_, select, true
from sqlalchemy.ext.asyncio import AsyncConnection

from service.jobs.money import Prices
from service.jobs.service import JobFilter, job_where
from service.tables import Job, JobSummary, Run, RunContainer, RunGrowth
from service.wire import utcnow

TREND_DAYS = 30
GIB = float(1 << 30)

#: the series a trend has, in the order shown: (key, label)
SERIES = (
    ("runs", "runs"),
    ("oom_kills", "runs OOM-killed"),
    ("growths", "kills avoided (grown in place)"),
    ("reserved_gib_hours", "memory reserved (GiB-h)"),
    ("used_gib_hours", "memory used (GiB-h)"),
    ("could_save_gib_hours", "could save: memory (GiB-h)"),
    ("could_save_core_hours", "could save: CPU (core-h)"),
    ("could_save_money", "could save (money)"),
)

_jobs = Job.__table__  # type: ignore[attr-defined]
_summaries = JobSummary.__table__  # type: ignore[attr-defined]
_runs = Run.__table__  # type: ignore[attr-defined]
_containers = RunContainer.__table__  # type: ignore[attr-defined]
_growths = RunGrowth.__table__  # type: ignore[attr-defined]


@dataclass
class Day:
    day: date
    runs: int = 0
    oom_kills: int = 0
    reserved_gib_hours: float = 0.0
    used_gib_hours: float = 0.0
    could_save_gib_hours: float = 0.0
    could_save_core_hours: float = 0.0
    could_save_money: float = 0.0
    #: kills avoided: runs grown in place past the limit they started with, and not killed (issue 40)
    growths: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "day": self.day.isoformat(),
            **{key: getattr(self, key) for key, _ in SERIES},
        }


def _hours(dialect: str, finished: Any, started: Any) -> Any:
    """A run's duration in hours, in SQL (NULL without ``started_at``)."""
    if dialect == "postgresql":
        return func.extract("epoch", finished - started) / 3600.0
    return (func.julianday(finished) - func.julianday(started)) * 24.0


def _day(value: Any) -> date:
    return value if isinstance(value, date) and not isinstance(value, datetime) else date.fromisoformat(str(value))


async def trend(
    *,
    conn: AsyncConnection,
    flt: JobFilter,
    orgs: frozenset[str] | None,
    prices: Prices,
    days: int = TREND_DAYS,
    now: datetime | None = None,
) -> list[Day]:
    """One ``Day`` per day of the last ``days``, oldest first (days without runs included)."""
    today = (now or utcnow()).date()
    since = datetime.combine(today - timedelta(days=days - 1), datetime.min.time())
    c, g = _containers.c, _growths.c
    killed = or_(c.oom_killed == true(), c.oom_kill_events > 0)
    grown = exists().where(g.run_pk == c.run_pk, g.position == c.position, g.result == "grown")
    past_first_limit = exists().where(
        g.run_pk == c.run_pk, g.position == c.position, g.seq == 0, c.memory_peak_bytes > g.from_bytes
    )
    per_run = (
        select(
            _runs.c.job_id,
            _runs.c.finished_at,
            _hours(conn.dialect.name, _runs.c.finished_at, _runs.c.started_at).label("hours"),
            func.max(case((killed, 1), else_=0)).label("killed"),
            func.max(case((grown, 1), else_=0)).label("grew"),
            func.max(case((past_first_limit, 1), else_=0)).label("past_first_limit"),
            func.count().label("containers"),
            func.count(c.memory_limit_bytes).label("limits"),
            func.count(c.cpu_request_millicores).label("requests"),
            func.sum(c.memory_limit_bytes).label("memory_limit"),
            func.sum(c.memory_peak_bytes).label("memory_peak"),
            func.sum(c.cpu_request_millicores).label("cpu_request"),
        )
        .join_from(_runs, _containers, c.run_pk == _runs.c.id)
        .join(_jobs, _jobs.c.id == _runs.c.job_id)
        .outerjoin(_summaries, _summaries.c.job_id == _runs.c.job_id)
        .where(_runs.c.finished_at >= since, *job_where(flt, orgs))
        .group_by(_runs.c.id, _runs.c.job_id, _runs.c.finished_at, _runs.c.started_at)
        .subquery()
    )
    r, s = per_run.c, _summaries.c
    hours = cast(r.hours, Float)
    full_memory = and_(r.limits == r.containers, r.hours.is_not(None))
    full_cpu = and_(r.requests == r.containers, r.hours.is_not(None))
    mem_known = and_(full_memory, s.saved_memory_gib_hours_per_day.is_not(None))
    cpu_known = and_(full_cpu, s.saved_cpu_core_hours_per_day.is_not(None))
    mem_saving = case((mem_known, (r.memory_limit - s.answer_memory_limit_bytes) / GIB * hours), else_=literal(0.0))
    cpu_saving = case(
        (cpu_known, (r.cpu_request - s.answer_cpu_request_millicores) / 1000.0 * hours), else_=literal(0.0)
    )
    day = func.date(r.finished_at).label("day")
    stmt = (
        select(
            day,
            func.count(),
            func.sum(r.killed),
            func.sum(case((and_(r.grew == 1, r.past_first_limit == 1, r.killed == 0), 1), else_=0)),
            func.sum(case((full_memory, r.memory_limit / GIB * hours), else_=0.0)),
            func.sum(case((r.hours.is_not(None), r.memory_peak / GIB * hours), else_=0.0)),
            func.sum(mem_saving),
            func.sum(cpu_saving),
        )
        .select_from(per_run.outerjoin(_summaries, _summaries.c.job_id == r.job_id))
        .group_by(day)
    )
    out = {today - timedelta(days=k): Day(today - timedelta(days=k)) for k in range(days)}
    for when, runs, kills, avoided, reserved, used, mem, cpu in await conn.execute(stmt):
        d = out.get(_day(when))
        if d is None:
            continue
        d.runs, d.oom_kills, d.growths = int(runs), int(kills or 0), int(avoided or 0)
        d.reserved_gib_hours = round(float(reserved or 0.0), 3)
        d.used_gib_hours = round(float(used or 0.0), 3)
        d.could_save_gib_hours = round(float(mem or 0.0), 3)
        d.could_save_core_hours = round(float(cpu or 0.0), 3)
        d.could_save_money = round(prices.per_day(d.could_save_gib_hours, d.could_save_core_hours) or 0.0, 4)
    return [out[k] for k in sorted(out)]
