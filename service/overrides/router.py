"""Operator overrides (rules O1-O6): list, and GET/PUT/DELETE at each of the four scopes."""

from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from service import changes
from service.auth import AdminPrincipal, AuthenticatedRoute, ReadPrincipal
from service.cache import AnswerCache
from service.db import UnitOfWork, UnitOfWorkDep, WriteUnitOfWorkDep
from service.deps import AnswersDep, EngineDep, SummariesDep
from service.errors import (
    BadRequest,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    Unauthorized,
    problem_responses,
)
from service.jobs import risk
from service.jobs.summaries import SummaryRefresher
from service.keys import Scope, ScopeKey
from service.overrides import service as overrides_service
from service.overrides.schemas import OverrideCheckPublic, check_public
from service.overrides.service import ListFilter, Pins
from service.paths import job_key, org_key, repo_key, workflow_key
from service.quantity import QuantityError, format_cpu, format_memory, parse_cpu_millicores, parse_memory_bytes
from service.tables import Override
from service.wire import MAX_CPU_MILLICORES, MAX_MEMORY_BYTES, Timestamp, to_naive_utc, to_rfc3339, utcnow

router = APIRouter(prefix="/api/v1/sizing/overrides", tags=["overrides"], route_class=AuthenticatedRoute)


class OverridePut(BaseModel):
    """The body of a PUT: quantities as strings, ``null`` = not pinned (rule O1)."""

    model_config = ConfigDict(extra="forbid")

    cpu_request: str | None = Field(default=None, max_length=64, examples=["500m"])
    cpu_limit: str | None = Field(default=None, max_length=64, examples=["2"])
    memory_request: str | None = Field(default=None, max_length=64, examples=["1Gi"])
    memory_limit: str | None = Field(default=None, max_length=64, examples=["8Gi"])
    reason: str | None = Field(default=None, max_length=2000)
    expires_at: Timestamp | None = None
    sizing_policy: Literal["seed", "efficient", "growth"] | None = Field(
        default=None, description="the sizing policy at this scope; null inherits from the scope above"
    )

    @field_validator("expires_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else to_naive_utc(value)


class OverridePublic(BaseModel):
    scope: Scope
    org: str
    repo: str | None
    workflow: str | None
    job: str | None
    cpu_request: str | None
    cpu_request_millicores: int | None
    cpu_limit: str | None
    cpu_limit_millicores: int | None
    memory_request: str | None
    memory_request_bytes: int | None
    memory_limit: str | None
    memory_limit_bytes: int | None
    sizing_policy: Literal["seed", "efficient", "growth"] | None
    reason: str | None
    expires_at: str | None
    expired: bool
    created_at: str
    updated_at: str
    updated_by: str
    etag: str


class OverridesPublic(BaseModel):
    items: list[OverridePublic]
    next_cursor: str | None


def to_public(o: Override) -> OverridePublic:
    def q(value: int | None, fmt: Callable[[int], str]) -> str | None:
        return None if value is None else fmt(value)

    return OverridePublic(
        scope=o.scope,
        org=o.org,
        repo=o.repo or None,
        workflow=o.workflow or None,
        job=o.job or None,
        cpu_request=q(o.cpu_request_millicores, format_cpu),
        cpu_request_millicores=o.cpu_request_millicores,
        cpu_limit=q(o.cpu_limit_millicores, format_cpu),
        cpu_limit_millicores=o.cpu_limit_millicores,
        memory_request=q(o.memory_request_bytes, format_memory),
        memory_request_bytes=o.memory_request_bytes,
        memory_limit=q(o.memory_limit_bytes, format_memory),
        memory_limit_bytes=o.memory_limit_bytes,
        sizing_policy=o.sizing_policy,
        reason=o.reason,
        expires_at=to_rfc3339(o.expires_at),
        expired=overrides_service.is_expired(o),
        created_at=to_rfc3339(o.created_at) or "",
        updated_at=to_rfc3339(o.updated_at) or "",
        updated_by=o.updated_by,
        etag=overrides_service.etag(o),
    )


#: the least a memory value may be pinned at: the floors of the computed values (rules S10, S12); below
#: them a pin is almost always a unit left out ("500" is 500 bytes), and no build runs in it
MEMORY_FLOORS = {"memory_request": (32 << 20, "32Mi", "S10"), "memory_limit": (128 << 20, "128Mi", "S12")}


def pins_of(body: OverridePut) -> Pins:
    """Rule O1: quantities parse, are > 0, at least one is pinned, request <= limit in the body;
    and an expiry, when given, is in the future (an override that is expired when written would
    be stored and listed, but never applied). A memory pin below the floor of the computed value
    (``MEMORY_FLOORS``) is refused too."""
    errors: list[dict[str, str]] = []
    values: dict[str, int | None] = {}
    for name, parse, maximum in (
        ("cpu_request", parse_cpu_millicores, MAX_CPU_MILLICORES),
        ("cpu_limit", parse_cpu_millicores, MAX_CPU_MILLICORES),
        ("memory_request", parse_memory_bytes, MAX_MEMORY_BYTES),
        ("memory_limit", parse_memory_bytes, MAX_MEMORY_BYTES),
    ):
        text = getattr(body, name)
        values[name] = None
        if text is None:
            continue
        try:
            parsed = parse(text)
        except QuantityError as exc:
            errors.append({"field": f"body/{name}", "message": str(exc)})
            continue
        floor = MEMORY_FLOORS.get(name)
        if parsed <= 0:
            errors.append({"field": f"body/{name}", "message": "must be greater than zero"})
        elif parsed > maximum:
            errors.append({"field": f"body/{name}", "message": "is larger than any node"})
        elif floor is not None and parsed < floor[0]:
            hint = f"; a bare number is bytes: did you mean {text.strip()}Mi?" if text.strip().isdigit() else ""
            errors.append(
                {
                    "field": f"body/{name}",
                    "message": f"{text!r} is {parsed:,} bytes, below {floor[1]}, the least a {name.replace('_', ' ')} "
                    f"is given (rule {floor[2]}){hint}",
                }
            )
        else:
            values[name] = parsed
    if body.expires_at is not None and body.expires_at <= utcnow():
        errors.append({"field": "body/expires_at", "message": "must be in the future"})
    if not errors:
        if all(v is None for v in values.values()) and body.sizing_policy is None:
            errors.append(
                {
                    "field": "body",
                    "message": "pin at least one of cpu_request, cpu_limit, memory_request, memory_limit, "
                    "sizing_policy",
                }
            )
        for kind in ("cpu", "memory"):
            req, lim = values[f"{kind}_request"], values[f"{kind}_limit"]
            if req is not None and lim is not None and req > lim:
                errors.append(
                    {
                        "field": f"body/{kind}_request",
                        "message": f"{kind}_request must not exceed {kind}_limit",
                    }
                )
    if errors:
        raise InvalidInput(
            "invalid override: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors), errors=errors
        )
    return Pins(
        cpu_request_millicores=values["cpu_request"],
        cpu_limit_millicores=values["cpu_limit"],
        memory_request_bytes=values["memory_request"],
        memory_limit_bytes=values["memory_limit"],
        reason=body.reason,
        expires_at=body.expires_at,
        sizing_policy=body.sizing_policy,
    )


@router.get(
    "",
    response_model=OverridesPublic,
    responses=problem_responses(InvalidInput, Unauthorized, Forbidden),
)
async def list_overrides(
    request: Request,
    response: Response,
    uow: UnitOfWorkDep,
    principal: ReadPrincipal,
    org: Annotated[str | None, Query(max_length=200)] = None,
    repo: Annotated[str | None, Query(max_length=200)] = None,
    workflow: Annotated[str | None, Query(max_length=200)] = None,
    job: Annotated[str | None, Query(max_length=200)] = None,
    scope: Scope | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> OverridesPublic:
    """Overrides in a stable order (creation), filtered, a page at a time; ``Link: rel="next"``
    points at the next page. Expired overrides are listed with ``expired: true``."""
    if org is not None:
        principal.ensure_org(org)
    after = overrides_service.decode_cursor(cursor) if cursor else 0
    rows, more = await overrides_service.list_overrides(
        session=uow.session,
        flt=ListFilter(org=org, repo=repo, workflow=workflow, job=job, scope=scope),
        after_id=after,
        limit=limit,
        orgs=principal.orgs,
    )
    next_cursor = None
    if more and rows:
        assert rows[-1].id is not None
        next_cursor = overrides_service.encode_cursor(rows[-1].id)
        params = {k: v for k, v in request.query_params.items() if k != "cursor"}
        params["cursor"] = next_cursor
        response.headers["Link"] = f'<{request.url.path}?{urlencode(params, quote_via=quote)}>; rel="next"'
    return OverridesPublic(items=[to_public(o) for o in rows], next_cursor=next_cursor)


KeyDep = Callable[..., Coroutine[Any, Any, ScopeKey]]
_SCOPE_PATHS: tuple[tuple[str, KeyDep], ...] = (
    ("/{org}", org_key),
    ("/{org}/{repo}", repo_key),
    ("/{org}/{repo}/{workflow}", workflow_key),
    ("/{org}/{repo}/{workflow}/{job}", job_key),
)
Endpoint = Callable[..., Coroutine[Any, Any, Any]]


async def _on_commit(uow: UnitOfWork, answers: AnswerCache, summaries: SummaryRefresher, key: ScopeKey) -> None:
    """Once the override write commits, every cached sizing answer is stale: here at once, and in
    other workers through the change feed (an override can bear on any number of jobs)."""
    await changes.publish(uow.session, None, answers.origin)
    uow.after_commit(answers.invalidate_all)
    uow.after_commit(lambda: summaries.note_scope(key))


def _endpoints(key_dep: KeyDep) -> tuple[Endpoint, Endpoint, Endpoint]:
    Key = Annotated[ScopeKey, Depends(key_dep)]

    async def get_override(
        key: Key,
        response: Response,
        uow: UnitOfWorkDep,
        principal: ReadPrincipal,
    ) -> OverridePublic:
        principal.ensure_org(key.org)
        found = await overrides_service.get(session=uow.session, key=key)
        if found is None:
            raise NotFound(f"no override at {key.scope} scope")
        public = to_public(found)
        response.headers["ETag"] = public.etag
        return public

    async def put_override(
        key: Key,
        body: OverridePut,
        response: Response,
        uow: WriteUnitOfWorkDep,
        engine: EngineDep,
        answers: AnswersDep,
        summaries: SummariesDep,
        principal: AdminPrincipal,
        if_match: Annotated[str | None, Header()] = None,
        if_none_match: Annotated[str | None, Header()] = None,
        dry_run: Annotated[
            bool,
            Query(
                description="check the body and say which jobs the override would put below what they use; "
                "write nothing (preconditions are not checked)"
            ),
        ] = False,
    ) -> OverridePublic | OverrideCheckPublic:
        principal.ensure_org(key.org)
        pins = pins_of(body)
        if dry_run:  # reads on the read engine: the write session is never begun, no lock is taken
            async with engine.connect() as conn:
                jobs, below = await risk.pin_check(conn=conn, key=key, pins=pins)
            return OverrideCheckPublic(scope=key.scope, jobs=jobs, below_use=[check_public(r) for r in below])
        saved, created = await overrides_service.put(
            session=uow.session,
            key=key,
            pins=pins,
            updated_by=principal.name,
            if_match=if_match,
            if_none_match=if_none_match,
        )
        await _on_commit(uow, answers, summaries, key)
        public = to_public(saved)
        response.status_code = 201 if created else 200
        response.headers["ETag"] = public.etag
        return public

    async def delete_override(
        key: Key,
        uow: WriteUnitOfWorkDep,
        answers: AnswersDep,
        summaries: SummariesDep,
        principal: AdminPrincipal,
        if_match: Annotated[str | None, Header()] = None,
    ) -> Response:
        principal.ensure_org(key.org)
        await overrides_service.delete(session=uow.session, key=key, if_match=if_match)
        await _on_commit(uow, answers, summaries, key)
        return Response(status_code=204)

    return get_override, put_override, delete_override


for _path, _dep in _SCOPE_PATHS:
    _scope = _dep.__name__.removesuffix("_key")
    _get, _put, _delete = _endpoints(_dep)
    router.add_api_route(
        _path,
        _get,
        methods=["GET"],
        response_model=OverridePublic,
        operation_id=f"get_override_{_scope}",
        summary=f"Get the {_scope}-scope override",
        responses=problem_responses(InvalidInput, NotFound, Unauthorized, Forbidden),
    )
    router.add_api_route(
        _path,
        _put,
        methods=["PUT"],
        response_model=OverridePublic | OverrideCheckPublic,
        status_code=200,
        operation_id=f"put_override_{_scope}",
        summary=f"Create (201) or replace (200) the {_scope}-scope override; with dry_run=true, check it (200)",
        responses={
            201: {"model": OverridePublic, "description": "created"},
            **problem_responses(BadRequest, InvalidInput, PreconditionFailed, PayloadTooLarge, Unauthorized, Forbidden),
        },
    )
    router.add_api_route(
        _path,
        _delete,
        methods=["DELETE"],
        status_code=204,
        operation_id=f"delete_override_{_scope}",
        summary=f"Remove the {_scope}-scope override",
        responses=problem_responses(InvalidInput, NotFound, PreconditionFailed, Unauthorized, Forbidden),
    )
