"""The fleet view (the jobs list with money and risk, totals by org and repo) and the trends view."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import time as midnight
from typing import Annotated, Any, Literal

from fastapi import Depends, Query, Request
from fastapi.responses import HTMLResponse

from service.auth import ReadPrincipal
from service.deps import EngineDep, SettingsDep
from service.jobs import service as jobs_service
from service.jobs import trends
from service.jobs.money import Prices
from service.jobs.public import public as job_public
from service.jobs.service import JobFilter, Sort
from service.plots import line_panels
from service.ui.render import PAGE_SIZE, Name, render, router
from service.wire import to_rfc3339, utcnow

Phase = Literal["", "unknown", "learning", "confident"]


def _filter(
    principal: ReadPrincipal,
    org: Name = None,
    repo: Name = None,
    workflow: Name = None,
    q: Name = None,
    phase: Phase = "",
) -> JobFilter:
    """The fleet's and the trends' filter from the query string (an empty field filters nothing)."""
    return jobs_service.job_filter(
        principal, org=org or None, repo=repo or None, workflow=workflow or None, job=None, phase=phase or None, q=q
    )


FilterDep = Annotated[JobFilter, Depends(_filter)]


@router.get("/fragments/jobs")
async def fleet(
    principal: ReadPrincipal,
    engine: EngineDep,
    settings: SettingsDep,
    flt: FilterDep,
    sort: Sort = "money",
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
) -> HTMLResponse:
    prices = Prices.of(settings)
    page, totals = await jobs_service.read_page(
        engine=engine, principal=principal, flt=flt, sort=sort, limit=PAGE_SIZE, cursor=cursor or None, prices=prices
    )
    async with engine.connect() as conn:
        groups = await jobs_service.breakdown(conn=conn, flt=flt, orgs=principal.orgs, prices=prices)
    return render(
        "jobs.html",
        rows=[job_public(r, prices) for r in page.rows],
        totals=totals,
        by_org=groups["org"],
        by_repo=groups["repo"],
        next_cursor=page.next_cursor,
        first_page=not cursor,
        window_days=jobs_service.WINDOW_DAYS,
        currency=prices.currency,
        prices=prices,
    )


def trend_plot(days: list[trends.Day], currency: str) -> str | None:
    """Per day: runs, OOM-killed runs and kills avoided by growth; what the runs could have saved at today's
    answers (money)."""
    if not days or not any(d.runs for d in days):
        return None
    start = datetime.combine(days[0].day, midnight())

    def x(d: trends.Day) -> float:
        return (datetime.combine(d.day, midnight()) + timedelta(hours=12) - start).total_seconds()

    label = f"{days[0].day} to {days[-1].day}"
    hover: list[dict[str, list[str]]] = [
        {
            "runs": [f"{d.day}: {d.runs} runs" for d in days],
            "OOM-killed": [f"{d.day}: {d.oom_kills} runs OOM-killed" for d in days],
            "kills avoided": [f"{d.day}: {d.growths} kills avoided by growth" for d in days],
        },
        {"could save": [f"{d.day}: {d.could_save_money:,.2f} {currency}" for d in days]},
    ]
    return line_panels(
        f"the last {len(days)} days ({label}, UTC), per day",
        [
            (
                "runs, runs OOM-killed, kills avoided",
                {
                    "runs": [(x(d), d.runs) for d in days],
                    "OOM-killed": [(x(d), d.oom_kills) for d in days],
                    "kills avoided": [(x(d), d.growths) for d in days],
                },
            ),
            (f"could save at today's answers ({currency})", {"could save": [(x(d), d.could_save_money) for d in days]}),
        ],
        panel_height=150,
        hover=hover,
    )


#: seconds a trend of the trends view is kept: adding up a fleet's 30 days reads every run of them (about a
#: second at 10,000 jobs of 20 runs, bench/ui.py); a trend by day needs no fresher figures than a minute's
TREND_TTL = 60.0
TREND_ENTRIES = 64


@dataclass
class TrendCache:
    """The trends view's recent trends, per app (``app.state.ui_trends``), newest last."""

    entries: OrderedDict[Any, tuple[float, list[trends.Day], datetime]] = field(default_factory=OrderedDict)

    def get(self, key: Any) -> tuple[list[trends.Day], datetime] | None:
        found = self.entries.get(key)
        if found is None or found[0] < time.monotonic():
            return None
        return found[1], found[2]

    def put(self, key: Any, days: list[trends.Day], computed_at: datetime) -> None:
        self.entries[key] = (time.monotonic() + TREND_TTL, days, computed_at)
        self.entries.move_to_end(key)
        while len(self.entries) > TREND_ENTRIES:
            self.entries.popitem(last=False)


def _trend_cache(request: Request) -> TrendCache:
    state = request.app.state
    cache: TrendCache | None = getattr(state, "ui_trends", None)
    if cache is None:
        cache = state.ui_trends = TrendCache()
    return cache


@router.get("/fragments/trends")
async def trends_view(
    request: Request, principal: ReadPrincipal, engine: EngineDep, settings: SettingsDep, flt: FilterDep
) -> HTMLResponse:
    prices = Prices.of(settings)
    now = utcnow()
    key = (flt, principal.orgs, prices, now.date())
    cache = _trend_cache(request)
    found = cache.get(key)
    if found is None:
        async with engine.connect() as conn:
            days = await trends.trend(conn=conn, flt=flt, orgs=principal.orgs, prices=prices, now=now)
        cache.put(key, days, now)
        found = days, now
    days, computed_at = found
    return render(
        "trends.html",
        **trend_context(days, prices),
        scope=_scope_text(flt),
        computed_at=to_rfc3339(computed_at),
        ttl=int(TREND_TTL),
    )


def trend_context(days: list[trends.Day], prices: Prices) -> dict[str, Any]:
    """What ``trends_table.html`` shows of a trend (the trends view and the job view)."""
    return {
        "days": list(reversed(days)),
        "trend_plot": trend_plot(days, prices.currency),
        "series": trends.SERIES,
        "currency": prices.currency,
        "sums": {key: sum(getattr(d, key) or 0 for d in days) for key, _ in trends.SERIES},
    }


def _scope_text(flt: JobFilter) -> str:
    parts = [p for p in (flt.org, flt.repo, flt.workflow) if p]
    text = " / ".join(parts) if parts else "the whole fleet"
    text = f"{text}, names containing {flt.q!r}" if flt.q else text
    return f"{text}, {flt.phase} jobs" if flt.phase else text
