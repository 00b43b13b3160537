"""Pure-ASGI middleware: request metrics labelled by route template, ``X-Request-ID`` accepted
or made and echoed, and one structured log line per request (no headers, no bodies, no secrets)."""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.observability.metrics import HTTP_DURATION, HTTP_REQUESTS

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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        incoming = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming if _REQUEST_ID.fullmatch(incoming) else uuid.uuid4().hex
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
            HTTP_REQUESTS.labels(route=route, method=method, status_class=f"{status // 100}xx").inc()
            HTTP_DURATION.labels(route=route, method=method).observe(duration)
            access_log.info(
                "request",
                extra={
                    "http": {
                        "method": method,
                        "route": route,
                        "status": status,
                        "duration_ms": round(duration * 1000, 3),
                        "request_id": request_id,
                    }
                },
            )
