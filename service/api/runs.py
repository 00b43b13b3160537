"""``POST /api/v1/runs`` and ``POST /api/v1/runs:batch`` (rules I1-I5a)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from pydantic import ValidationError

from ..auth import IngestPrincipal
from ..db import WriteSessionDep
from ..errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    PayloadTooLarge,
    Unauthorized,
    problem_responses,
    validation_errors,
)
from ..models import (
    BatchItemPublic,
    RunCreate,
    RunPublic,
    RunsBatchCreate,
    RunsBatchPublic,
)
from ..observability.metrics import OOM_SUSPECT_RUNS, RUNS_INGESTED
from ..services import runs as runs_service

router = APIRouter(prefix="/api/v1", tags=["runs"])


@router.post(
    "/runs",
    response_model=RunPublic,
    status_code=201,
    responses={
        200: {
            "model": RunPublic,
            "description": "the same run was already stored; nothing new was stored",
        },
        **problem_responses(Conflict, InvalidInput, PayloadTooLarge, Unauthorized, Forbidden),
    },
)
async def post_run(
    body: RunCreate,
    response: Response,
    session: WriteSessionDep,
    principal: IngestPrincipal,
) -> RunPublic:
    """Store one finished run; 201 when new, 200 when already stored with the same content,
    409 when stored with other content (rule I4)."""
    principal.ensure_org(body.org)
    run = await runs_service.ingest(session=session, body=body)
    await session.commit()
    count_ingest(run)
    response.status_code = 201 if run.result == "created" else 200
    return run


def count_ingest(run: RunPublic) -> None:
    """Count a committed run by result (conflicts and rejections are counted where they end)."""
    RUNS_INGESTED.labels(result=run.result).inc()
    if run.result == "created" and not run.clean:
        OOM_SUSPECT_RUNS.inc()


@router.post(
    "/runs:batch",
    response_model=RunsBatchPublic,
    responses=problem_responses(InvalidInput, PayloadTooLarge, Unauthorized, Forbidden),
)
async def post_runs_batch(
    body: RunsBatchCreate, session: WriteSessionDep, principal: IngestPrincipal
) -> RunsBatchPublic:
    """Store up to 500 runs; each is answered on its own, by index, and one bad run does not
    block the others. Every run answered 201 is committed."""
    results: list[BatchItemPublic] = []
    for index, raw in enumerate(body.runs):
        try:
            run_body = RunCreate.model_validate(raw)
        except ValidationError as exc:
            RUNS_INGESTED.labels(result="rejected").inc()
            errors = validation_errors([{**e, "loc": ("body", "runs", index, *e["loc"])} for e in exc.errors()])
            results.append(
                BatchItemPublic(
                    index=index,
                    status=422,
                    result="rejected",
                    problem={
                        "status": 422,
                        "title": "Unprocessable Content",
                        "type": InvalidInput.type_,
                        "errors": errors,
                    },
                )
            )
            continue
        if not principal.may_access_org(run_body.org):
            RUNS_INGESTED.labels(result="rejected").inc()
            results.append(
                BatchItemPublic(
                    index=index,
                    status=403,
                    result="rejected",
                    problem={
                        "status": 403,
                        "title": "Forbidden",
                        "type": Forbidden.type_,
                        "detail": f"token {principal.name!r} may not access org {run_body.org!r}",
                    },
                )
            )
            continue
        try:
            run = await runs_service.ingest(session=session, body=run_body)
            await session.commit()
        except Conflict as exc:
            await session.rollback()
            RUNS_INGESTED.labels(result="conflict").inc()
            results.append(
                BatchItemPublic(
                    index=index,
                    status=409,
                    result="conflict",
                    problem={
                        "status": 409,
                        "title": "Conflict",
                        "type": Conflict.type_,
                        "detail": exc.detail,
                    },
                )
            )
            continue
        count_ingest(run)
        status = 201 if run.result == "created" else 200
        results.append(BatchItemPublic(index=index, status=status, result=run.result, run=run))
    return RunsBatchPublic(
        created=sum(r.result == "created" for r in results),
        duplicates=sum(r.result == "duplicate" for r in results),
        conflicts=sum(r.result == "conflict" for r in results),
        rejected=sum(r.result == "rejected" for r in results),
        results=results,
    )
