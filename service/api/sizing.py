"""``GET /api/v1/sizing/{org}/{repo}/{workflow}/{job}`` (rules S3-S17, O2-O4, O6)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from ..auth import ReadPrincipal
from ..db import SessionDep
from ..errors import Forbidden, InvalidInput, Unauthorized, problem_responses
from ..models import CpuPercentile, SizingPublic
from ..observability.metrics import RECOMMENDATIONS
from ..services import sizing as sizing_service
from .paths import JobKeyDep

router = APIRouter(prefix="/api/v1/sizing", tags=["sizing"])


class OrjsonResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def policy_of(request: Request) -> sizing_service.Policy:
    settings = request.app.state.settings
    return sizing_service.Policy(
        cpu_sizing_mode=settings.cpu_sizing_mode,
        memory_qos=settings.memory_qos,
        max_memory=settings.max_memory,
    )


@router.get(
    "/{org}/{repo}/{workflow}/{job}",
    response_model=SizingPublic,
    response_class=OrjsonResponse,
    responses=problem_responses(InvalidInput, Unauthorized, Forbidden),
)
async def get_sizing(
    request: Request,
    key: JobKeyDep,
    session: SessionDep,
    principal: ReadPrincipal,
    runs: Annotated[int, Query(ge=1, le=100, description="newest clean runs to analyse (rule S5)")] = 5,
    buffer: Annotated[int, Query(ge=0, le=1000, description="CPU headroom in percent (rule S9)")] = 20,
    cpu_percentile: Annotated[CpuPercentile, Query(description="CPU stat to size from (rule S9)")] = "p95",
) -> OrjsonResponse:
    """Requests and limits per container for the job's next run. A job never seen answers 200 in
    the ``unknown`` phase. Path segments are percent-encoded; ``%2F`` is a ``/`` inside a name."""
    principal.ensure_org(key.org)
    rec = await sizing_service.recommend(
        session=session,
        key=key,
        params=sizing_service.SizingParams(runs=runs, buffer=buffer, cpu_percentile=cpu_percentile),
        policy=policy_of(request),
    )
    meta = rec.answer["meta"]
    RECOMMENDATIONS.labels(phase=meta["phase"], override_scope=meta["override_scope"]).inc()
    if rec.job_id is not None:
        request.app.state.fleet.note(rec.job_id, rec.totals())
    return OrjsonResponse(rec.answer)
