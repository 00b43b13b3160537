"""One error hierarchy, rendered as RFC 9457 ``application/problem+json`` by one set of handlers."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from http import HTTPStatus
from typing import Any, ClassVar

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from service.observability.metrics import DATABASE_ERRORS, RUNS_INGESTED

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger("ci_sizer.errors")


class Problem(BaseModel):
    """The problem+json body (RFC 9457); ``errors`` lists the offending fields of a 422."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None


class ServiceError(Exception):
    """Base of every error the service answers on purpose."""

    status: ClassVar[int] = 500
    type_: ClassVar[str] = "about:blank"

    def __init__(
        self,
        detail: str,
        *,
        errors: Sequence[Mapping[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = [dict(e) for e in errors] if errors is not None else None
        self.headers = dict(headers or {})


class InvalidInput(ServiceError):
    status = 422
    type_ = "https://ci-sizer.dev/problems/invalid-input"


class BadRequest(ServiceError):
    status = 400
    type_ = "about:blank"


class NotFound(ServiceError):
    status = 404
    type_ = "https://ci-sizer.dev/problems/not-found"


class Conflict(ServiceError):
    status = 409
    type_ = "https://ci-sizer.dev/problems/conflict"


class PreconditionFailed(ServiceError):
    status = 412
    type_ = "https://ci-sizer.dev/problems/precondition-failed"


class PayloadTooLarge(ServiceError):
    status = 413
    type_ = "https://ci-sizer.dev/problems/payload-too-large"


class RequestTimeout(ServiceError):
    status = 408
    type_ = "https://ci-sizer.dev/problems/request-timeout"


class HeadersTooLarge(ServiceError):
    """The request line and headers past ``--max-header-bytes``: answered by the connection itself
    (``service/connections.py``), before any route, so every operation may answer it."""

    status = 431
    type_ = "about:blank"


class UnsupportedMediaType(ServiceError):
    status = 415
    type_ = "https://ci-sizer.dev/problems/unsupported-media-type"


class Unauthorized(ServiceError):
    status = 401
    type_ = "https://ci-sizer.dev/problems/unauthorized"


class Forbidden(ServiceError):
    status = 403
    type_ = "https://ci-sizer.dev/problems/forbidden"


class TooManyRequests(ServiceError):
    status = 429
    type_ = "https://ci-sizer.dev/problems/too-many-requests"


class Unavailable(ServiceError):
    status = 503
    type_ = "https://ci-sizer.dev/problems/unavailable"


def problem_response(
    status: int,
    *,
    detail: str | None = None,
    type_: str = "about:blank",
    instance: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    body: dict[str, Any] = {
        "type": type_,
        "title": HTTPStatus(status).phrase,
        "status": status,
    }
    if detail is not None:
        body["detail"] = detail
    if instance is not None:
        body["instance"] = instance
    if errors is not None:
        body["errors"] = errors
    try:
        content = orjson.dumps(body)
    except TypeError:  # a lone surrogate: undecodable bytes in the path, a "\ud800" escape in a JSON key
        content = json.dumps(body).encode()  # escapes it as \udcXX: still valid JSON
    return Response(
        content,
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=dict(headers or {}),
    )


def error_response(exc: ServiceError, instance: str) -> Response:
    """The problem+json answer of a ``ServiceError`` (the handler's, and the front's before routing)."""
    return problem_response(
        exc.status, detail=exc.detail, type_=exc.type_, instance=instance, errors=exc.errors, headers=exc.headers
    )


def loggable(text: str) -> str:
    """``text`` with lone surrogates (undecodable bytes in a path) escaped: a JSON log line cannot hold them."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode()


def problem_responses(*errors: type[ServiceError]) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entry of a route for the errors it declares."""
    out: dict[int | str, dict[str, Any]] = {}
    for err in errors:
        out[err.status] = {
            "model": Problem,
            "content": {PROBLEM_JSON: {}},
            "description": HTTPStatus(err.status).phrase,
        }
    return out


#: Tags of the discriminated unions in request bodies: pydantic puts the member's tag into ``loc``,
#: but the wire has no such level, so pointers leave it out. A stage item's tags follow its list
#: index (they are also field names, so only there); a placement profile's are unique.
ITEM_TAGS = frozenset({"step", "parallel", "group"})
UNION_TAGS = frozenset({"profile-name", "profile-scorers"})


def _is_tag(loc: Sequence[int | str], i: int) -> bool:
    p = loc[i]
    return p in UNION_TAGS or (p in ITEM_TAGS and i > 0 and isinstance(loc[i - 1], int))


def _pointer(loc: Sequence[int | str]) -> str:
    parts = [str(p) for i, p in enumerate(loc) if not _is_tag(loc, i)]
    if parts and parts[0] in ("body", "query", "path", "header"):
        where, rest = parts[0], parts[1:]
    else:
        where, rest = "body", parts
    return where + ("/" + "/".join(rest) if rest else "")


def validation_errors(raw: Sequence[Any]) -> list[dict[str, Any]]:
    """pydantic/FastAPI errors as ``{"field": "body/containers/0/name", "message": ...}``."""
    out = []
    for err in raw:
        out.append(
            {
                "field": _pointer(err.get("loc", ())),
                "message": str(err.get("msg", "invalid")).removeprefix("Value error, "),
            }
        )
    return out


def flat_routes(routes: Sequence[Any]) -> Iterator[Any]:
    for route in routes:
        inner = getattr(route, "original_router", None)  # FastAPI keeps included routers wrapped
        if inner is not None:
            yield from flat_routes(inner.routes)
        else:
            yield route


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (several routes may share one path)."""
    from starlette.routing import Match

    methods: set[str] = set()
    for route in flat_routes(request.app.router.routes):
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    async def on_service_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceError)
        if isinstance(exc, Conflict) and request.url.path == "/api/v1/runs":
            RUNS_INGESTED.labels(result="conflict").inc()
        return error_response(exc, request.url.path)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = validation_errors(exc.errors())
        if request.url.path.startswith("/api/v1/runs"):
            RUNS_INGESTED.labels(result="rejected").inc()
        fields = ", ".join(e["field"] for e in errors[:5])
        return problem_response(
            422,
            detail=f"invalid input: {fields}",
            type_=InvalidInput.type_,
            instance=request.url.path,
            errors=errors,
        )

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
        return problem_response(
            exc.status_code,
            detail=str(exc.detail) if exc.detail else None,
            instance=request.url.path,
            headers=headers,
        )

    async def on_database_error(request: Request, exc: Exception) -> Response:
        # A database that does not answer is a 503 to retry, not a bug; the message may hold
        # connection details, so only the class name is logged.
        DATABASE_ERRORS.inc()
        log.warning("database error on %s: %s", loggable(request.url.path), type(exc).__name__)
        return problem_response(
            503,
            detail="the database is unavailable; retry later",
            type_=Unavailable.type_,
            instance=request.url.path,
            headers={"Retry-After": "2"},
        )

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    from service.db import DB_FAULTS

    for fault in DB_FAULTS:
        app.add_exception_handler(fault, on_database_error)
