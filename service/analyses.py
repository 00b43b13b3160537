"""Background analyses (fleet simulations, backtests): created by a POST, run in the process that
received it, polled by id from any process. The row holds the status, the progress (written about
once a second) and the result; a running analysis whose row has not moved for ``STALE_SECONDS``
lost its process and reads as failed.

They must not starve the build path (sizing, ingest) of the same process. ``Limits`` admits at
most ``MAX_RUNNING`` at once, counted atomically (the check and the count happen with no ``await``
between them, so concurrent POSTs cannot all pass the check before any is counted); their reads
take at most ``DB_SHARE`` pooled connections at a time; and their CPU-heavy part runs in one
worker thread at a lowered OS priority, one analysis after the other, so at most one thread
competes with the event loop for the interpreter."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from fastapi import Response
from pydantic import BaseModel
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.auth import Principal
from service.errors import Forbidden, NotFound, TooManyRequests
from service.observability.metrics import ANALYSES, ANALYSES_RUNNING
from service.tables import Analysis
from service.wire import to_rfc3339, utcnow

log = logging.getLogger("ci_sizer.analyses")
STALE_SECONDS = 60
HEARTBEAT_SECONDS = 1.0
#: analyses one process admits at once; more are refused with 429 rather than queued without bound
MAX_RUNNING = 4
#: pooled connections the analyses' reads may hold at once
DB_SHARE = 2
#: how much lower than the server's the worker thread's scheduling priority is (nice)
NICENESS = 10


def _lower_priority() -> None:
    """In the worker thread: lower this thread's priority (on Linux a thread has its own nice value)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + NICENESS)


class Limits:
    """What the analyses of one app may use; built in the app's lifespan, closed at its end."""

    def __init__(self, max_running: int = MAX_RUNNING, db_share: int = DB_SHARE) -> None:
        self.max_running = max_running
        self.running = 0
        self.reads = asyncio.Semaphore(db_share)
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="ci-sizer-analysis", initializer=_lower_priority
        )

    def try_acquire(self) -> bool:
        """Count one more analysis if there is room. Synchronous: atomic on the event loop."""
        if self.running >= self.max_running:
            return False
        self.running += 1
        return True

    def release(self) -> None:
        self.running -= 1

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


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


async def run(*, engine: AsyncEngine, analysis_id: str, prepare: Prepare, kind: str, limits: Limits) -> None:
    """``prepare()`` (within the analyses' share of the pool), then its work in the analyses'
    thread, heartbeating the progress; store the result or the error."""
    running = ANALYSES_RUNNING.labels(kind=kind)
    running.inc()
    try:
        result = await _run(engine=engine, analysis_id=analysis_id, prepare=prepare, limits=limits)
    except asyncio.CancelledError:
        ANALYSES.labels(kind=kind, result="interrupted").inc()
        raise
    except Exception:  # its row could not even be written
        ANALYSES.labels(kind=kind, result="failed").inc()
        raise
    finally:
        running.dec()
    ANALYSES.labels(kind=kind, result=result).inc()


async def _run(*, engine: AsyncEngine, analysis_id: str, prepare: Prepare, limits: Limits) -> str:
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
            async with limits.reads:
                work = await prepare()
            result = await asyncio.get_running_loop().run_in_executor(limits.executor, work, progress)
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
    tasks: set[asyncio.Task[None]],
    *,
    engine: AsyncEngine,
    analysis_id: str,
    prepare: Prepare,
    kind: str,
    limits: Limits,
) -> None:
    """Start ``run`` as a task kept in ``tasks`` (the app's, cancelled at shutdown); the slot the
    caller took from ``limits`` is given back when the task ends, however it ends."""
    task = asyncio.create_task(run(engine=engine, analysis_id=analysis_id, prepare=prepare, kind=kind, limits=limits))
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    task.add_done_callback(lambda _task: limits.release())


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


def _org_of(request: dict[str, Any]) -> str | None:
    """The org an analysis reads: a backtest's ``org``, a simulation's history org; None: every org."""
    history = request.get("history")
    org = history.get("org") if isinstance(history, dict) else request.get("org")
    return org if isinstance(org, str) else None


