"""The jobs list (``GET /api/v1/jobs``) and one job's recent runs (the job view).

A request reads one page of the stored per-job summaries (one indexed query, keyset pagination)
and one aggregate for the totals; ``jobs.summaries`` computes those summaries and keeps them current.
"""

from __future__ import annotations

import base64
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson
from sqlalchemy import ColumnElement, and_, bindparam, case, false, func, literal, or_, select, true, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.auth import Principal
from service.errors import InvalidInput
from service.jobs import risk
from service.jobs.money import Prices, money_block
from service.keys import ScopeKey
from service.tables import Job, JobSummary, Run, RunContainer
from service.wire import name_problem, to_rfc3339

#: the days a summary counts runs, OOM kills and run-hours over (``window_days`` on the wire)
WINDOW_DAYS = 7

Sort = Literal["waste_memory", "waste_cpu", "money", "risk", "oom", "last_run", "name"]
SORTS: tuple[Sort, ...] = ("waste_memory", "waste_cpu", "money", "risk", "oom", "last_run", "name")
Phase = Literal["unknown", "learning", "confident"]

_jobs = Job.__table__  # type: ignore[attr-defined]
_summaries = JobSummary.__table__  # type: ignore[attr-defined]
_runs = Run.__table__  # type: ignore[attr-defined]
_containers = RunContainer.__table__  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- listing


@dataclass(frozen=True)
class JobFilter:
    org: str | None = None
    repo: str | None = None
    workflow: str | None = None
    job: str | None = None
    phase: Phase | None = None
    q: str | None = None  #: a substring of any of the four names, case-insensitive


#: NULLs sort as these sentinels, i.e. last
_FLOOR = -1e300
_OLDEST = datetime(1970, 1, 1)


def money_expr(prices: Prices) -> ColumnElement[Any]:
    """A summary's saving per day in money; the sentinel when neither saving is known."""
    mem = _summaries.c.saved_memory_gib_hours_per_day * literal(prices.per_gib_hour)
    cpu = _summaries.c.saved_cpu_core_hours_per_day * literal(prices.per_core_hour)
    return func.coalesce(mem + cpu, mem, cpu, literal(_FLOOR))


def _sort_keys(sort: str, prices: Prices) -> list[ColumnElement[Any]]:
    """The values a sort orders by, each descending (then the job id, ascending)."""
    if sort == "waste_memory":
        return [func.coalesce(_summaries.c.saved_memory_gib_hours_per_day, literal(_FLOOR))]
    if sort == "waste_cpu":
        return [func.coalesce(_summaries.c.saved_cpu_core_hours_per_day, literal(_FLOOR))]
    if sort == "money":
        return [money_expr(prices)]
    if sort == "risk":
        return [func.coalesce(_summaries.c.risk, literal(-1)), money_expr(prices)]
    if sort == "oom":
        return [func.coalesce(_summaries.c.window_oom_kills, literal(-1))]
    return [func.coalesce(_summaries.c.last_run_at, literal(_OLDEST))]


def encode_cursor(sort: str, value: Any, job_id: int) -> str:
    raw = orjson.dumps([sort, value.isoformat() if isinstance(value, datetime) else value, job_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _number(value: Any, bound: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) <= bound


def decode_cursor(cursor: str, sort: str) -> tuple[Any, int]:
    try:
        got = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        name, value, job_id = got
        if name != sort or not isinstance(job_id, int) or not 0 <= job_id < 2**63:
            raise ValueError
        if sort == "last_run":
            value = datetime.fromisoformat(value)
            if value.tzinfo is not None:  # this API writes naive UTC; the database compares with no zone
                raise ValueError
        elif sort == "name":
            if not (isinstance(value, list) and len(value) == 4 and all(isinstance(v, str) for v in value)):
                raise ValueError
            if any(name_problem(v) for v in value):  # nothing the database could not take (a NUL)
                raise ValueError
        elif sort == "oom":
            if not isinstance(value, int) or isinstance(value, bool) or not -(2**31) <= value < 2**31:
                raise ValueError
        elif sort == "risk":
            if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)):
                raise ValueError
            if not (_number(value[0], 2**31) and _number(value[1], 1e300)):
                raise ValueError
        elif not _number(value, 1e300):
            raise ValueError
        return value, job_id
    except (ValueError, TypeError, orjson.JSONDecodeError, UnicodeDecodeError):
        raise InvalidInput(
            "the cursor is not valid",
            errors=[{"field": "query/cursor", "message": "not a cursor from this API for this sort"}],
        ) from None


