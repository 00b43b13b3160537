"""Cached sizing answers served before routing.

A build asks for its job's sizing at every start. When the in-process cache holds a fresh answer
for the exact request, this pure-ASGI middleware sends those bytes without going through routing,
dependency resolution and validation, which cost several times what the answer itself does.

It only answers what it is sure of: ``GET /api/v1/sizing/{org}/{repo}/{workflow}/{job}`` with
canonical query parameters (``format`` and ``containers`` included: a rendered format is rendered
from the cached answer, as the route does), a caller allowed to read that org, and a fresh cache entry. Anything
else (a bad parameter, a missing token, a miss) goes on to the app, which answers as it always
does; a request served here gets the same status, headers and body the route would send.
"""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from service.auth import TokenStore, principal_from
from service.cache import AnswerCache, CacheKey
from service.errors import ServiceError
from service.keys import ScopeKey
from service.observability.metrics import RECOMMENDATIONS, SIZING_CACHE
from service.observability.middleware import RouteLabel
from service.paths import segment
from service.sizing import formats
from service.sizing.params import BUFFER, DEFAULT, RUNS
from service.wire import STAT_NAMES

PREFIX = "/api/v1/sizing/"
ROUTE = PREFIX + "{org}/{repo}/{workflow}/{job}"
_NAMES = ("org", "repo", "workflow", "job")
_PERCENTILES = frozenset(STAT_NAMES)
_CANONICAL_INT = re.compile(r"0|[1-9][0-9]{0,3}")


_FORMATS = frozenset(("json", *formats.RENDERERS))


class Params(NamedTuple):
    key: CacheKey
    output: str
    mapping: formats.Mapping | None


def _params(query: bytes) -> Params | None:
    """The sizing parameters if the query string is in a form the route reads the same way;
    ``None`` for anything else (the route will judge it)."""
    runs, buffer, percentile, output, containers = DEFAULT.runs, DEFAULT.buffer, DEFAULT.cpu_percentile, "json", ""
    if query:
        try:
            pairs = parse_qsl(query.decode("ascii"), keep_blank_values=True, strict_parsing=True)
        except (UnicodeDecodeError, ValueError):
            return None
        seen: set[str] = set()
        for name, value in pairs:
            if name in seen:
                return None
            seen.add(name)
            if name == "cpu_percentile":
                if value not in _PERCENTILES:
                    return None
                percentile = value
            elif name in ("runs", "buffer") and _CANONICAL_INT.fullmatch(value):
                if name == "runs":
                    runs = int(value)
                else:
                    buffer = int(value)
            elif name == "format" and value in _FORMATS:
                output = value
            elif name == "containers":
                containers = value
            else:
                return None
        if not (RUNS.ok(runs) and BUFFER.ok(buffer)):
            return None
    try:
        mapping = formats.parse_containers(containers, output)
    except formats.MappingError:
        return None
    return Params(CacheKey(runs, buffer, percentile), output, mapping)


class CachedSizing:
    def __init__(self, app: ASGIApp, *, cache: AnswerCache, tokens: TokenStore) -> None:
        self.app = app
        self.cache = cache
        self.tokens = tokens
        self.route = RouteLabel(ROUTE)  #: for the request metrics' and logs' route label

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and not scope.get("root_path"):
            found = self._lookup(scope)
            if found is not None:
                media_type, body = found
                scope["route"] = self.route
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [
                            (b"content-length", str(len(body)).encode()),
                            (b"content-type", media_type.encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def _lookup(self, scope: Scope) -> tuple[str, bytes] | None:
        path: str = scope["path"]
        if not path.startswith(PREFIX):
            return None
        parts = path[len(PREFIX) :].split("/")
        if len(parts) != 4 or parts[0] == "overrides":  # overrides routes come first
            return None
        params = _params(scope.get("query_string", b""))
        if params is None:
            return None
        try:
            key = ScopeKey(*(segment(value, name) for value, name in zip(parts, _NAMES, strict=True)))
            if self.tokens.enabled:
                header = ""
                for name, value in scope["headers"]:
                    if name == b"authorization":  # the first one, as the route reads it
                        header = value.decode("latin-1")
                        break
                principal = principal_from(self.tokens, header)
                if "read" not in principal.roles or not principal.may_access_org(key.org):
                    return None
        except ServiceError:
            return None
        hit = self.cache.fresh(key, params.key)
        if hit is None:
            return None
        SIZING_CACHE.labels(result="hit").inc()
        RECOMMENDATIONS.labels(phase=hit.phase, override_scope=hit.override_scope).inc()
        if params.output == "json":
            return "application/json", hit.body
        return formats.render(params.output, hit.answer, params.mapping)
