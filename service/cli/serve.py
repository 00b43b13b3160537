"""``ci-sizer serve``: apply migrations, then serve the API with uvicorn."""

from __future__ import annotations

import argparse
import os
from typing import Any

from service.cli.common import CliError, add_settings_flags, configure_logging, migrate_database, settings_from


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="apply migrations, then serve the API with uvicorn")
    add_settings_flags(serve, serve=True)
    add_bound_flags(serve)
    serve.set_defaults(handler=run)


def add_bound_flags(p: argparse.ArgumentParser) -> None:
    """The connection and write bounds (docs/reliability.md)."""
    p.add_argument("--max-connections", help="client connections held per worker (default 512)")
    p.add_argument("--header-timeout-seconds", help="time for a request's head (default 10)")
    p.add_argument("--body-timeout-seconds", help="time for a request's body, and to take an answer (default 30)")
    p.add_argument("--keep-alive-seconds", help="idle time between two requests on a connection (default 5)")
    p.add_argument("--max-header-bytes", help="request line and headers, 431 past it (default 16384)")
    p.add_argument("--max-body-bytes", help="request body, 413 past it (default 10485760)")
    p.add_argument("--max-body-bytes-in-flight", help="large bodies held at once, 503 past it (default 67108864)")
    p.add_argument("--listen-backlog", help="connections queued by the kernel for accept (default 256)")
    p.add_argument("--write-timeout-seconds", help="bound on a write, 503 past it (default 2.5)")


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    metrics_dir = None
    if settings.workers > 1 or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # before anything imports the metrics: prometheus-client opens its files at import
        metrics_dir = _prepare_multiprocess(settings)
    try:
        _serve_with(settings)
    finally:
        if metrics_dir is not None:
            import shutil

            shutil.rmtree(metrics_dir, ignore_errors=True)  # made by _prepare_multiprocess, nothing else
    return 0


def _serve_with(settings: Any) -> None:
    import uvicorn

    from service.auth import TokensFileError, load_tokens
    from service.connections import Bounds
    from service.db import redacted
    from service.main import ExposureError, check_exposure, create_app

    configure_logging(settings.log_level, batched=True)  # flushed on a beat by the service
    from service.sizing.ceilings import CeilingsFileError, load

    try:
        check_exposure(settings, load_tokens(settings.tokens_file))
        load(settings.runner_ceilings_file)
    except (ExposureError, TokensFileError, CeilingsFileError) as exc:
        raise CliError(str(exc)) from None
    check_descriptors(Bounds.of(settings))
    migrate_database(settings.database_url, "head", redacted(settings.database_url))
    common: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "log_config": None,
        "access_log": False,  # one JSON line per request comes from the app's own middleware
        "proxy_headers": False,
        "loop": event_loop(settings),
        **connection_bounds(settings),
    }
    from service import shutdown

    common.update(shutdown.uvicorn_settings())  # a shutdown within the pod's grace period
    if settings.workers == 1:
        uvicorn.run(create_app(settings, owns_process=True), **common)
        return
    uvicorn.run(
        "service.main:create_app_from_env",
        factory=True,
        workers=settings.workers,
        **common,
    )


def event_loop(settings: Any) -> str:
    """uvicorn's loop: uvloop (``auto``) on PostgreSQL, asyncio's own on SQLite. uvloop accepts one new
    connection a turn of its loop; on SQLite a sizing miss is read on the loop (sizing/inline.py),
    so under load a turn reads several in full and new connections wait for as many turns (the cold
    start's p99 76 ms with uvloop, 36 ms with asyncio's loop, which accepts every pending connection a
    turn; docs/performance.md, "uvloop's accept"). On PostgreSQL a miss waits for its statement off the
    loop, turns stay short, and uvloop answered 1.17 times as many requests."""
    return "asyncio" if settings.is_sqlite else "auto"


def connection_bounds(settings: Any) -> dict[str, Any]:
    """uvicorn's settings for the connection bounds: the bounded protocol (service/connections.py, which
    reads the rest from the app), no WebSocket upgrade (the service has none), the listen queue, and the
    idle time between requests."""
    from service.connections import BoundedHttpToolsProtocol

    return {
        "http": BoundedHttpToolsProtocol,
        "ws": "none",
        "backlog": settings.listen_backlog,
        "timeout_keep_alive": settings.keep_alive_seconds,
    }


def check_descriptors(bounds: Any) -> None:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one, then refuse to start when it is below what the
    connection bounds need (``Bounds.fds_needed``): past it, accept() fails and every client is dropped,
    probes included."""
    import logging
    import resource

    need = bounds.fds_needed()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, need)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    log = logging.getLogger("ci_sizer")
    if soft != resource.RLIM_INFINITY and soft < need:
        raise CliError(
            f"the open-file limit (RLIMIT_NOFILE) is {soft}, hard limit {hard}, and the connection bounds need "
            f"{need} descriptors per worker (--max-connections {bounds.max_connections}, --listen-backlog "
            f"{bounds.backlog}, and what the process holds besides): raise the limit (ulimit -n, LimitNOFILE=, the "
            f"container runtime's nofile) or lower --max-connections to {max(1, bounds.max_connections - (need - soft))}"
        )
    log.info(
        "connections: at most %d per worker (head %gs and %d bytes, body %gs); %d descriptors needed, limit %s",
        bounds.max_connections,
        bounds.header_timeout,
        bounds.max_header_bytes,
        bounds.body_timeout,
        need,
        soft,
    )


def _prepare_multiprocess(settings: Any) -> str:
    """Workers are new processes: hand them the settings through CI_SIZER_* and give
    prometheus-client an empty directory to share metrics through: one this process creates, inside
    an operator-set ``PROMETHEUS_MULTIPROC_DIR`` (created if missing) or else in the temporary
    directory. Nothing already there is read, emptied or deleted; the caller removes the new
    directory, and only it, at exit. Returns it."""
    import tempfile

    for field in type(settings).model_fields:
        value = getattr(settings, field)
        if value is not None:
            os.environ[f"CI_SIZER_{field.upper()}"] = str(value)
    parent = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
    try:
        if parent is not None:
            os.makedirs(parent, exist_ok=True)
        directory = tempfile.mkdtemp(prefix="ci-sizer-metrics-", dir=parent)
    except OSError as exc:
        where = parent or tempfile.gettempdir()
        raise CliError(f"cannot create the metrics directory in {where}: {exc.strerror}") from None
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    return directory
