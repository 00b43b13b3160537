"""``GET /metrics``: Prometheus text format, open like the health checks."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.observability.metrics import render

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}},
)
async def metrics() -> Response:
    """Prometheus exposition of what the process knows. A scrape never touches the database: the
    gauges read from it (overrides, fleet totals) are refreshed by a background task every
    ``CI_SIZER_FLEET_FLUSH_SECONDS`` (10 s), so a database that is down or hangs never slows or
    fails a scrape, and a scrape never writes."""
    body, content_type = render()
    return Response(body, media_type=content_type)
