"""Liveness, readiness and build information."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service import __version__, core
from service.db import within
from service.deps import EngineDep, SettingsDep, TokensDep
from service.errors import Unavailable, problem_responses
from service.observability.metrics import DATABASE_READY

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
    sizing_policy: str
    max_memory_bytes: int | None
    auth: str


@router.get("/healthz", response_model=Health)
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", response_model=Health, responses=problem_responses(Unavailable))
async def readyz(engine: EngineDep) -> dict[str, str]:
    """The database answers, within one second (a database that hangs is not ready)."""
    failure = await check_database(engine, READY_TIMEOUT_SECONDS)
    if failure is not None:
        raise Unavailable(f"database not ready: {failure}", headers={"Retry-After": "2"})
    return {"status": "ready"}


async def check_database(engine: AsyncEngine, timeout: float = 5.0) -> str | None:
    """``None`` when the database answers ``SELECT 1`` within ``timeout``, else the failure's class
    name; sets ``ci_sizer_database_ready`` either way."""

    async def ping() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    try:
        # within(), not asyncio.timeout: the answer comes at the deadline even when the abandoned
        # read on a hung connection takes longer to wind down
        await within(timeout, ping())
    except Exception as exc:  # any failure to reach the database means "not ready"
        DATABASE_READY.set(0)
        return type(exc).__name__
    DATABASE_READY.set(1)
    return None


@router.get("/api/v1/info", response_model=Info, tags=["info"])
async def info(settings: SettingsDep, tokens: TokensDep) -> dict[str, Any]:
    """Version, the live core backend and the sizing policy."""
    return {
        "name": "ci-sizer",
        "version": __version__,
        "core_backend": core.BACKEND,
        "database": "sqlite" if settings.is_sqlite else "postgresql",
        "cpu_sizing_mode": settings.cpu_sizing_mode,
        "memory_qos": settings.memory_qos,
        "sizing_policy": settings.sizing_policy,
        "max_memory_bytes": settings.max_memory,
        "auth": "tokens" if tokens.enabled else "anonymous",
    }
