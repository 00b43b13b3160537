"""Background analyses (fleet simulations, backtests): created by a POST, run in a thread of the
process that received it, polled by id from any process. The row holds the status, the progress
(written about once a second) and the result; a running analysis whose row has not moved for
``STALE_SECONDS`` lost its process and reads as failed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..models import Analysis, to_rfc3339, utcnow
from ..observability.metrics import ANALYSES, ANALYSES_RUNNING

log = logging.getLogger("ci_sizer.analyses")
STALE_SECONDS = 60
HEARTBEAT_SECONDS = 1.0


class Cancelled(Exception):
    """Raised inside the work's thread when its analysis was cancelled (the service shuts down)."""


Work = Callable[[Callable[[float], None]], dict[str, Any]]
#: reads what the work needs (database reads are async), then returns the work to run in a thread
Prepare = Callable[[], Awaitable[Work]]


async def create(*, engine: AsyncEngine, kind: str, request: dict[str, Any], created_by: str) -> str:
    analysis_id = str(uuid.uuid4())
    async with engine.begin() as conn:
        await conn.execute(
            Analysis.__table__.insert().values(  # type: ignore[attr-defined]
                id=analysis_id,
                kind=kind,
                status="queued",
                progress=0.0,
                request=json.dumps(request),
                created_by=created_by,
                created_at=utcnow(),
                updated_at=utcnow(),
            )
        )
    return analysis_id


async def _set(engine: AsyncEngine, analysis_id: str, **values: Any) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            update(Analysis).where(Analysis.id == analysis_id).values(updated_at=utcnow(), **values)  # type: ignore[arg-type]
        )


async def run(*, engine: AsyncEngine, analysis_id: str, prepare: Prepare, kind: str) -> None:
    """``prepare()``, then its work in a thread, heartbeating the progress; store the result or the error."""
    running = ANALYSES_RUNNING.labels(kind=kind)
    running.inc()
    try:
        result = await _run(engine=engine, analysis_id=analysis_id, prepare=prepare)
    except asyncio.CancelledError:
        ANALYSES.labels(kind=kind, result="interrupted").inc()
        raise
    except Exception:  # its row could not even be written
        ANALYSES.labels(kind=kind, result="failed").inc()
        raise
    finally:
        running.dec()
    ANALYSES.labels(kind=kind, result=result).inc()


async def _run(*, engine: AsyncEngine, analysis_id: str, prepare: Prepare) -> str:
    """``run`` without the metrics: ``done`` or ``failed`` (an interruption raises ``CancelledError``)."""
    latest = [0.0]
    done = threading.Event()

    def progress(fraction: float) -> None:
        if done.is_set():  # cancelled: stop the thread at its next report
            raise Cancelled
        latest[0] = fraction

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            with contextlib.suppress(Exception):
                await _set(engine, analysis_id, progress=round(latest[0], 4))

    await _set(engine, analysis_id, status="running")
    beat = asyncio.create_task(heartbeat())
    try:
        try:
            work = await prepare()
            result = await asyncio.to_thread(work, progress)
        finally:
            # the thread stops at its next report, and no heartbeat lands after the final status
            done.set()
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await _set(engine, analysis_id, status="failed", error="interrupted: the service shut down")
        raise
    except Exception as exc:
        log.exception("analysis %s failed", analysis_id)
        await _set(engine, analysis_id, status="failed", error=f"{type(exc).__name__}: {exc}")
        return "failed"
    await _set(engine, analysis_id, status="done", progress=1.0, result=json.dumps(result))
    return "done"


def start(
    tasks: set[asyncio.Task[None]], *, engine: AsyncEngine, analysis_id: str, prepare: Prepare, kind: str
) -> None:
    """Start ``run`` as a task kept in ``tasks`` (the app's, cancelled at shutdown)."""
    task = asyncio.create_task(run(engine=engine, analysis_id=analysis_id, prepare=prepare, kind=kind))
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def get(*, conn: AsyncConnection, analysis_id: str, kind: str) -> dict[str, Any] | None:
    row = (
        await conn.execute(select(Analysis).where(Analysis.id == analysis_id, Analysis.kind == kind))  # type: ignore[arg-type]
    ).first()
    if row is None:
        return None
    status, error = row.status, row.error
    if status in ("queued", "running") and utcnow() - row.updated_at > timedelta(seconds=STALE_SECONDS):
        status, error = "failed", f"interrupted: no progress for {STALE_SECONDS} s (its process stopped)"
    return {
        "id": row.id,
        "kind": row.kind,
        "status": status,
        "progress": row.progress,
        "created_at": to_rfc3339(row.created_at),
        "updated_at": to_rfc3339(row.updated_at),
        "created_by": row.created_by,
        "request": json.loads(row.request),
        "result": None if row.result is None else json.loads(row.result),
        "error": error,
    }
