"""Fleet simulations (``/api/v1/simulations``), run as background analyses."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from service import analyses, simulations
from service.auth import AuthenticatedRoute, ReadPrincipal
from service.deps import AnalysisRoomDep, EngineDep, PolicyDep
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
from service.simulations.schemas import AnalysisPublic, SimulationCreate

router = APIRouter(prefix="/api/v1", tags=["analyses"], route_class=AuthenticatedRoute)


@router.post(
    "/simulations",
    status_code=202,
    response_model=AnalysisPublic,
    responses=problem_responses(BadRequest, InvalidInput, PayloadTooLarge, Unauthorized, Forbidden, TooManyRequests),
)
async def create_simulation(
    body: SimulationCreate, response: Response, principal: ReadPrincipal, room: AnalysisRoomDep, policy: PolicyDep
) -> dict[str, Any]:
    """Start a fleet simulation: replay a trace (``synthetic``, or the org's stored runs in a
    ``history`` window) onto the node ``pool`` under each profile, with and without ballast, and
    compare node-hours, cost, allocation, build start delays and nodes held by a lone build.
    Answers 202 at once; poll ``GET /api/v1/simulations/{id}`` (``Location``) for progress and the report."""
    if body.history is not None:
        principal.ensure_org(body.history.org)
    pool = simulations.pool_of(body)

    async def prepare() -> analyses.Work:
        loaded: list[simulations.Build] | None = None
        source: dict[str, Any] = {}
        if body.history is not None:
            h = body.history
            async with room.engine.connect() as conn:
                loaded, info = await simulations.load_trace(
                    conn=conn, org=h.org, since=h.since, until=h.until, sizes=h.sizes, policy=policy
                )
            source = {"history": info}

        def work(progress: Any) -> dict[str, Any]:
            builds = loaded
            if builds is None:  # a synthetic trace is generated in the thread, not on the event loop
                assert body.synthetic is not None
                builds = simulations.synthetic_from(body.synthetic)
                source["synthetic"] = body.synthetic.model_dump()
            scenarios = simulations.scenarios_for(
                body.profiles, simulations.ballast_of(body, builds, pool.provision_delay)
            )
            result = simulations.run_all(builds, pool, scenarios, seed=body.seed, progress=progress)
            result["trace"].update(source)
            return result

        return work

    return await analyses.launch(room, response, kind="simulation", body=body, principal=principal, prepare=prepare)


@router.get(
    "/simulations/{analysis_id}",
    response_model=AnalysisPublic,
    responses=problem_responses(NotFound, InvalidInput, Unauthorized, Forbidden),
)
async def get_simulation(analysis_id: str, principal: ReadPrincipal, engine: EngineDep) -> dict[str, Any]:
    """Status (``queued``, ``running``, ``done``, ``failed``), progress 0..1, and when done the report."""
    return await analyses.read(engine, analysis_id=analysis_id, kind="simulation", principal=principal)
