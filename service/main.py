"""``create_app(settings)``: the FastAPI app, its lifespan (engines built and disposed there)
and its pure-ASGI middleware."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import multiprocess
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import ASGIApp, Receive, Scope, Send

from service import __version__, analyses, core, shutdown
from service.auth import TokenStore, load_tokens
from service.cache import AnswerCache
from service.changes import ChangeFeed, Notifier
from service.connections import Bounds
from service.db import (
    SESSION_SETTINGS,
    build_engine,
    build_sessionmaker,
    is_local_postgres,
    learn_types,
    redacted,
)
from service.errors import install_error_handlers
from service.gate import Gate
from service.health import check_database
from service.jobs.money import Prices
from service.jobs.summaries import SummaryRefresher
from service.observability import logs
from service.observability.fleet import FleetTracker, flush_and_refresh
from service.observability.metrics import set_build_info, use_sizing_deadline
from service.observability.middleware import Observability
from service.paths import RawPathSegments
from service.pgpool import Pool
from service.routers import APP_RESPONSES, app_routes
from service.runs import bodies
from service.runs.fastpath import FastRuns
from service.runs.retention import Pruner
from service.runs.service import JobIds
from service.settings import Settings, get_settings, is_loopback
from service.sizing import ceilings, inline, pgread
from service.sizing.fastpath import CachedSizing
from service.sizing.service import Policy
from service.sizing.state import StateRepair

log = logging.getLogger("ci_sizer")


class ExposureError(RuntimeError):
    """Refusing to serve without tokens on a non-loopback address."""


def check_exposure(settings: Settings, tokens: TokenStore) -> None:
    if not tokens.enabled and not is_loopback(settings.host) and not settings.allow_anonymous:
        raise ExposureError(
            f"no tokens are configured (CI_SIZER_TOKENS_FILE) and --host {settings.host} is not a loopback "
            "address; configure tokens or pass --allow-anonymous"
        )


def create_app(settings: Settings | None = None, *, owns_process: bool = False) -> FastAPI:
    """The app. ``owns_process``: it is what this process serves (``ci-sizer serve``), so a shutdown
    that overruns its budget ends the process (service/shutdown.py); never for an app in a test."""
    settings = settings or get_settings()
    tokens = load_tokens(settings.tokens_file)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        check_exposure(settings, tokens)
        connect, statement = settings.database_connect_timeout_seconds, settings.database_statement_timeout_seconds
        pool: dict[str, Any] = {} if settings.is_sqlite else {"pool_size": settings.database_pool_size}
        engine = build_engine(settings.database_url, connect_timeout=connect, statement_timeout=statement, **pool)
        write_engine = (
            build_engine(settings.database_url, immediate=True, connect_timeout=connect, statement_timeout=statement)
            if settings.is_sqlite
            else engine
        )
        app.state.engine = engine
        # PostgreSQL: the build path's misses and single-run POSTs go through a lean asyncpg pool
        # (sizing/fastpath.py, runs/fastpath.py); SQLite's POSTs stay on the routes
        app.state.pgpool = None if settings.is_sqlite else lean_pool(settings)
        # SQLite: the build path's misses are read on the loop, else on a thread (sizing/inline.py)
        app.state.sqlite_reads = (
            inline.reads_for(
                settings.database_url, engine, busy_timeout=connect, deadline=settings.sizing_deadline_ms / 1000
            )
            if settings.is_sqlite
            else None
        )
        app.state.sessionmaker = build_sessionmaker(engine)
        app.state.write_sessionmaker = build_sessionmaker(write_engine)
        app.state.write_engine = write_engine
        app.state.analysis_tasks = set()
        app.state.analysis_limits = analyses.Limits()
        app.state.bodies = bodies.Reducer()
        set_build_info(core.BACKEND)
        use_sizing_deadline(settings.sizing_deadline_ms / 1000)  # and the latency histogram's edges
        await _warm_up(engine, app.state.pgpool, app.state.sqlite_reads, settings.database_connect_timeout_seconds)
        # what startup made (modules, the app, its routes: about 120,000 objects) is kept for the
        # process's life; frozen, no collection walks it again (a full one took about 50 ms, a pause
        # of every request in flight)
        _freeze_startup_heap()
        write_maker = app.state.write_sessionmaker
        pruner: Pruner = app.state.pruner
        tasks = [
            asyncio.create_task(
                _periodic(
                    settings.fleet_flush_seconds,
                    lambda: flush_and_refresh(app.state.fleet, write_maker, app.state.sessionmaker),
                    at_start=True,
                ),
                name="fleet totals",
            ),
            asyncio.create_task(
                _periodic(
                    settings.retention_interval_seconds,
                    # PostgreSQL: pruned jobs announced after their commits, by the worker's Notifier
                    lambda: pruner.run_once(
                        write_maker, app.state.answers, notifier=getattr(app.state, "notifier", None)
                    ),
                ),
                name="retention",
            ),
            asyncio.create_task(
                _periodic(
                    settings.jobs_summary_seconds,
                    lambda: app.state.summaries.run_once(engine, Policy.of(settings, app.state.ceilings), write_engine),
                ),
                name="job summaries",
            ),
            asyncio.create_task(
                _periodic(DATABASE_CHECK_SECONDS, lambda: check_database(engine)), name="database check"
            ),
            asyncio.create_task(_periodic(logs.FLUSH_SECONDS, _flush_logs), name="log flush"),
        ]
        if not settings.is_sqlite:
            # every job's build-path state rebuilt where missing, then as reads find them
            repair: StateRepair = app.state.state_repair
            tasks.append(
                asyncio.create_task(
                    _periodic(STATE_REPAIR_SECONDS, lambda: repair.run_once(write_engine), at_start=True),
                    name="state repair",
                )
            )
            app.state.change_feed = ChangeFeed(app.state.answers, settings.database_url)
            tasks.append(asyncio.create_task(app.state.change_feed.run(), name="change feed"))
            # the build path's runs, announced after their commits, many in one notification (issue 38)
            app.state.notifier = Notifier(app.state.pgpool, app.state.answers.origin)
            tasks.append(asyncio.create_task(app.state.notifier.run(), name="change announcements"))
        log.info(
            "ci-sizer %s starting: core backend=%s, database=%s, auth=%s",
            __version__,
            core.BACKEND,
            redacted(settings.database_url),
            f"{len(tokens.entries)} token(s)"
            if tokens.enabled
            else "none (open access; loopback only)"
            if not settings.allow_anonymous
            else "none (open access, --allow-anonymous)",
        )
        try:
            yield
        finally:
            # each step bounded (service/shutdown.py): the pod's grace period holds whatever a task
            # or the database does, and a process of `ci-sizer serve` ends itself past the budget
            if owns_process:
                shutdown.exit_after(shutdown.SHUTDOWN_SECONDS + shutdown.EXIT_SECONDS, logs.flush)
            await shutdown.stop_tasks([*tasks, *app.state.analysis_tasks])
            app.state.analysis_limits.close()
            app.state.bodies.close()

            async def last_writes() -> None:
                notifier: Notifier | None = getattr(app.state, "notifier", None)
                if notifier is not None:  # what the stopped task had not sent yet
                    await notifier.flush()
                await app.state.fleet.flush(write_maker)
                await pruner.run_once(write_maker, app.state.answers, recover=False, notifier=notifier)
                if notifier is not None:  # the last pruning's jobs (nothing sent when there are none)
                    await notifier.flush()

            await shutdown.bounded(last_writes(), shutdown.WRITES_SECONDS, "the last fleet totals and retention pass")
            if app.state.pgpool is not None:
                await shutdown.bounded(
                    app.state.pgpool.close(), shutdown.CLOSE_SECONDS, "closing the build path's pool"
                )
            if app.state.sqlite_reads is not None:
                await shutdown.bounded(
                    app.state.sqlite_reads.close(), shutdown.CLOSE_SECONDS, "closing the build path's SQLite reads"
                )
            await shutdown.bounded(_dispose(engine, write_engine), shutdown.CLOSE_SECONDS, "closing the engines' pools")
            logs.flush()
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                # this worker's live gauges (feed, readiness, backlog) leave the aggregate with it
                multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]

    app = ServiceApp(
        title="ci-sizer",
        version=__version__,
        description="Right-sizes Kubernetes requests and limits for CI jobs from the runs they actually made.",
        lifespan=lifespan,
        # every operation: the connection answers 431 before routing (service/connections.py)
        responses=APP_RESPONSES,
    )
    app.state.settings = settings
    app.state.tokens = tokens
    app.connection_bounds = Bounds.of(settings)
    app.state.fleet = FleetTracker(Prices.of(settings))
    app.state.pruner = Pruner(settings.retention_runs)
    # a job under a steady stream of runs is summarised at most every 30 s (the jobs list, not the build path)
    app.state.summaries = SummaryRefresher(min_interval=max(settings.jobs_summary_seconds, SUMMARY_MIN_INTERVAL))
    app.state.job_ids = JobIds()
    app.state.state_repair = StateRepair()
    app.state.ceilings = ceilings.load(settings.runner_ceilings_file)
    # on SQLite no change feed reaches other workers: with several, answers are fresh for a short TTL
    shared_sqlite = settings.is_sqlite and settings.workers > 1
    app.state.answers = AnswerCache(
        settings.sizing_cache_entries, ttl_seconds=settings.sizing_cache_ttl_seconds if shared_sqlite else None
    )
    install_error_handlers(app)
    app.router.routes.extend(app_routes())  # built once per process (service/routers.py)
    # path segments rebuilt first, then metrics and logs (they see 413s too), then the build path
    inner = functools.partial(FastAPI.__call__, app)
    sizing = CachedSizing(inner, cache=app.state.answers, tokens=tokens, state=app.state)
    runs = FastRuns(sizing, tokens=tokens, state=app.state)
    gate = Gate(
        runs,
        settings.max_body_bytes,
        tokens=tokens,
        body_timeout=settings.body_timeout_seconds,
        write_timeout=settings.write_timeout,
        max_in_flight=settings.max_body_bytes_in_flight,
    )
    app.front = RawPathSegments(Observability(gate))
    return app


class ServiceApp(FastAPI):
    """The FastAPI app behind the service's own pure-ASGI front (``front``): every HTTP request goes
    through it first, and what it does not answer itself (the build path's GET sizing and POST run,
    ``sizing/fastpath.py`` and ``runs/fastpath.py``) goes on to FastAPI. In front of FastAPI's own
    middleware, not inside it: its per-request layers (error, telemetry and body-limit wrappers, the
    OpenTelemetry check) cost the build path about a tenth of its CPU, and add nothing to what the
    front answers: no OpenTelemetry is configured (metrics are Prometheus'), and an unexpected error
    is the same plain 500 from uvicorn as from FastAPI's error middleware."""

    front: ASGIApp | None = None
    #: what ``ci-sizer serve``'s protocol bounds (service/connections.py reads it from the app it serves)
    connection_bounds: Bounds | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is not None and scope["type"] == "http":
            scope["app"] = self
            await self.front(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def lean_pool(settings: Settings) -> Pool:
    """The build path's asyncpg pool, with the engine's bounds and session settings (no TLS probe on a
    local server, one generic plan per prepared statement)."""
    # no client-side command_timeout: asyncpg would arm and cancel a timer per statement, and both
    # fast paths bound each statement with their own deadline; the server's statement_timeout still
    # ends a statement nobody waits for any more
    timeout_ms = str(int(settings.database_statement_timeout_seconds * 1000))
    kwargs: dict[str, Any] = {
        "server_settings": {**SESSION_SETTINGS, "statement_timeout": timeout_ms},
    }
    if is_local_postgres(settings.database_url):
        kwargs["ssl"] = False
    return Pool(
        settings.database_url,
        size=settings.database_pool_size,
        acquire_timeout=settings.database_connect_timeout_seconds,
        # the POST's array types learned as a connection opens (at start-up for the warmed pool), not by
        # the first POST on it (db.ARRAY_TYPES)
        init=learn_types,
        **kwargs,
    )


#: seconds between two summaries of one job that keeps getting runs (jobs/summaries.SummaryRefresher)
SUMMARY_MIN_INTERVAL = 30.0

#: seconds between two repairs of the build-path states that reads found invalid (sizing/state.py)
STATE_REPAIR_SECONDS = 1.0

#: seconds between the checks that keep ``ci_sizer_database_ready`` current without a probe
DATABASE_CHECK_SECONDS = 10.0


_heap_frozen = False


def _freeze_startup_heap() -> None:
    """Collect once and freeze what start-up made, once per process: a server runs one app for its
    life; a process that starts several apps one after another (the tests) freezes the first one's
    start-up heap only, and collects the others' objects as usual, instead of walking the whole heap
    (0.1-0.2 s there) at every start."""
    global _heap_frozen
    if _heap_frozen:
        return
    gc.collect()
    gc.freeze()
    _heap_frozen = True


async def _flush_logs() -> None:
    logs.flush()


async def _dispose(engine: AsyncEngine, write_engine: AsyncEngine) -> None:
    await engine.dispose()
    if write_engine is not engine:
        await write_engine.dispose()


async def _warm_up(
    engine: AsyncEngine, pool: Pool | None, reads: inline.Reader | inline.EngineReads | None, seconds: float
) -> None:
    """Open a pooled connection now, on PostgreSQL every connection of the build path's pool with the
    sizing statement planned (within ``seconds``), on a SQLite file the loop's read connection with its
    statements compiled, so the first builds do not pay for connection setup and planning; a database
    that is down or slow at startup is not fatal (sizing fails open)."""
    failure = await check_database(engine)
    if failure is not None:
        log.warning("database not reachable at startup: %s", failure)
        return
    if reads is not None:
        try:
            reads.prime()
        except sqlite3.Error as exc:
            log.warning("the build path's SQLite read connection was not opened at startup: %s", exc)
    if pool is not None:
        try:
            async with asyncio.timeout(seconds):
                await pool.warm(pgread.prime)
        except TimeoutError:
            log.warning("the build path's connections were not all opened within %gs at startup", seconds)


async def _periodic(every: float, job: Callable[[], Awaitable[object]], *, at_start: bool = False) -> None:
    """Run ``job`` every ``every`` seconds (first at once when ``at_start``) until cancelled; a
    failing run is logged, not fatal. A cancellation that ``job`` swallowed, or turned into another
    error, still ends the loop (a task that went on after its cancellation held the shutdown)."""
    if not at_start:
        await asyncio.sleep(every)
    while True:
        try:
            await job()
        except Exception:
            log.exception("background task failed")
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        await asyncio.sleep(every)


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` (several workers): settings from ``CI_SIZER_*``."""
    settings = Settings()
    logs.configure(settings.log_level, batched=True)
    return create_app(settings, owns_process=True)
