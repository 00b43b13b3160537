"""The webhook's pure-ASGI app: ``POST /mutate`` (admission reviews), ``GET /healthz`` and ``GET /metrics``
(its own registry: the webhook's metrics and its process's), all on the one TLS port.

Whatever happens inside a review, the API server gets a well-formed "allowed" answer; a body that is
not a review is a 400 problem+json, which the API server treats as a failed call and, with
``failurePolicy: Ignore``, admits the pod unchanged.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client import generate_latest as _generate_latest
from starlette.types import Receive, Scope, Send

from service.observability.metrics import WEBHOOK_DURATION, WEBHOOK_REQUESTS, WEBHOOK_RESULTS
from service.webhook.review import BadReview, Reviewer

MAX_REVIEW_BYTES = 8 * 1024 * 1024  # a pod is at most etcd's 1.5 MiB object; a review holds it once or twice
log = logging.getLogger("ci_sizer.webhook")
COUNTED = {result: WEBHOOK_REQUESTS.labels(result=result) for result in WEBHOOK_RESULTS}


def registry() -> CollectorRegistry:
    """What ``/metrics`` serves: the webhook's two metrics (every result at 0 from the start) and the
    process's own."""
    out = CollectorRegistry(auto_describe=True)
    out.register(WEBHOOK_REQUESTS)
    out.register(WEBHOOK_DURATION)
    ProcessCollector(registry=out)
    PlatformCollector(registry=out)
    return out


class WebhookApp:
    def __init__(self, reviewer: Reviewer) -> None:
        self.reviewer = reviewer
        self.registry = registry()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if path == "/mutate" and method == "POST":
            await self._mutate(receive, send)
        elif path == "/healthz" and method in ("GET", "HEAD"):
            await _respond(send, 200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/metrics" and method == "GET":
            await _respond(send, 200, _generate_latest(self.registry), CONTENT_TYPE_LATEST)
        else:
            await _problem(send, 404, "no such route: POST /mutate, GET /healthz, GET /metrics")

    async def _mutate(self, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > MAX_REVIEW_BYTES:
                COUNTED["error"].inc()
                await _problem(send, 413, f"the review is over {MAX_REVIEW_BYTES} bytes")
                return
            if not message.get("more_body", False):
                break
        try:
            answer, result = await self.reviewer.review(bytes(body))
        except BadReview as exc:
            result = "error"
            await _problem(send, 400, str(exc))
        except Exception:  # never a pod held up by a bug: allowed, unchanged, and logged
            log.exception("the review failed")
            result = "error"
            await _problem(send, 500, "the review failed; the pod is admitted unchanged (failurePolicy: Ignore)")
        else:
            await _respond(send, 200, orjson.dumps(answer), "application/json")
        COUNTED[result].inc()
        WEBHOOK_DURATION.observe(time.perf_counter() - started)


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _problem(send: Send, status: int, detail: str) -> None:
    doc: dict[str, Any] = {"type": "about:blank", "title": _TITLES.get(status, "Error"), "status": status}
    doc["detail"] = detail
    await _respond(send, status, orjson.dumps(doc), "application/problem+json")


_TITLES = {400: "Bad Request", 404: "Not Found", 413: "Content Too Large", 500: "Internal Server Error"}