def _after(keys: Sequence[ColumnElement[Any]], values: Sequence[Any], after_id: int) -> ColumnElement[bool]:
    """The rows after a cursor in the order ``keys`` descending, then id ascending."""
    expr: ColumnElement[bool] = _jobs.c.id > after_id
    for key, value in reversed(list(zip(keys, values, strict=True))):
        expr = or_(key < value, and_(key == value, expr))
    return expr


def _like(text: str) -> str:
    return "%" + text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def job_where(flt: JobFilter, orgs: frozenset[str] | None) -> list[ColumnElement[bool]]:
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
    prices: Prices,
) -> Page:
    """One page of jobs with their summaries (keyset pagination on the sort values, then id)."""
    base = select(_jobs, *(c for c in _summaries.columns if c.name != "job_id")).outerjoin(
        _summaries, _summaries.c.job_id == _jobs.c.id
    )
    where = job_where(flt, orgs)
    keys: list[ColumnElement[Any]] = []
    if sort == "name":
        value: ColumnElement[Any] = tuple_(_jobs.c.org, _jobs.c.repo, _jobs.c.workflow, _jobs.c.job, _jobs.c.id)
        order = [_jobs.c.org, _jobs.c.repo, _jobs.c.workflow, _jobs.c.job, _jobs.c.id]
        if cursor:
            names, after_id = decode_cursor(cursor, sort)
            where.append(value > tuple_(*(literal(n) for n in names), literal(after_id)))
    else:
        keys = _sort_keys(sort, prices)
        order = [*(k.desc() for k in keys), _jobs.c.id]
        if cursor:
            after, after_id = decode_cursor(cursor, sort)
            where.append(_after(keys, after if sort == "risk" else [after], after_id))
    labelled = [k.label(f"sort_{i}") for i, k in enumerate(keys)]
    stmt = base.add_columns(*labelled).where(*where).order_by(*order).limit(limit + 1)
    rows = list(await conn.execute(stmt))
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more and rows:
        last = rows[-1]
        if sort == "name":
            next_cursor = encode_cursor(sort, [last.org, last.repo, last.workflow, last.job], last.id)
        else:
            values = [getattr(last, f"sort_{i}") for i in range(len(keys))]
            next_cursor = encode_cursor(sort, values if sort == "risk" else values[0], last.id)
    return Page(rows=rows, next_cursor=next_cursor)


async def read_page(
    *,
    engine: AsyncEngine,
    principal: Principal,
    flt: JobFilter,
    sort: Sort,
    limit: int,
    cursor: str | None,
    prices: Prices,
) -> tuple[Page, dict[str, Any]]:
    """One page and the totals, as the API and the operator's page both read them."""
    async with engine.connect() as conn:
        page = await list_jobs(
            conn=conn, flt=flt, sort=sort, limit=limit, cursor=cursor, orgs=principal.orgs, prices=prices
        )
        return page, await totals(conn=conn, flt=flt, orgs=principal.orgs, prices=prices)


def _totals_columns() -> list[ColumnElement[Any]]:
    s = _summaries
    risky = func.coalesce(s.c.risk, 0)
    return [
        func.count(),
        func.count(s.c.job_id),
        func.sum(case((s.c.phase == "unknown", 1), else_=0)),
        func.sum(case((s.c.phase == "learning", 1), else_=0)),
        func.sum(case((s.c.phase == "confident", 1), else_=0)),
        func.sum(case((s.c.oom_backoff == true(), 1), else_=0)),
        func.sum(case((risky > 0, 1), else_=0)),
        func.sum(case((risky.op("&")(risk.BELOW_PEAK) != 0, 1), else_=0)),
        func.sum(s.c.saved_memory_gib_hours_per_day),
        func.sum(s.c.saved_cpu_core_hours_per_day),
        func.min(s.c.refreshed_at),
    ]


