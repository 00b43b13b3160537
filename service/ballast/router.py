"""Ballast advice (``GET /api/v1/ballast``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query

from service.auth import AuthenticatedRoute, ReadPrincipal
from service.ballast import service as ballast_service
from service.deps import EngineDep, PolicyDep, SettingsDep
from service.errors import Forbidden, InvalidInput, Unauthorized, problem_responses
from service.placement.schemas import PlacementCpu, PlacementMemory
from service.simulations.schemas import BallastPublic
from service.wire import Name, utcnow

router = APIRouter(prefix="/api/v1", tags=["analyses"], route_class=AuthenticatedRoute)


@router.get(
    "/ballast",
    response_model=BallastPublic,
    responses=problem_responses(InvalidInput, Unauthorized, Forbidden),
)
async def get_ballast(
    engine: EngineDep,
    policy: PolicyDep,
    settings: SettingsDep,
    principal: ReadPrincipal,
    org: Annotated[Name, Query(description="the org whose builds the ballast serves")],
    days: Annotated[int, Query(ge=1, le=92, description="the window of stored runs, ending now")] = 28,
    provision_delay_seconds: Annotated[
        float, Query(ge=1, le=86400, description="how long the autoscaler takes to bring a node")
    ] = 120,
    coverage: Annotated[
        float, Query(gt=0, le=1, description="the share of bursts the ballast should absorb (SA2)")
    ] = ballast_service.COVERAGE,
    node_cpu: Annotated[
        PlacementCpu, Query(description="the node the ballast lands on, to cost each choice in node-hours")
    ] = 8000,
    node_memory: Annotated[PlacementMemory, Query(description="the node's memory")] = 32 << 30,
) -> dict[str, Any]:
    """Ballast pods for instant build starts: their size (the most common recommended build-pod
    size), their count (the smallest that covers ``coverage`` of the bursts of build starts within
    the provision delay, with every choice's share and cost in node-hours), the hours of the week
    with no build among those the data covers (ballast can scale to zero), what the autoscaler
    needs for an evicted ballast pod to bring a node, and the cf-runtime Helm values to paste."""
    principal.ensure_org(org)
    until = utcnow()
    async with engine.connect() as conn:
        return await ballast_service.advise(
            conn=conn,
            org=org,
            since=until - timedelta(days=days),
            until=until,
            provision_delay=provision_delay_seconds,
            policy=policy,
            coverage=coverage,
            node_cpu=node_cpu,
            node_memory=node_memory,
            keep=settings.retention_runs,
        )