def readable(principal: Principal, kind: str, request: dict[str, Any]) -> bool:
    """Whether ``principal`` may read an analysis (``get_readable``'s rule, as a predicate)."""
    org = _org_of(request)
    if org is not None:
        return principal.orgs is None or org in principal.orgs
    return not (kind == "backtest" and principal.orgs is not None)


async def recent(*, conn: AsyncConnection, principal: Principal, limit: int = 20) -> list[dict[str, Any]]:
    """The newest analyses ``principal`` may read, newest first: id, kind, status, who and when,
    and the org each one read (None: every org)."""
    t = Analysis.__table__.c  # type: ignore[attr-defined]
    stmt = (
        select(t.id, t.kind, t.status, t.request, t.created_by, t.created_at, t.updated_at)
        .order_by(t.created_at.desc(), t.id)
        .limit(200)
    )
    out = []
    now = utcnow()
    for row in await conn.execute(stmt):
        request = json.loads(row.request)
        if not readable(principal, row.kind, request):
            continue
        status = row.status
        if status in ("queued", "running") and now - row.updated_at > timedelta(seconds=STALE_SECONDS):
            status = "failed"
        out.append(
            {
                "id": row.id,
                "kind": row.kind,
                "status": status,
                "org": _org_of(request),
                "created_by": row.created_by,
                "created_at": to_rfc3339(row.created_at),
            }
        )
        if len(out) == limit:
            break
    return out


async def get_readable(*, conn: AsyncConnection, analysis_id: str, kind: str, principal: Principal) -> dict[str, Any]:
    """The analysis, if ``principal`` may read it: its org's, or, for a backtest of every org, a
    token bound to no org (``NotFound``, ``Forbidden`` otherwise). The API and the page both ask here."""
    found = await get(conn=conn, analysis_id=analysis_id, kind=kind)
    if found is None:
        raise NotFound(f"no {kind} {analysis_id!r}")
    org = _org_of(found["request"])
    if org is not None:
        principal.ensure_org(org)
    elif kind == "backtest" and principal.orgs is not None:
        raise Forbidden(f"token {principal.name!r} may not read a backtest of every org")
    return found


# --------------------------------------------------------------------------- the routes' side


@dataclass(frozen=True)
class Room:
    """What the routes need to start and read analyses (``deps.AnalysisRoomDep`` builds it)."""

    engine: AsyncEngine  #: reads
    write_engine: AsyncEngine
    limits: Limits
    tasks: set[asyncio.Task[None]]


def _take_room(limits: Limits) -> None:
    """Take one of the process's analysis slots, or answer 429. No ``await`` here: the check and the
    count are one step on the event loop. The slot is given back when the analysis ends, or
    by ``launch`` if it never starts."""
    if not limits.try_acquire():
        raise TooManyRequests(
            f"{limits.max_running} analyses are running in this process; retry later", headers={"Retry-After": "10"}
        )


async def launch(
    room: Room, response: Response, *, kind: str, body: BaseModel, principal: Principal, prepare: Prepare
) -> dict[str, Any]:
    """Store the analysis, start it in this process, answer its row with ``Location``. It
    takes a slot first (429 when there is none); it goes back if the analysis cannot be stored."""
    limits = room.limits
    _take_room(limits)
    engine = room.write_engine
    try:
        analysis_id = await create(
            engine=engine, kind=kind, request=body.model_dump(mode="json"), created_by=principal.name
        )
    except BaseException:
        limits.release()
        raise
    start(
        room.tasks,
        engine=engine,
        analysis_id=analysis_id,
        prepare=prepare,
        kind=kind,
        limits=limits,
    )
    response.headers["Location"] = f"/api/v1/{kind}s/{analysis_id}"
    return await read(room.engine, analysis_id=analysis_id, kind=kind, principal=principal)


async def read(engine: AsyncEngine, *, analysis_id: str, kind: str, principal: Principal) -> dict[str, Any]:
    """``get_readable`` on a connection of the app's read engine."""
    async with engine.connect() as conn:
        return await get_readable(conn=conn, analysis_id=analysis_id, kind=kind, principal=principal)
