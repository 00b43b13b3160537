"""``POST /api/v1/stages:compute``: a pipeline stage's pod totals from its steps (rules H1-H7)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.auth import AuthenticatedRoute, ReadPrincipal
from service.deps import EngineDep, PolicyDep, SettingsDep
from service.errors import BadRequest, Forbidden, InvalidInput, PayloadTooLarge, Unauthorized, problem_responses
from service.sizing import service as sizing_service
from service.stages import service as stages_service
from service.stages.flatten import flatten
from service.stages.public import StagePublic
from service.stages.schemas import StageCompute

router = APIRouter(prefix="/api/v1", tags=["stages"], route_class=AuthenticatedRoute)


@router.post(
    "/stages:compute",
    response_model=StagePublic,
    responses=problem_responses(BadRequest, InvalidInput, PayloadTooLarge, Unauthorized, Forbidden),
)
async def compute_stage(
    body: StageCompute, principal: ReadPrincipal, settings: SettingsDep, engine: EngineDep, policy: PolicyDep
) -> dict[str, Any]:
    """The stage (lite-engine) container, each background container, the pod's scheduling request
    and sum of limits, and every step's final limit, for a tree of steps, parallel blocks and
    groups. With ``options.use_recommendations``, a step that references a job and leaves a limit
    out takes the sizer's recommended limit for it; ``steps[].source`` says where each number came from.
    A slow or failed database never fails the call: those steps take the defaults and ``degraded`` is true."""
    items = flatten(body.stage)
    keys = stages_service.wanted_jobs(body, items)
    for key in keys:
        principal.ensure_org(key.org)
    answers, degraded = await sizing_service.answers_for(
        engine=engine, keys=keys, policy=policy, deadline=settings.sizing_deadline_ms / 1000
    )
    return stages_service.compose(body, items, answers, degraded=degraded)
