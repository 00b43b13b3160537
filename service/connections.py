"""Connection bounds of ``ci-sizer serve``: no client can hold the server's sockets, memory or file
descriptors (docs/reliability.md, "Connections are bounded").

uvicorn's httptools protocol bounds none of them: a connection that never sends a byte, sends its head a
byte a second or its body a byte a second is kept for ever (the keep-alive timer only runs *between*
requests, and the first byte of a request cancels it); a header line is buffered without limit (httptools
joins its pieces, which also costs time quadratic in its length); and ``limit_concurrency`` only answers
503 *after* a request's head arrived, on a connection it already holds, so a thousand idle sockets still
exhaust the descriptors and the listener stops accepting, ``/healthz`` included.

``BoundedHttpToolsProtocol`` is uvicorn's protocol with those bounds added at its own state changes
(a connection opened, a head complete, a message complete, an answer complete), so that the cost per
request is a few attribute writes and two dictionary operations, and no timer of its own:

- **time**: a connection must deliver a request's head within ``header_timeout`` of opening (or of its
  previous answer), and the request's body within ``body_timeout`` of its head; an answer the client
  does not take (writes paused) for ``body_timeout`` is dropped. One sweep per server, a few times a
  second, closes what is overdue: with ``408`` (problem+json) when part of a request had arrived, else
  silently (an idle connection);
- **head size**: at most ``max_header_bytes`` of request line and headers; past it ``431`` and the
  connection is closed, before httptools buffers more (the bytes are counted before they are parsed);
- **connections**: at most ``max_connections``. A new connection past it first evicts the connection that
  has waited longest on its client (a head or body still coming, or idle between requests): ``503`` with
  ``Retry-After`` when a request was started or none ever completed, a plain close for a kept-alive
  connection between requests (clients retry those). When every connection is inside the app, up to
  ``OVERFLOW`` more are accepted to read their request line: ``/healthz`` and ``/readyz`` are answered,
  anything else gets ``503``; past those, ``503`` at once. A probe is therefore never dropped;
- **descriptors**: at most ``max_connections + OVERFLOW`` connections are open, plus at most ``backlog``
  accepted in one go before the sweep of new connections (the listen queue); ``fds_needed`` adds what the
  process holds besides (``RESERVED_FDS``) and ``ci-sizer serve`` checks ``RLIMIT_NOFILE`` against it
  at start.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

log = logging.getLogger("ci_sizer.connections")

#: Descriptors the process holds besides its client connections: the listener, the event loop, standard
#: streams and logs, the database pools (SQLite: three files per connection, two engines; PostgreSQL:
#: two pools of 8 and the change feed), the body worker's pipes. Measured at 40-70 under load (SQLite
#: and PostgreSQL); the rest is headroom.
RESERVED_FDS = 128

#: Connections accepted past ``max_connections`` while every connection is inside the app, to read their
#: request line: a probe (``PROBES``) is answered, anything else gets 503.
OVERFLOW = 16

#: Paths answered on an overflow connection (liveness and readiness probes).
PROBES = frozenset({b"/healthz", b"/readyz"})

#: How often overdue connections are looked for at most (seconds); the sweep also runs at a quarter of
#: the shortest timeout when that is shorter.
SWEEP_SECONDS = 0.5

#: How often the counts of closed and refused connections are logged, at most (seconds).
LOG_SECONDS = 10.0


@dataclass(frozen=True)
class Bounds:
    max_connections: int = 512
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header_bytes: int = 16 * 1024
    backlog: int = 256

    @classmethod
    def of(cls, settings: Any) -> Bounds:
        return cls(
            max_connections=settings.max_connections,
            header_timeout=settings.header_timeout_seconds,
            body_timeout=settings.body_timeout_seconds,
            max_header_bytes=settings.max_header_bytes,
            backlog=settings.listen_backlog,
        )

    def fds_needed(self) -> int:
        """File descriptors one server process may need at most with these bounds."""
        return self.max_connections + OVERFLOW + self.backlog + 1 + RESERVED_FDS


def _problem(status: int, title: str, detail: str, headers: tuple[bytes, ...] = ()) -> bytes:
    body = orjson.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail})
    head = [
        f"HTTP/1.1 {status} {title}".encode(),
        b"content-type: application/problem+json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
        *headers,
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class Registry:
    """The bounds' state shared by the connections of one server (one per process)."""

    def __init__(self, bounds: Bounds, loop: asyncio.AbstractEventLoop) -> None:
        self.bounds = bounds
        self.loop = loop
        #: connections waiting on their client (a head or a body still coming, or idle between requests),
        #: longest waiting first
        self.waiting: dict[BoundedHttpToolsProtocol, None] = {}
        #: connections whose answer the client does not take (writes paused)
        self.stalled: dict[BoundedHttpToolsProtocol, float] = {}
        #: connections accepted past ``max_connections`` to answer a probe
        self.overflow: set[BoundedHttpToolsProtocol] = set()
        #: connections closed by a bound whose descriptor is not released yet (they still count in uvicorn's set)
        self.closing: set[BoundedHttpToolsProtocol] = set()
        self.tick = min(SWEEP_SECONDS, bounds.header_timeout / 4, bounds.body_timeout / 4)
        self._sweeping: asyncio.TimerHandle | None = None
        self.counts: Counter[str] = Counter()
        self._logged_at = loop.time()
        limit = f"{bounds.max_connections} connections"
        self.refused = _problem(
            503,
            "Service Unavailable",
            f"the server holds its limit of {limit}; retry",
            (b"retry-after: 1",),
        )
        self.timed_out = _problem(408, "Request Timeout", "the request did not arrive in time")
        self.too_large = _problem(
            431,
            "Request Header Fields Too Large",
            f"the request line and headers exceed {bounds.max_header_bytes} bytes",
        )

    def wake(self) -> None:
        if self._sweeping is None:
            self._sweeping = self.loop.call_later(self.tick, self.sweep)

    def sweep(self) -> None:
        """Close every connection past its deadline; again in ``tick`` while any may be."""
        self._sweeping = None
        now = self.loop.time()
        for conn in [c for c in self.waiting if c.deadline <= now]:
            conn.expire()
        for conn in [c for c in self.overflow if c.deadline <= now]:
            conn.expire()
        limit = now - self.bounds.body_timeout
        for conn in [c for c, since in self.stalled.items() if since <= limit]:
            self.counts["answer not taken"] += 1
            conn.drop()
        if self.counts and now - self._logged_at >= LOG_SECONDS:
            self.report(now)
        if self.waiting or self.overflow or self.stalled or self.counts:
            self.wake()

    def report(self, now: float) -> None:
        counts = ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items()))
        log.warning(
            "connections closed or refused in the last %.0f s: %s (bounds: %d connections, head %g s and %d bytes, "
            "body %g s)",
            now - self._logged_at,
            counts,
            self.bounds.max_connections,
            self.bounds.header_timeout,
            self.bounds.max_header_bytes,
            self.bounds.body_timeout,
        )
        self.counts.clear()
        self._logged_at = now

    def admit(self, conn: BoundedHttpToolsProtocol, connections: int) -> str:
        """Make room for a new connection: ``"open"`` (a slot is free, or was freed by evicting the
        connection that waited longest), ``"overflow"`` (read its request line: a probe is answered)
        or ``"refuse"``."""
        if connections - len(self.closing) <= self.bounds.max_connections:
            return "open"
        if self.waiting:
            victim = next(iter(self.waiting))
            self.counts["evicted"] += 1
            victim.evict()
            return "open"
        if len(self.overflow) < OVERFLOW:
            return "overflow"
        return "refuse"


