"""Backtests (``/api/v1/backtests``), run as background analyses."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from service import analyses
from service.auth import AuthenticatedRoute, ReadPrincipal
from service.backtests import service as backtest_service
from service.backtests.schemas import BacktestCreate
from service.deps import AnalysisRoomDep, EngineDep, SettingsDep
from service.errors import (
    BadRequest,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    TooManyRequests,
    Unauthorized,
    problem_responses,
)
from service.simulations.schemas import AnalysisPublic

router = APIRouter(prefix="/api/v1", tags=["analyses"], route_class=AuthenticatedRoute)


@router.post(
    "/backtests",
    status_code=202,
    response_model=AnalysisPublic,
    responses=problem_responses(BadRequest, InvalidInput, PayloadTooLarge, Unauthorized, Forbidden, TooManyRequests),
)
async def create_backtest(
    body: BacktestCreate, response: Response, principal: ReadPrincipal, room: AnalysisRoomDep, settings: SettingsDep
) -> dict[str, Any]:
    """Start a backtest: walk each job's stored history in time order and, before each run, size it
    with each parameter set (every combination of ``runs``, ``buffer``, ``cpu_percentile``,
    ``memory_qos``; the current overrides apply), then score against what the run used: OOM risk,
    throttle exposure, waste. The limits recorded with the runs and three baselines are scored
    alike; the waste/risk frontier is marked. Answers 202; poll ``Location`` for the report."""
    if body.org is not None:
        principal.ensure_org(body.org)
    elif principal.orgs is not None:
        raise Forbidden(f"token {principal.name!r} may not backtest every org: name one")
    max_memory = settings.max_memory
    async with room.engine.connect() as conn:
        if not await backtest_service.has_runs(conn=conn, org=body.org, since=body.since, until=body.until):
            where = f"of org {body.org!r}" if body.org is not None else "of any org"
            window = " that finished between since and until" if body.since or body.until else ""
            raise InvalidInput(
                f"nothing to backtest: no stored run {where}{window}",
                errors=[
                    {
                        "field": "body/org" if body.org is not None else "body",
                        "message": f"no stored run {where}{window}",
                    }
                ],
            )

    async def prepare() -> analyses.Work:
        async with room.engine.connect() as conn:
            series = await backtest_service.load(
                conn=conn, org=body.org, since=body.since, until=body.until, max_memory=max_memory
            )
            overrides = await backtest_service.load_pins(conn=conn, org=body.org)
        pols = backtest_service.policies(
            backtest_service.param_sets(body), baselines=body.baselines, efficient=body.efficient
        )

        def work(progress: Any) -> dict[str, Any]:
            return backtest_service.run(
                series, pols, overrides, progress=progress, max_backoff_memory=settings.max_backoff_memory
            )

        return work

    return await analyses.launch(room, response, kind="backtest", body=body, principal=principal, prepare=prepare)


@router.get(
    "/backtests/{analysis_id}",
    response_model=AnalysisPublic,
    responses=problem_responses(NotFound, InvalidInput, Unauthorized, Forbidden),
)
async def get_backtest(analysis_id: str, principal: ReadPrincipal, engine: EngineDep) -> dict[str, Any]:
    """Status, progress 0..1, and when done the report: per policy fleet-wide and per job."""
    return await analyses.read(engine, analysis_id=analysis_id, kind="backtest", principal=principal)
