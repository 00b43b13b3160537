"""``GET /metrics``: Prometheus text format, open like the health checks."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from sqlalchemy import func, select
from sqlmodel import col

from ..models import Override
from ..observability.fleet import FleetTracker, refresh_gauges
from ..observability.metrics import DATABASE_ERRORS, OVERRIDES, render
from ..services.overrides import SCOPES

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}},
)
async def metrics(request: Request) -> Response:
    """Prometheus exposition; gauges read from the database are refreshed first (a database that
    does not answer leaves them as they were and counts an error)."""
    fleet: FleetTracker = request.app.state.fleet
    maker = request.app.state.sessionmaker
    try:
        await fleet.flush(request.app.state.write_sessionmaker)
        async with maker() as session:
            counts = dict(
                (await session.execute(select(col(Override.scope), func.count()).group_by(col(Override.scope)))).all()
            )
            for scope in SCOPES:
                OVERRIDES.labels(scope=scope).set(counts.get(scope, 0))
            await refresh_gauges(session)
    except Exception:  # the scrape still answers with what the process knows
        DATABASE_ERRORS.inc()
    body, content_type = render()
    return Response(body, media_type=content_type)
