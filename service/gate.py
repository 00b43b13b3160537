"""The front's gate (``main.ServiceApp.front``): what is refused before anything reads a request's
input, and the bound on writes other than a run's POST. Pure ASGI, in front of FastAPI."""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth import Role, TokenStore, authorize, principal_from, required_role
from service.db import WRITES, UnitOfWork, finished_within, in_background
from service.errors import (
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    Unavailable,
    UnsupportedMediaType,
    error_response,
    loggable,
    problem_response,
)
from service.observability.metrics import DATABASE_ERRORS, RUNS_INGESTED
from service.paths import API_PREFIX, invalid_input
from service.wire import is_json

log = logging.getLogger("ci_sizer")


class Gate:
    """What the front refuses before anything reads a request's input; nothing it refuses reaches a
    route, and each refusal is problem+json:

    - a path segment or a query value that no database could take (``paths.invalid_input``): 422
      naming the parameter, never a database fault (a request without ``%`` costs nothing there);

    and for request bodies (POST, PUT, PATCH):

    - on the API, with tokens configured: 401 without a valid token, and for a run's POST 403 without
      the ``ingest`` role, before a byte of the body is read or parsed (every API write needs a token);
    - on the API: 415 for a body whose ``Content-Type`` is not JSON (``application/json`` or
      ``application/<x>+json``), or that has none;
    - 413 for a body over ``max_bytes``, counting what is actually sent, not only what
      ``Content-Length`` claims;
    - 503 with ``Retry-After`` for a large body (more than one part) while the ones held already and
      this one would pass ``max_in_flight`` bytes, before it is read: each is held in memory two or
      three times over until it is answered, and ten 10 MB uploads at once would pass the memory
      limit of the Deployment (a body alone is always taken);
    - 408 for a body that does not arrive within ``body_timeout`` seconds (``ci-sizer serve``'s
      protocol closes such a connection too, service/connections.py; this bounds the read under any
      server). The common body, whole in its first message, arms no timer;

    and a write other than a POST (an override's PUT or DELETE) answers 503 at ``write_timeout``
    (``_bounded``)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        *,
        tokens: TokenStore | None = None,
        body_timeout: float = 30.0,
        write_timeout: float = 2.5,
        max_in_flight: int = 64 << 20,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.tokens = tokens if tokens is not None and tokens.enabled else None
        self.body_timeout = body_timeout
        self.write_timeout = write_timeout
        self.max_in_flight = max_in_flight
        #: bytes of large request bodies held now (read, or being read, and not yet answered)
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if b"%" in scope["query_string"] or b"%" in (scope.get("raw_path") or b""):
            found = invalid_input(scope)
            if found is not None:
                # the caller learns first that it is not authenticated or lacks the route's role, as a
                # route tells it (AuthenticatedRoute), and only then what is wrong with its input
                invalid, route = found
                refused = (
                    self._unauthorized(scope, required_role(route.dependant)) if hasattr(route, "dependant") else None
                )
                await error_response(refused or invalid, scope["path"])(scope, _drain, send)
                return
        method = scope["method"]
        if method not in ("POST", "PUT", "PATCH"):
            if method == "DELETE" and scope["path"].startswith(API_PREFIX):
                await self._bounded(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        declared = content_type = None
        authorization = b""
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
            elif name == b"content-type":
                content_type = value
            elif name == b"authorization" and not authorization:
                authorization = value
            elif name == b"transfer-encoding":
                chunked = True
        path: str = scope["path"]
        if path.startswith(API_PREFIX):
            if content_type is None and (chunked or (declared is not None and declared != b"0")):
                content_type = b""  # a body without a media type: not JSON either
            refused = self._refused(path, authorization, content_type)
            if refused is not None:
                await error_response(refused, path)(scope, _drain, send)
                return
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, send)
            return
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body = message.get("body", b"")
        held = 0
        if message.get("more_body", False):  # a body of more than one part: a large one, held in memory
            held = int(declared) if declared is not None and declared.isdigit() else self.max_bytes
            if self.in_flight and self.in_flight + held > self.max_in_flight:
                detail = f"the server holds its limit of {self.max_in_flight} bytes of request bodies; retry"
                await error_response(Unavailable(detail, headers={"Retry-After": "2"}), path)(scope, _drain, send)
                return
            self.in_flight += held
        try:
            await self._forward(scope, receive, send, body, message.get("more_body", False))
        finally:
            self.in_flight -= held

    async def _forward(self, scope: Scope, receive: Receive, send: Send, body: bytes, more: bool) -> None:
        """The rest of the body within the body timeout, then the app with the whole body replayed."""
        path: str = scope["path"]
        if more:
            try:
                async with asyncio.timeout(self.body_timeout):
                    rest = await self._rest(body, receive)
            except TimeoutError:
                detail = f"the request body did not arrive within {self.body_timeout:g}s"
                await error_response(RequestTimeout(detail, headers={"Connection": "close"}), path)(scope, _drain, send)
                return
            if rest is None:
                return
            body = rest
        if len(body) > self.max_bytes:
            await self._reject(scope, send)
            return
        buffered: Message = {"type": "http.request", "body": body, "more_body": False}
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return buffered
            return await receive()

        if scope["method"] == "POST" or not path.startswith(API_PREFIX):
            await self.app(scope, replay, send)
        else:
            await self._bounded(scope, replay, send)

    async def _bounded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An API write other than a POST (an override's PUT or DELETE) within the write timeout: past it,
        503 with ``Retry-After`` at once, the connections of its units of work terminated (the server
        rolls back what did not commit) and the request cancelled, winding down in the background. (A
        run's POST bounds each run's commit itself, ``runs/router.py``; a batch may take longer.)"""
        units: list[UnitOfWork] = []
        scope[WRITES] = units
        started = given_up = False

        async def guarded(message: Message) -> None:
            nonlocal started
            if given_up:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, guarded))
        if (
            await finished_within(task, self.write_timeout) or started
        ):  # answered, or the answer is on its way (the database work is done)
            await task
            return
        given_up = True
        for uow in units:
            uow.terminate()
        task.cancel()
        in_background(task)
        DATABASE_ERRORS.inc()
        log.warning("a write did not finish within %gs: %s", self.write_timeout, loggable(scope["path"]))
        detail = f"the database did not answer the write within {self.write_timeout:g}s; retry"
        await error_response(Unavailable(detail, headers={"Retry-After": "2"}), scope["path"])(scope, _drain, send)

    async def _rest(self, first: bytes, receive: Receive) -> bytes | None:
        """The body from its first part on; None when the client went away. Stops reading past
        ``max_bytes`` (the caller refuses it)."""
        chunks = [first]
        size = len(first)
        while size <= self.max_bytes:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _unauthorized(self, scope: Scope, role: Role | None) -> ServiceError | None:
        """Why the caller may not use a route that needs ``role`` (none: any caller may)."""
        if self.tokens is None or role is None:
            return None
        header = next((v for n, v in scope["headers"] if n == b"authorization"), b"").decode("latin-1")
        try:
            authorize(self.tokens, header, role)
        except ServiceError as exc:
            return exc
        return None

    def _refused(self, path: str, authorization: bytes, content_type: bytes | None) -> ServiceError | None:
        if self.tokens is not None:
            header = authorization.decode("latin-1")
            try:
                if path in INGEST_PATHS:
                    authorize(self.tokens, header, "ingest")
                else:
                    principal_from(self.tokens, header)
            except ServiceError as exc:
                return exc
        if content_type is not None and not is_json(content_type):
            if path in INGEST_PATHS:
                RUNS_INGESTED.labels(result="rejected").inc()
            return UnsupportedMediaType(
                "the request body must be JSON (Content-Type: application/json)",
                errors=[{"field": "header/content-type", "message": "must be application/json"}],
            )
        return None

    async def _reject(self, scope: Scope, send: Send) -> None:
        if scope["path"].startswith("/api/v1/runs"):
            RUNS_INGESTED.labels(result="rejected").inc()
        response = problem_response(
            413,
            detail=f"the request body exceeds {self.max_bytes} bytes",
            type_=PayloadTooLarge.type_,
            instance=scope["path"],
        )
        await response(scope, _drain, send)


#: the paths of a run's POST, whose token needs the ``ingest`` role
INGEST_PATHS = frozenset({"/api/v1/runs", "/api/v1/runs:batch"})


async def _drain() -> Message:
    return {"type": "http.disconnect"}
