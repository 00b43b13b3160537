"""``GET /api/v1/sizing/{org}/{repo}/{workflow}/{job}`` (rules S3-S17, O2-O4, O6)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

import orjson
from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncEngine

from service.auth import AuthenticatedRoute, ReadPrincipal
from service.cache import Entry
from service.db import DB_FAULTS, within
from service.deps import AnswersDep, EngineDep, FleetDep, PolicyDep, SettingsDep
from service.errors import Forbidden, InvalidInput, Unauthorized, problem_responses
from service.keys import ScopeKey
from service.observability.metrics import DATABASE_ERRORS, DEGRADED_ANSWERS, RECOMMENDATIONS, SIZING_CACHE
from service.paths import JobKeyDep
from service.sizing import formats
from service.sizing import service as sizing_service
from service.sizing.answer import Answer
from service.sizing.fit import TemplateCpu
from service.sizing.params import BUFFER, CPU_PERCENTILE_DOC, DEFAULT_CPU_PERCENTILE, RUNS, CpuPercentile, SizingParams
from service.sizing.schemas import SizingPublic

OutputFormat = Literal[
    "json", "k8s", "gitlab", "dotenv", "argo", "tekton", "tekton-v1beta1", "buildkite", "jenkins", "arc"
]
# the query parameters: bounds, defaults and docs from sizing/params.py (the OpenAPI document reads them)
RunsQuery = Annotated[int, Query(ge=RUNS.ge, le=RUNS.le, description=RUNS.doc)]
BufferQuery = Annotated[int, Query(ge=BUFFER.ge, le=BUFFER.le, description=BUFFER.doc)]
CpuPercentileQuery = Annotated[CpuPercentile, Query(description=CPU_PERCENTILE_DOC)]

T = TypeVar("T")
router = APIRouter(prefix="/api/v1/sizing", tags=["sizing"], route_class=AuthenticatedRoute)
log = logging.getLogger("ci_sizer.sizing")


class OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


async def _recommend(
    engine: AsyncEngine, key: ScopeKey, params: SizingParams, policy: sizing_service.Policy
) -> sizing_service.Recommendation:
    # a bare connection, not an ORM session: the read path is three Core statements
    async with engine.connect() as conn:
        return await sizing_service.recommend(conn=conn, key=key, params=params, policy=policy)


def _json(body: bytes) -> Response:
    return Response(content=body, media_type="application/json")


def _rendered(output: str, answer: Answer, mapping: formats.Mapping | None, limits: TemplateCpu | None) -> Response:
    media_type, body = formats.render(output, answer, mapping, limits)
    return Response(content=body, media_type=media_type)


def _query(parse: Callable[[str, str], T], name: str, value: str, output: str) -> T:
    """A pod-format query parameter read by ``parse``; a value it cannot read is a 422 naming ``name``."""
    try:
        return parse(value, output)
    except formats.MappingError as exc:
        raise InvalidInput(
            str(exc), errors=[{"loc": ["query", name], "msg": str(exc), "type": "value_error"}]
        ) from None


@router.get(
    "/{org}/{repo}/{workflow}/{job}",
    response_model=SizingPublic,
    response_class=OrjsonResponse,
    responses={
        200: {
            "description": "the answer; with ``format`` other than json, in that CI system's shape",
            "content": {"application/yaml": {}, "text/plain": {}},
        },
        **problem_responses(InvalidInput, Unauthorized, Forbidden),
    },
)
async def get_sizing(
    key: JobKeyDep,
    principal: ReadPrincipal,
    settings: SettingsDep,
    engine: EngineDep,
    cache: AnswersDep,
    policy: PolicyDep,
    fleet: FleetDep,
    runs: RunsQuery = RUNS.default,
    buffer: BufferQuery = BUFFER.default,
    cpu_percentile: CpuPercentileQuery = DEFAULT_CPU_PERCENTILE,
    output: Annotated[
        OutputFormat,
        Query(alias="format", description="json (the spec's shape) or a CI system's: see docs/integrations"),
    ] = "json",
    containers: Annotated[
        str,
        Query(
            max_length=formats.MAX_MAPPING_LENGTH,
            description="the runner pod's containers to size, ``POD[=RECORDED],...`` (default: only the "
            "runner's main container, sized from the job's main recorded one): see docs/integrations",
        ),
    ] = "",
    template_cpu_limit: Annotated[
        str,
        Query(
            max_length=formats.MAX_MAPPING_LENGTH,
            description="the CPU limit the runner's own template gives the pod's containers, ``QUANTITY`` "
            "(every container written) or ``POD=QUANTITY,...``: every CPU request written is at most it, so "
            "that the merged pod is never rejected for a request above its limit: see docs/integrations",
        ),
    ] = "",
) -> Response:
    """Requests and limits per container for the job's next run. A job never seen answers 200 in
    the ``unknown`` phase. Path segments are percent-encoded; ``%2F`` is a ``/`` inside a name.

    Answers are cached in process until a run of the job is stored or pruned or an override
    changes (``meta.generated_at`` says when an answer was computed).

    Fail-open: when the database is down or does not answer within the deadline
    (``CI_SIZER_SIZING_DEADLINE_MS``, 250 ms), the answer is still 200: the last answer served for
    the job, else the unknown-phase defaults, with ``meta.degraded: true`` and the header
    ``CI-Sizer-Degraded: true`` (in every format)."""
    principal.ensure_org(key.org)
    mapping = _query(formats.parse_containers, "containers", containers, output)
    limits = _query(formats.parse_template_cpu_limit, "template_cpu_limit", template_cpu_limit, output)
    params = SizingParams(runs=runs, buffer=buffer, cpu_percentile=cpu_percentile)
    hit = cache.fresh(key, params)
    if hit is not None:
        SIZING_CACHE.labels(result="hit").inc()
        RECOMMENDATIONS.labels(phase=hit.phase, override_scope=hit.override_scope).inc()
        if output == "json":
            return _json(hit.body)
        media_type, content = hit.rendered(output, mapping, limits)
        return Response(content=content, media_type=media_type)
    SIZING_CACHE.labels(result="miss").inc()
    deadline = settings.sizing_deadline_ms / 1000
    ticket = cache.ticket(key)
    try:
        rec = await within(deadline, _recommend(engine, key, params, policy))
    except DB_FAULTS as exc:
        DEGRADED_ANSWERS.inc()
        if not isinstance(exc, TimeoutError):
            DATABASE_ERRORS.inc()
        log.warning("sizing answered degraded: %s", type(exc).__name__)
        last = cache.last_served(key, params)
        answer = sizing_service.degraded(
            key=key, last=None if last is None else last.answer, params=params, policy=policy
        )
        RECOMMENDATIONS.labels(phase=answer.meta.phase, override_scope=answer.meta.override_scope).inc()
        response = (
            _json(orjson.dumps(answer.as_dict())) if output == "json" else _rendered(output, answer, mapping, limits)
        )
        response.headers[formats.DEGRADED_HEADER] = "true"
        return response
    meta = rec.answer.meta
    body = orjson.dumps(rec.answer.as_dict())
    entry = Entry(answer=rec.answer, body=body, fresh_until=rec.fresh_until)
    cache.put(key, params, ticket, entry)
    RECOMMENDATIONS.labels(phase=meta.phase, override_scope=meta.override_scope).inc()
    if rec.job_id is not None:
        fleet.note(rec.job_id, rec.totals())
    if output == "json":
        return _json(body)
    media_type, content = entry.rendered(output, mapping, limits, rec.answer)
    return Response(content=content, media_type=media_type)