_registries: weakref.WeakKeyDictionary[ServerState, Registry] = weakref.WeakKeyDictionary()

#: ``head_left`` while a head over the limit is parsed up to it (``_head_over``)
_OVER = -1


def _bounds_of(app: Any) -> Bounds:
    """The bounds the served app carries (``ServiceApp.connection_bounds``), through uvicorn's wrappers."""
    for _ in range(8):
        bounds = getattr(app, "connection_bounds", None)
        if isinstance(bounds, Bounds):
            return bounds
        app = getattr(app, "app", None)
        if app is None:
            break
    return Bounds()


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of this module (``http=`` of ``uvicorn.run``)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        registry = _registries.get(server_state)
        if registry is None:
            registry = _registries[server_state] = Registry(_bounds_of(config.loaded_app), self.loop)
        self.registry = registry
        self.deadline = 0.0
        #: bytes of the current request's head still allowed (all of them: nothing of it arrived yet); None
        #: once the head is complete, until the message is
        self.head_left: int | None = registry.bounds.max_header_bytes
        #: whether a request was ever answered on this connection (then it is kept alive between requests)
        self.answered = False
        self.overflowing = False

    # -- the connection's life

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        registry = self.registry
        self.deadline = self.loop.time() + registry.bounds.header_timeout
        verdict = registry.admit(self, len(self.connections))
        if verdict == "refuse":
            registry.counts["refused (503)"] += 1
            self._close_with(registry.refused)
            return
        if verdict == "overflow":
            self.overflowing = True
            registry.overflow.add(self)
        else:
            registry.waiting[self] = None
        registry.wake()

    def connection_lost(self, exc: Exception | None) -> None:
        registry = self.registry
        registry.waiting.pop(self, None)
        registry.stalled.pop(self, None)
        registry.overflow.discard(self)
        registry.closing.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        left = self.head_left
        if left is not None:
            if len(data) > left:
                self._head_over(data, left)
                return
            self.head_left = left - len(data)
        super().data_received(data)

    def _head_over(self, data: bytes, left: int) -> None:
        """More bytes than the head may still have: parse up to the limit; a head that is then still
        incomplete is too large (431), else the rest is parsed as any other bytes (a body, the next
        request)."""
        self.head_left = _OVER
        super().data_received(data[:left])
        if self.transport.is_closing():
            return
        if self.head_left == _OVER:  # no head completed within the limit
            self.registry.counts["head too large (431)"] += 1
            self._close_with(self.registry.too_large)
            return
        self.data_received(data[left:])

    # -- parser callbacks (uvicorn's, plus the bookkeeping)

    def on_headers_complete(self) -> None:
        self.head_left = None
        registry = self.registry
        self.deadline = self.loop.time() + registry.bounds.body_timeout
        if self.overflowing:
            self.registry.overflow.discard(self)
            if self.url.split(b"?", 1)[0] not in PROBES:
                registry.counts["refused (503)"] += 1
                self._close_with(registry.refused)
                return
        super().on_headers_complete()
        if self.overflowing and self.cycle is not None:
            self.cycle.keep_alive = False  # the probe's connection goes with its answer

    def on_body(self, body: bytes) -> None:
        if self.cycle is not None:  # None: a head refused past the bound, whose connection is closing
            super().on_body(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if cycle is None:
            return
        registry = self.registry
        self.head_left = registry.bounds.max_header_bytes
        registry.waiting.pop(self, None)  # the request is the app's now
        if cycle.response_complete:  # answered before its body ended (401, 413, ...): the next may come
            self._between_requests()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # then the next request, already read, goes to the app
        super().on_response_complete()
        self.answered = True
        if not pipelined and self.head_left is not None and not self.transport.is_closing():
            self._between_requests()

    def _between_requests(self) -> None:
        registry = self.registry
        self.deadline = self.loop.time() + registry.bounds.header_timeout
        registry.waiting[self] = None  # not waiting since its message completed: it goes last
        if registry._sweeping is None:
            registry.wake()

    def _started(self) -> bool:
        """Whether part of a request arrived since the connection opened or since its last answer."""
        return self.head_left is None or self.head_left < self.registry.bounds.max_header_bytes

    def pause_writing(self) -> None:
        super().pause_writing()
        self.registry.stalled.setdefault(self, self.loop.time())
        self.registry.wake()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.registry.stalled.pop(self, None)

    # -- closing

    def expire(self) -> None:
        """Past the deadline while waiting on the client: 408 when part of a request had arrived."""
        if self._started() and not self._answering():
            self.registry.counts["timed out (408)"] += 1
            self._close_with(self.registry.timed_out)
        else:
            self.registry.counts["idle closed"] += 1
            self._close_with(None)

    def evict(self) -> None:
        """Make room for a new connection: 503 unless the connection is kept alive between requests."""
        idle_between_requests = self.answered and not self._started()
        self._close_with(None if idle_between_requests or self._answering() else self.registry.refused)

    def drop(self) -> None:
        """The client takes no bytes of its answer: drop what is buffered and the connection."""
        self.registry.stalled.pop(self, None)
        self.registry.closing.add(self)
        self.transport.abort()

    def _answering(self) -> bool:
        return self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete

    def _close_with(self, response: bytes | None) -> None:
        registry = self.registry
        registry.waiting.pop(self, None)
        registry.overflow.discard(self)
        if self.transport.is_closing():
            return
        registry.closing.add(self)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # the app (reading the body) is told the client went away, and sends nothing more
            cycle.disconnected = True
            cycle.message_event.set()
        if response is not None:
            self.transport.write(response)
        self.transport.close()
