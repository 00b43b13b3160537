"""Pure-ASGI middleware: request metrics labelled by route template, ``X-Request-ID`` accepted
or made and echoed, and one structured log line per request (no headers, no bodies, no secrets)."""

from __future__ import annotations

import itertools
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.observability import logs, metrics
from service.observability.metrics import HTTP_REQUESTS

access_log = logging.getLogger("ci_sizer.access")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
UNMATCHED = "<unmatched>"


@dataclass(frozen=True)
class RouteLabel:
    """Stands for a route in ``scope["route"]`` where a request is answered before routing."""

    path: str


def route_template(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


class Observability:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # the label children by route, method and status class, bound once each
        self._counts: dict[tuple[str, str, int], Any] = {}
        self._durations: dict[tuple[str, str], Any] = {}
        # request ids made here: a random prefix per process and a counter (unique across processes)
        self._prefix = uuid.uuid4().hex[:16]
        self._made = itertools.count(1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        incoming = ""
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                incoming = value.decode("latin-1")
                break
        request_id = incoming if _REQUEST_ID.fullmatch(incoming) else f"{self._prefix}{next(self._made):016x}"
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            duration = time.perf_counter() - start
            route = route_template(scope)
            method = scope["method"]
            self._count(route, method, status // 100).inc()
            self._duration(route, method).observe(duration)
            if access_log.isEnabledFor(logging.INFO):
                http = {
                    "method": method,
                    "route": route,
                    "status": status,
                    "duration_ms": round(duration * 1000, 3),
                    "request_id": request_id,
                }
                handler = logs.direct(access_log)
                if handler is not None:  # the service's own configuration: the same line, no record
                    handler.write(
                        logs.json_line(time.time(), "info", access_log.name, "request", {"http": http}) + "\n"
                    )
                else:
                    access_log.info("request", extra={"http": http})

    def _count(self, route: str, method: str, status_class: int) -> Any:
        key = (route, method, status_class)
        child = self._counts.get(key)
        if child is None:
            child = self._counts[key] = HTTP_REQUESTS.labels(
                route=route, method=method, status_class=f"{status_class}xx"
            )
        return child

    def _duration(self, route: str, method: str) -> Any:
        key = (route, method)
        child = self._durations.get(key)
        if child is None:
            # read when first needed: the app's startup gave it the edges of its deadline
            child = self._durations[key] = metrics.HTTP_DURATION.labels(route=route, method=method)
        return child
