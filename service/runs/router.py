"""``POST /api/v1/runs`` and ``POST /api/v1/runs:batch`` (rules I1-I5a)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from http import HTTPStatus
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from service import changes, deps
from service.auth import AuthenticatedRoute, IngestPrincipal
from service.db import UnitOfWork, WriteUnitOfWorkDep, bounded_write
from service.deps import AnswersDep, JobIdsDep, NotifierDep, PrunerDep, SettingsDep, SummariesDep
from service.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidInput,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    problem_responses,
    validation_errors,
)
from service.keys import ScopeKey
from service.observability.metrics import GROWN, OOM_SUSPECT_RUNS, RUNS_INGESTED
from service.runs import bodies
from service.runs import service as runs_service
from service.runs.schemas import BatchItemPublic, RunCreate, RunPublic, RunsBatchCreate, RunsBatchPublic
from service.settings import Settings
from service.wire import utcnow

log = logging.getLogger("ci_sizer.runs")


class FastJsonRoute(AuthenticatedRoute):
    """Parses JSON request bodies with orjson, several times faster than the standard library on
    arrays of samples. A body orjson refuses (``NaN``, integers past 64 bits, malformed JSON) is
    left to FastAPI's own parsing, so every answer stays what it was. The caller is then
    authenticated (``AuthenticatedRoute``) before anything is validated.

    A large body (``bodies.MIN_BYTES``) is parsed and its samples reduced in a worker process
    (``runs/bodies.py``), so that it does not stall the event loop and every other request."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        model = None if self.body_field is None else self.body_field.field_info.annotation
        reducers: dict[Any, Callable[[bytes], Any]] = {
            RunCreate: bodies.reduce_run,
            RunsBatchCreate: bodies.reduce_batch,
        }
        reduce = reducers.get(model)

        async def route_handler(request: Request) -> Response:
            body = await request.body()
            if body and reduce is not None and len(body) >= bodies.MIN_BYTES:
                try:
                    reduced = await deps.bodies(request).run(reduce, body)
                except Exception as exc:  # the worker died twice: parse on the loop, as for any body
                    log.warning("large body not reduced in the worker: %s", type(exc).__name__)
                else:
                    if isinstance(reduced, bodies.Invalid):  # judged in the worker: nothing parsed here
                        raise RequestValidationError(bodies.errors_of(reduced, ("body",)))
                    request._json = reduced
                    return await handler(request)
            if body:
                with contextlib.suppress(orjson.JSONDecodeError):
                    request._json = orjson.loads(body)
            return await handler(request)

        return route_handler


router = APIRouter(prefix="/api/v1", tags=["runs"], route_class=FastJsonRoute)

#: what both POSTs may answer besides their own (the front answers 401/403, 413, 415 and 408 before them)
_ERRORS = (
    BadRequest,
    InvalidInput,
    PayloadTooLarge,
    UnsupportedMediaType,
    RequestTimeout,
    Unauthorized,
    Forbidden,
    Unavailable,
)


@dataclass(frozen=True)
class Ingest:
    """What storing a run needs from the app, as typed dependencies."""

    settings: SettingsDep
    answers: AnswersDep
    job_ids: JobIdsDep
    pruner: PrunerDep
    summaries: SummariesDep
    notifier: NotifierDep


IngestDep = Annotated[Ingest, Depends()]


def _time_errors(settings: Settings, body: RunCreate, where: str) -> list[dict[str, str]]:
    """The run's timestamps outside the window the settings allow, named under ``where``."""
    errors = runs_service.time_errors(
        body,
        now=utcnow(),
        max_ahead=timedelta(seconds=settings.finished_at_max_ahead_seconds),
        max_age=timedelta(days=settings.finished_at_max_age_days),
    )
    return [{**e, "field": f"{where}/{e['field']}"} for e in errors]


