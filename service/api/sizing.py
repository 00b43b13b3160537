"""``GET /api/v1/sizing/{org}/{repo}/{workflow}/{job}`` (rules S3-S17, O2-O4, O6)."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from ..auth import ReadPrincipal
from ..db import DB_FAULTS
from ..errors import Forbidden, InvalidInput, Unauthorized, problem_responses
from ..models import CpuPercentile, SizingPublic
from ..observability.metrics import DATABASE_ERRORS, DEGRADED_ANSWERS, RECOMMENDATIONS
from ..services import sizing as sizing_service
from ..services.overrides import ScopeKey
from .paths import JobKeyDep

router = APIRouter(prefix="/api/v1/sizing", tags=["sizing"])
log = logging.getLogger("ci_sizer.sizing")


class OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def policy_of(request: Request) -> sizing_service.Policy:
    settings = request.app.state.settings
    return sizing_service.Policy(
        cpu_sizing_mode=settings.cpu_sizing_mode,
        memory_qos=settings.memory_qos,
        max_memory=settings.max_memory,
    )


async def _recommend(
    request: Request, key: ScopeKey, params: sizing_service.SizingParams, policy: sizing_service.Policy
) -> sizing_service.Recommendation:
    async with request.app.state.sessionmaker() as session:
        return await sizing_service.recommend(session=session, key=key, params=params, policy=policy)


@router.get(
    "/{org}/{repo}/{workflow}/{job}",
    response_model=SizingPublic,
    response_class=OrjsonResponse,
    responses=problem_responses(InvalidInput, Unauthorized, Forbidden),
)
async def get_sizing(
    request: Request,
    key: JobKeyDep,
    principal: ReadPrincipal,
    runs: Annotated[int, Query(ge=1, le=100, description="newest clean runs to analyse (rule S5)")] = 5,
    buffer: Annotated[int, Query(ge=0, le=1000, description="CPU headroom in percent (rule S9)")] = 20,
    cpu_percentile: Annotated[CpuPercentile, Query(description="CPU stat to size from (rule S9)")] = "p95",
) -> OrjsonResponse:
    """Requests and limits per container for the job's next run. A job never seen answers 200 in
    the ``unknown`` phase. Path segments are percent-encoded; ``%2F`` is a ``/`` inside a name.

    Fail-open: when the database is down or does not answer within the deadline
    (``CI_SIZER_SIZING_DEADLINE_MS``, 250 ms), the answer is still 200: the last answer served for
    the job, else the unknown-phase defaults, with ``meta.degraded: true``."""
    principal.ensure_org(key.org)
    params = sizing_service.SizingParams(runs=runs, buffer=buffer, cpu_percentile=cpu_percentile)
    policy = policy_of(request)
    cache: sizing_service.AnswerCache = request.app.state.answers
    deadline = request.app.state.settings.sizing_deadline_ms / 1000
    try:
        rec = await asyncio.wait_for(_recommend(request, key, params, policy), deadline)
    except DB_FAULTS as exc:
        DEGRADED_ANSWERS.inc()
        if not isinstance(exc, TimeoutError):
            DATABASE_ERRORS.inc()
        log.warning("sizing answered degraded: %s", type(exc).__name__)
        answer = sizing_service.degraded(key=key, cache=cache, params=params, policy=policy)
        RECOMMENDATIONS.labels(phase=answer["meta"]["phase"], override_scope=answer["meta"]["override_scope"]).inc()
        return OrjsonResponse(answer)
    cache.put(key, rec.answer)
    meta = rec.answer["meta"]
    RECOMMENDATIONS.labels(phase=meta["phase"], override_scope=meta["override_scope"]).inc()
    if rec.job_id is not None:
        request.app.state.fleet.note(rec.job_id, rec.totals())
    return OrjsonResponse(rec.answer)
