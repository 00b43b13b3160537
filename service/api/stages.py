"""``POST /api/v1/stages:compute``: a pipeline stage's pod totals from its steps (rules H1-H7)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, Request

from ..auth import ReadPrincipal
from ..db import DB_FAULTS
from ..errors import BadRequest, Forbidden, InvalidInput, PayloadTooLarge, Unauthorized, problem_responses
from ..models import StageCompute, StagePublic
from ..observability.metrics import DATABASE_ERRORS
from ..services import stages as stages_service
from ..services.overrides import ScopeKey
from .sizing import policy_of

router = APIRouter(prefix="/api/v1", tags=["stages"])
log = logging.getLogger("ci_sizer.stages")


async def _answers(request: Request, keys: list[ScopeKey]) -> tuple[dict[ScopeKey, dict[str, Any]], bool]:
    """The referenced jobs' recommendations; when the database fails or is slow (the sizing
    deadline per job), the ones not read are left out and the reply says ``degraded``."""
    if not keys:
        return {}, False
    deadline = request.app.state.settings.sizing_deadline_ms / 1000
    policy = policy_of(request)
    answers: dict[ScopeKey, dict[str, Any]] = {}
    try:
        async with request.app.state.engine.connect() as conn:
            for key in keys:
                answers.update(
                    await asyncio.wait_for(stages_service.fetch(conn=conn, keys=[key], policy=policy), deadline)
                )
    except DB_FAULTS as exc:
        if not isinstance(exc, TimeoutError):
            DATABASE_ERRORS.inc()
        log.warning("stage recommendations degraded: %s", type(exc).__name__)
        return answers, True
    return answers, False


@router.post(
    "/stages:compute",
    response_model=StagePublic,
    responses=problem_responses(BadRequest, InvalidInput, PayloadTooLarge, Unauthorized, Forbidden),
)
async def compute_stage(body: StageCompute, request: Request, principal: ReadPrincipal) -> dict[str, Any]:
    """The stage (lite-engine) container, each background container, the pod's scheduling request
    and sum of limits, and every step's final limit, for a tree of steps, parallel blocks and
    groups. With ``options.use_recommendations``, a step that references a job and leaves a limit
    out takes the sizer's recommended limit for it; ``steps[].source`` says where each number came from.
    A slow or failed database never fails the call: those steps take the defaults and ``degraded`` is true."""
    items = stages_service.flatten(body.stage)
    keys = stages_service.wanted_jobs(body, items)
    for key in keys:
        principal.ensure_org(key.org)
    answers, degraded = await _answers(request, keys)
    return stages_service.compose(body, items, answers, degraded=degraded)