async def _store(app: Ingest, uow: UnitOfWork, body: RunCreate) -> RunPublic:
    """Ingest and commit one run within the write timeout. Only a committed run is answered
    201; a database that is down or too slow is a 503 to retry (a retry of a run that did commit
    is answered 200, rule I4)."""
    settings = app.settings
    key = ScopeKey(body.org, body.repo, body.workflow, body.job)

    async def work() -> runs_service.Ingested:
        done = await runs_service.ingest(session=uow.session, body=body, job_ids=app.job_ids)
        if done.run.result == "created":
            if app.notifier is None:  # (SQLite: nobody to tell; PostgreSQL: after the commit, below)
                await changes.publish(uow.session, key, app.answers.origin)
            # after the commit: this worker reads its own writes
            uow.after_commit(lambda: app.answers.invalidate(key))
            uow.after_commit(lambda: app.pruner.note(done.job_id, key))
            uow.after_commit(lambda: app.summaries.note(done.job_id, key))
        await uow.commit()
        return done

    try:
        done = await bounded_write(uow, settings.write_timeout, work())
    except TimeoutError:
        raise Unavailable(
            f"the database did not commit the run within {settings.write_timeout:g}s; retry",
            headers={"Retry-After": "2"},
        ) from None
    if done.run.result == "created" and app.notifier is not None:
        # to other workers after the commit, batched with the build path's runs (changes.Notifier): a
        # NOTIFY in the run's transaction would hold the database's notify lock through its commit's
        # flush, and every announcement behind it (issue 38); not waited for, as on the build path
        app.notifier.note(key)
    RUNS_INGESTED.labels(result=done.run.result).inc()
    if done.run.result == "created" and not done.run.clean:
        OOM_SUSPECT_RUNS.inc()
    for result in done.growths:  # issue 40: the events of a newly stored (committed) run, once
        GROWN[result].inc()
    return done.run


@router.post(
    "/runs",
    response_model=RunPublic,
    status_code=201,
    responses={
        200: {"model": RunPublic, "description": "the same run was already stored; nothing new was stored"},
        **problem_responses(Conflict, *_ERRORS),
    },
)
async def post_run(
    body: RunCreate, response: Response, uow: WriteUnitOfWorkDep, app: IngestDep, principal: IngestPrincipal
) -> RunPublic:
    """Store one finished run; 201 when new, 200 when already stored with the same content,
    409 when stored with other content (rule I4), 503 with Retry-After when the database fails."""
    principal.ensure_org(body.org)
    errors = _time_errors(app.settings, body, "body")
    if errors:
        RUNS_INGESTED.labels(result="rejected").inc()
        raise InvalidInput("invalid run: " + ", ".join(e["field"] for e in errors), errors=errors)
    run = await _store(app, uow, body)
    response.status_code = 201 if run.result == "created" else 200
    return run


def _problem(status: int, type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "title": HTTPStatus(status).phrase, "status": status, **fields}


@router.post(
    "/runs:batch",
    response_model=RunsBatchPublic,
    responses=problem_responses(*_ERRORS),
)
async def post_runs_batch(
    body: RunsBatchCreate, uow: WriteUnitOfWorkDep, app: IngestDep, principal: IngestPrincipal
) -> RunsBatchPublic:
    """Store up to 500 runs; each is answered on its own, by index, and one bad run does not
    block the others. Every run answered 201 is committed."""
    results: list[BatchItemPublic] = []
    for index, raw in enumerate(body.runs):
        invalid: bodies.Invalid | None = None
        if isinstance(raw, bodies.Invalid):  # a large batch's run, judged in the worker (runs/bodies.py)
            invalid = raw
        else:
            try:
                run_body = RunCreate.model_validate(raw)
            except ValidationError as exc:
                invalid = bodies.invalid_of(exc)
        if invalid is not None:
            RUNS_INGESTED.labels(result="rejected").inc()
            errors = validation_errors(bodies.errors_of(invalid, ("body", "runs", index)))
            problem = _problem(422, InvalidInput.type_, errors=errors)
            results.append(BatchItemPublic(index=index, status=422, result="rejected", problem=problem))
            continue
        errors = _time_errors(app.settings, run_body, f"body/runs/{index}")
        if errors:
            RUNS_INGESTED.labels(result="rejected").inc()
            problem = _problem(422, InvalidInput.type_, errors=errors)
            results.append(BatchItemPublic(index=index, status=422, result="rejected", problem=problem))
            continue
        if not principal.may_access_org(run_body.org):
            RUNS_INGESTED.labels(result="rejected").inc()
            detail = f"token {principal.name!r} may not access org {run_body.org!r}"
            problem = _problem(403, Forbidden.type_, detail=detail)
            results.append(BatchItemPublic(index=index, status=403, result="rejected", problem=problem))
            continue
        try:
            run = await _store(app, uow, run_body)
        except Conflict as exc:
            await uow.rollback()
            RUNS_INGESTED.labels(result="conflict").inc()
            problem = _problem(409, Conflict.type_, detail=exc.detail)
            results.append(BatchItemPublic(index=index, status=409, result="conflict", problem=problem))
            continue
        status = 201 if run.result == "created" else 200
        results.append(BatchItemPublic(index=index, status=status, result=run.result, run=run))
    return RunsBatchPublic(
        created=sum(r.result == "created" for r in results),
        duplicates=sum(r.result == "duplicate" for r in results),
        conflicts=sum(r.result == "conflict" for r in results),
        rejected=sum(r.result == "rejected" for r in results),
        results=results,
    )
