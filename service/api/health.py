"""Liveness, readiness and build information."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from .. import __version__, core
from ..db import within
from ..errors import Unavailable, problem_responses

router = APIRouter(tags=["health"])
#: /readyz answers within this, whatever the database does
READY_TIMEOUT_SECONDS = 1.0


class Health(BaseModel):
    status: str


class Info(BaseModel):
    name: str
    version: str
    core_backend: str
    database: str
    cpu_sizing_mode: str
    memory_qos: str
    max_memory_bytes: int | None
    auth: str


@router.get("/healthz", response_model=Health)
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", response_model=Health, responses=problem_responses(Unavailable))
async def readyz(request: Request) -> dict[str, str]:
    """The database answers, within one second (a database that hangs is not ready)."""
    engine: AsyncEngine = request.app.state.engine

    async def ping() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    try:
        await within(READY_TIMEOUT_SECONDS, ping())
    except Exception as exc:  # any failure to reach the database means "not ready"
        raise Unavailable(f"database not ready: {type(exc).__name__}", headers={"Retry-After": "2"}) from None
    return {"status": "ready"}


@router.get("/api/v1/info", response_model=Info, tags=["info"])
async def info(request: Request) -> dict[str, Any]:
    """Version, the live core backend and the sizing policy."""
    settings = request.app.state.settings
    return {
        "name": "ci-sizer",
        "version": __version__,
        "core_backend": core.BACKEND,
        "database": "sqlite" if settings.is_sqlite else "postgresql",
        "cpu_sizing_mode": settings.cpu_sizing_mode,
        "memory_qos": settings.memory_qos,
        "max_memory_bytes": settings.max_memory,
        "auth": "tokens" if request.app.state.tokens.enabled else "anonymous",
    }
