"""The analyses view: start a backtest or a fleet simulation, find past ones, read one."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Query
from fastapi.responses import HTMLResponse

from service import analyses
from service.auth import ReadPrincipal
from service.backtests import service as backtest_service
from service.deps import EngineDep
from service.plots import line_panels
from service.simulations import report as simulate
from service.ui.render import render, router


@router.get("/fragments/analyses")
async def analyses_view(principal: ReadPrincipal, engine: EngineDep) -> HTMLResponse:
    async with engine.connect() as conn:
        past = await analyses.recent(conn=conn, principal=principal)
    return render("analyses.html", orgs=sorted(principal.orgs) if principal.orgs is not None else None, past=past)


def backtest_plot(result: dict[str, Any]) -> str | None:
    """Each policy's memory waste against its OOM-risk runs, the frontier as a line."""
    points = [(p["oom_risk_runs"], p["memory_waste_gib_hours"]) for p in result["policies"] if p.get("runs_scored")]
    frontier = sorted(
        (p["oom_risk_runs"], p["memory_waste_gib_hours"]) for p in result["policies"] if p["frontier"]["memory"]
    )
    if not points:
        return None
    return line_panels(
        "memory waste (GiB-h) by OOM-risk runs, per policy",
        [("memory waste (GiB-h)", {"frontier": [(float(x), float(y)) for x, y in frontier]})],
        x_label="OOM-risk runs",
        markers=[(0, "a policy", [(float(x), float(y)) for x, y in points])],
    )


@router.get("/fragments/analysis")
async def analysis_view(
    principal: ReadPrincipal,
    engine: EngineDep,
    kind: Literal["backtest", "simulation"],
    id: Annotated[str, Query(min_length=1, max_length=36)],
) -> HTMLResponse:
    async with engine.connect() as conn:
        found = await analyses.get_readable(conn=conn, analysis_id=id, kind=kind, principal=principal)
    table = plot = None
    result = found["result"]
    if found["status"] == "done" and result is not None:
        if kind == "simulation":
            table = simulate.render(result)
            plot = simulate.plot(result)
        else:
            table = backtest_service.render(result)
            plot = backtest_plot(result)
    return render("analysis.html", a=found, kind=kind, table=table, plot=plot)