def _totals_of(row: Sequence[Any], prices: Prices) -> dict[str, Any]:
    jobs, summarised, unknown, learning, confident, backoff, at_risk, below, mem, cpu, oldest = row
    mem, cpu = round(float(mem or 0.0), 3), round(float(cpu or 0.0), 3)
    return {
        "jobs": jobs or 0,
        "summarised": summarised or 0,
        "unknown": unknown or 0,
        "learning": learning or 0,
        "confident": confident or 0,
        "oom_backoff": backoff or 0,
        "at_risk": at_risk or 0,
        "pinned_below_peak": below or 0,
        "saved_memory_gib_hours_per_day": mem,
        "saved_cpu_core_hours_per_day": cpu,
        "saved_money": money_block(prices, mem, cpu),
        "oldest_summary_at": to_rfc3339(oldest),
    }


async def totals(
    *, conn: AsyncConnection, flt: JobFilter, orgs: frozenset[str] | None, prices: Prices
) -> dict[str, Any]:
    """Over every job the filter selects: how many, by phase, in OOM backoff and at risk, and the
    capacity saved per day if every answer were applied (a job at risk saves nothing, ``risk``),
    in GiB-hours, core-hours and money."""
    stmt = (
        select(*_totals_columns())
        .select_from(_jobs)
        .outerjoin(_summaries, _summaries.c.job_id == _jobs.c.id)
        .where(*job_where(flt, orgs))
    )
    return _totals_of((await conn.execute(stmt)).one(), prices)


async def breakdown(
    *, conn: AsyncConnection, flt: JobFilter, orgs: frozenset[str] | None, prices: Prices, limit: int = 20
) -> dict[str, list[dict[str, Any]]]:
    """``totals`` per org (``"org"``) and per org and repo (``"repo"``) of the jobs the filter selects,
    in each the ``limit`` that save the most money first; one pass over the jobs (by repo, summed up
    by org here)."""
    stmt = (
        select(_jobs.c.org, _jobs.c.repo, *_totals_columns())
        .select_from(_jobs)
        .outerjoin(_summaries, _summaries.c.job_id == _jobs.c.id)
        .where(*job_where(flt, orgs))
        .group_by(_jobs.c.org, _jobs.c.repo)
    )
    repos: list[tuple[str, str | None, Sequence[Any]]] = []
    by_org: dict[str, list[Any]] = {}
    for row in await conn.execute(stmt):
        org, repo, values = row[0], row[1], list(row[2:])
        repos.append((org, repo, values))
        summed = by_org.setdefault(org, [None] * len(values))
        for i, v in enumerate(values[:-1]):  # counts and savings add up; the oldest time is the least
            summed[i] = v if summed[i] is None else summed[i] + (v or 0)
        oldest = values[-1]
        summed[-1] = oldest if summed[-1] is None or (oldest is not None and oldest < summed[-1]) else summed[-1]
    groups = {
        "org": [{"org": org, "repo": None, **_totals_of(v, prices)} for org, v in by_org.items()],
        "repo": [{"org": org, "repo": repo, **_totals_of(v, prices)} for org, repo, v in repos],
    }
    for rows in groups.values():
        rows.sort(key=lambda g: (-(g["saved_money"]["per_day"] or 0.0), g["org"], g["repo"] or ""))
        del rows[limit:]
    return groups


# --------------------------------------------------------------------------- one job's runs (the job view's plot)

_RECENT = (
    select(
        _runs.c.id,
        _runs.c.run_id,
        _runs.c.started_at,
        _runs.c.finished_at,
        _containers.c.name,
        _containers.c.memory_peak_bytes,
        _containers.c.memory_limit_bytes,
        _containers.c.cpu_request_millicores,
        _containers.c.oom_killed,
        _containers.c.oom_kill_events,
        _containers.c.oom_suspect,
        _containers.c.cpu_peak,
        _containers.c.cpu_p95,
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


async def recent_runs(*, conn: AsyncConnection, job_id: int, limit: int = risk.PEAK_RUNS) -> list[Any]:
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
