"""Rule O6: percent-encoded path segments, where ``%2F`` is a ``/`` inside one segment.

ASGI servers hand the app a percent-decoded ``path``, in which ``a%2Fb`` has already become two
segments. This pure-ASGI middleware rebuilds ``path`` from ``raw_path`` for the API so that each
segment is decoded except for ``/`` and ``%``, which stay escaped (``%2F``, ``%25``); routes then
match one segment per name and ``segment()`` finishes the decoding.

Percent-escapes that are not UTF-8 (``%FF``) are decoded with ``surrogateescape``: the lone
surrogates they become make ``segment()`` answer 422 naming the segment, where the server's own
decoding would have stored U+FFFD in their place.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qsl, unquote

from fastapi import Depends, Path
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import InvalidInput
from service.keys import ScopeKey
from service.wire import NAME_MAX, name_problem, text_problem

API_PREFIX = "/api/"


def _keep_slash(segment: str) -> str:
    return unquote(segment, errors="surrogateescape").replace("%", "%25").replace("/", "%2F")


class RawPathSegments:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path")
            path: str = scope["path"]
            if raw and path.startswith(API_PREFIX) and b"%" in raw:
                raw_str = raw.decode("latin-1").split("?", 1)[0]
                scope = dict(scope, path="/".join(_keep_slash(s) for s in raw_str.split("/")))
        await self.app(scope, receive, send)


def segment(value: str, name: str) -> str:
    """Finish decoding one path segment (``%2F`` -> ``/``, ``%25`` -> ``%``) and check it (rule I3)."""
    decoded = unquote(value, errors="surrogateescape")
    problem = None
    if not decoded or len(decoded) > NAME_MAX:
        problem = f"must be 1 to {NAME_MAX} characters once decoded"
    else:
        problem = name_problem(decoded)
    if problem is not None:
        raise segment_error(name, problem)
    return decoded


def segment_error(name: str | None, problem: str) -> InvalidInput:
    if name is None:
        return InvalidInput(f"a path segment {problem}", errors=[{"field": "path", "message": problem}])
    return InvalidInput(f"path segment {name!r} {problem}", errors=[{"field": f"path/{name}", "message": problem}])


def invalid_input(scope: Scope) -> tuple[InvalidInput, Any] | None:
    """Why a request's path or query cannot be served, before anything reads the database with it, and
    the route that would have served it: a path segment that is no name (rule I3: control,
    bidirectional and invisible characters, undecodable bytes), or a query value with a control
    character or undecodable bytes (PostgreSQL cannot store a NUL, and neither database a lone
    surrogate). The error names the route's parameter. None when the input is fine, and when no route
    takes the request (the app answers 404 or 405 without reading anything). Such characters only
    arrive percent-encoded, so a request without ``%`` costs nothing here."""
    raw = scope.get("raw_path") or b""
    bad_part: str | None = None
    problem: str | None = None
    if b"%" in raw:
        # the API's path is rebuilt (RawPathSegments), with ``/`` and ``%`` still escaped; elsewhere the
        # server's own decoding: either way a segment holds every other decoded character
        for part in scope["path"].split("/"):
            decoded = unquote(part, errors="surrogateescape") if "%" in part else part
            problem = name_problem(decoded) if decoded else None
            if problem is not None:
                bad_part = part
                break
    query: bytes = scope.get("query_string") or b""
    bad_key: str | None = None
    if problem is None and b"%" in query:
        for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True, errors="surrogateescape"):
            problem = text_problem(key) or text_problem(value)
            if problem is not None:
                bad_key = key.encode("utf-8", "backslashreplace").decode()
                break
    if problem is None:
        return None
    route, params = _route(scope)
    if route is None:
        return None
    if bad_key is not None:
        error = InvalidInput(
            f"query parameter {bad_key!r} {problem}", errors=[{"field": f"query/{bad_key}", "message": problem}]
        )
        return error, route
    name = next((str(n) for n, value in params.items() if value == bad_part), None)
    return segment_error(name, problem), route


def _route(scope: Scope) -> tuple[Any, dict[str, Any]]:
    """The route that takes this request (path and method) and its path parameters, or (None, {})."""
    from starlette.routing import Match

    from service.errors import flat_routes

    router = getattr(scope.get("app"), "router", None)
    if router is not None:
        for route in flat_routes(router.routes):
            match, child = route.matches(scope)
            if match == Match.FULL:
                return route, child.get("path_params", {})
    return None, {}


Org = Annotated[str, Path(description="percent-encoded; %2F stands for a '/' inside the name")]
Repo = Org
Workflow = Org
JobName = Org


async def org_key(org: Org) -> ScopeKey:
    return ScopeKey(segment(org, "org"))


async def repo_key(org: Org, repo: Repo) -> ScopeKey:
    return ScopeKey(segment(org, "org"), segment(repo, "repo"))


async def workflow_key(org: Org, repo: Repo, workflow: Workflow) -> ScopeKey:
    return ScopeKey(segment(org, "org"), segment(repo, "repo"), segment(workflow, "workflow"))


async def job_key(org: Org, repo: Repo, workflow: Workflow, job: JobName) -> ScopeKey:
    return ScopeKey(
        segment(org, "org"),
        segment(repo, "repo"),
        segment(workflow, "workflow"),
        segment(job, "job"),
    )


# the key dependencies are ``async def``: FastAPI would run plain functions in a thread pool, a
# thread hop per request for a few string operations
JobKeyDep = Annotated[ScopeKey, Depends(job_key)]
