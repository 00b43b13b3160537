"""Sizing answers served before routing: cached ones, and on PostgreSQL the misses too.

A build asks for its job's sizing at every start. When the in-process cache holds a fresh answer
for the exact request, this pure-ASGI middleware sends those bytes without going through routing,
dependency resolution and validation, which cost several times what the answer itself does.

It only answers what it is sure of: ``GET /api/v1/sizing/{org}/{repo}/{workflow}/{job}`` with
canonical query parameters (``format``, ``containers`` and ``template_cpu_limit`` included: a
rendered format is rendered from the cached answer, as the route does), a caller allowed to read
that org, and a fresh cache entry. Anything else (a bad parameter, a missing token, a miss) goes on
to the app, which answers as it always does; a request served here gets the same status, headers
and body the route would send.

On PostgreSQL (the lifespan sets ``app.state.pgpool``, a lean asyncpg pool) a miss is answered here
as well: one statement (``sizing/pgread.py``) within the sizing deadline, the same ``compute`` and
core, the answer cached under a ticket as the route caches it, and on a database fault or past the
deadline the degraded answer (200, ``CI-Sizer-Degraded: true``). On SQLite (the lifespan sets
``app.state.sqlite_reads``) a miss is answered here the same way, every policy included: read on the
event loop with a read-only connection of its own, or on a thread when that read would wait for a lock
or runs past its budget (``sizing/inline.py``, ``sizing/sqliteread.py``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from service.auth import TokenStore, principal_from
from service.cache import AnswerCache, CacheKey, Entry
from service.db import DB_FAULTS
from service.errors import ServiceError
from service.keys import ScopeKey
from service.observability.metrics import CACHE_HIT, CACHE_MISS, DATABASE_ERRORS, DEGRADED_ANSWERS, RECOMMENDED
from service.observability.middleware import RouteLabel
from service.paths import segment
from service.pgpool import Pool, PoolClosed
from service.sizing import formats, pgread
from service.sizing import service as sizing_service
from service.sizing.fit import TemplateCpu
from service.sizing.params import BUFFER, DEFAULT, RUNS, SizingParams
from service.sizing.service import Policy, Recommendation
from service.sizing.state import StateRepair
from service.wire import STAT_NAMES

PREFIX = "/api/v1/sizing/"
ROUTE = PREFIX + "{org}/{repo}/{workflow}/{job}"
_NAMES = ("org", "repo", "workflow", "job")
_PERCENTILES = frozenset(STAT_NAMES)
_CANONICAL_INT = re.compile(r"0|[1-9][0-9]{0,3}")


_FORMATS = frozenset(("json", *formats.RENDERERS))
_DEGRADED = formats.DEGRADED_HEADER.lower().encode()
log = logging.getLogger("ci_sizer.sizing")
#: what makes a miss answer degraded: the database's faults, the pool closing under a request, and
#: the raw sqlite3 connection's errors (a locked or broken database; SQLAlchemy wraps them on the route)
_FAULTS: tuple[type[Exception], ...] = (*DB_FAULTS, PoolClosed, sqlite3.Error)


class Params(NamedTuple):
    key: CacheKey
    output: str
    mapping: formats.Mapping | None
    limits: TemplateCpu | None = None


#: the queries parsed so far (builds ask with a handful of them), bounded
_PARSED: dict[bytes, Params | None] = {}
_PARSED_MAX = 1024


def _params(query: bytes) -> Params | None:
    """``_parse(query)``, remembered."""
    try:
        return _PARSED[query]
    except KeyError:
        pass
    found = _parse(query)
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    _PARSED[query] = found
    return found


def _parse(query: bytes) -> Params | None:
    """The sizing parameters if the query string is in a form the route reads the same way;
    ``None`` for anything else (the route will judge it)."""
    runs, buffer, percentile, output, containers = DEFAULT.runs, DEFAULT.buffer, DEFAULT.cpu_percentile, "json", ""
    template_cpu = ""
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
            elif name == "template_cpu_limit":
                template_cpu = value
            else:
                return None
        if not (RUNS.ok(runs) and BUFFER.ok(buffer)):
            return None
    try:
        mapping = formats.parse_containers(containers, output)
        limits = formats.parse_template_cpu_limit(template_cpu, output)
    except formats.MappingError:
        return None
    return Params(CacheKey(runs, buffer, percentile), output, mapping, limits)


class CachedSizing:
    def __init__(self, app: ASGIApp, *, cache: AnswerCache, tokens: TokenStore, state: Any = None) -> None:
        self.app = app
        self.cache = cache
        self.tokens = tokens
        #: the app's state: on PostgreSQL its ``pgpool`` (set by the lifespan) answers misses here too
        self.state = state
        self.route = RouteLabel(ROUTE)  #: for the request metrics' and logs' route label
        self._policy: Policy | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and not scope.get("root_path"):
            request = self._request(scope)
            if request is not None:
                key, params = request
                found = self._hit(key, params)
                if found is None:
                    state = self.state
                    if state is not None and (
                        getattr(state, "pgpool", None) is not None or getattr(state, "sqlite_reads", None) is not None
                    ):
                        found = await self._miss(key, params)
                if found is not None:
                    media_type, body, degraded = found
                    scope["route"] = self.route
                    headers = [(b"content-length", str(len(body)).encode()), (b"content-type", media_type.encode())]
                    if degraded:
                        headers.append((_DEGRADED, b"true"))
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)

    def _request(self, scope: Scope) -> tuple[ScopeKey, Params] | None:
        """The job and parameters of a sizing request this path may answer, else None."""
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
        return key, params

    def _hit(self, key: ScopeKey, params: Params) -> tuple[str, bytes, bool] | None:
        hit = self.cache.fresh(key, params.key)
        if hit is None:
            return None
        CACHE_HIT.inc()
        RECOMMENDED[hit.phase, hit.override_scope].inc()
        if params.output == "json":
            return "application/json", hit.body, False
        return (*hit.rendered(params.output, params.mapping, params.limits), False)

    async def _miss(self, key: ScopeKey, params: Params) -> tuple[str, bytes, bool] | None:
        """A cache miss: on PostgreSQL the answer read with one statement through the lean pool
        (``sizing/pgread.py``), on SQLite on the loop or a reading thread (``sizing/inline.py``),
        within the sizing deadline, computed by the same ``compute``, cached; on a database fault or past the deadline the degraded answer (fail-open, 200), as the
        route answers it. None (the route answers) on PostgreSQL when the job is sized by the
        ``efficient`` policy."""
        state = self.state
        settings = state.settings
        policy = self._policy
        if policy is None:  # the settings and ceilings are the app's for its life
            policy = self._policy = Policy.of(settings, state.ceilings)
        ticket = self.cache.ticket(key)
        deadline = settings.sizing_deadline_ms / 1000
        pool: Pool | None = state.pgpool
        try:
            if pool is not None:
                # the deadline inline, not ``db.within``'s task: on the lean pool a cancelled read gives
                # up at once (the connection is terminated, no round trip), so nothing waits past it
                async with asyncio.timeout(deadline):
                    rec = await _read(pool, key, params.key, policy, state.state_repair)
            else:
                # read inline on the loop (bounded by its own budget, never waiting for a lock), else
                # on a thread within what is left of the deadline, as the route (sizing/inline.py)
                rec = await state.sqlite_reads.recommend(key=key, params=params.key, policy=policy, deadline=deadline)
        except _FAULTS as exc:
            CACHE_MISS.inc()
            DEGRADED_ANSWERS.inc()
            if not isinstance(exc, TimeoutError):
                DATABASE_ERRORS.inc()
            log.warning("sizing answered degraded: %s", type(exc).__name__)
            last = self.cache.last_served(key, params.key)
            answer = sizing_service.degraded(
                key=key, last=None if last is None else last.answer, params=params.key, policy=policy
            )
            RECOMMENDED[answer.meta.phase, answer.meta.override_scope].inc()
            if params.output == "json":
                return "application/json", orjson.dumps(answer.as_dict()), True
            return (*formats.render(params.output, answer, params.mapping, params.limits), True)
        if rec is None:
            return None
        CACHE_MISS.inc()
        meta = rec.answer.meta
        body = orjson.dumps(rec.answer.as_dict())
        entry = Entry(answer=rec.answer, body=body, fresh_until=rec.fresh_until)
        self.cache.put(key, params.key, ticket, entry)
        RECOMMENDED[meta.phase, meta.override_scope].inc()
        if rec.job_id is not None:
            state.fleet.note(rec.job_id, rec.totals())
        if params.output == "json":
            return "application/json", body, False
        return (*entry.rendered(params.output, params.mapping, params.limits, rec.answer), False)


async def _read(
    pool: Pool, key: ScopeKey, params: SizingParams, policy: Policy, repair: StateRepair
) -> Recommendation | None:
    async with pool.acquire() as conn:
        return await pgread.recommend(conn=conn, key=key, params=params, policy=policy, repair=repair)
