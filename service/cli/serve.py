"""``ci-sizer serve``: apply migrations, then serve the API with uvicorn."""

from __future__ import annotations

import argparse
import os
from typing import Any

from service.cli.common import CliError, add_settings_flags, configure_logging, migrate_database, settings_from


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="apply migrations, then serve the API with uvicorn")
    add_settings_flags(serve, serve=True)
    serve.set_defaults(handler=run)


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
    from service.main import ExposureError, check_exposure, create_app, redacted

    configure_logging(settings.log_level, batched=True)  # flushed on a beat by the service
    from service.sizing.ceilings import CeilingsFileError, load

    try:
        check_exposure(settings, load_tokens(settings.tokens_file))
        load(settings.runner_ceilings_file)
    except (ExposureError, TokensFileError, CeilingsFileError) as exc:
        raise CliError(str(exc)) from None
    migrate_database(settings.database_url, "head", redacted(settings.database_url))
    common: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "log_config": None,
        "access_log": False,  # one JSON line per request comes from the app's own middleware
        "proxy_headers": False,
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
