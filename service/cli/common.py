"""What the commands share: the parser class and its one-line errors, the settings flags, logging,
migrations, reading the database, validating a body, and the progress bar.

Only the standard library is imported here at import time (``collect`` runs where only the package is
installed); the rest is imported inside the functions that need it."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

#: Settings fields that can be given as flags, and the flag that sets each.
FLAGS = {
    "database_url": "--database-url",
    "host": "--host",
    "port": "--port",
    "cpu_sizing_mode": "--cpu-sizing-mode",
    "memory_qos": "--memory-qos",
    "sizing_policy": "--sizing-policy",
    "max_memory": "--max-memory",
    "max_backoff_memory": "--max-backoff-memory",
    "log_level": "--log-level",
    "tokens_file": "--tokens-file",
    "allow_anonymous": "--allow-anonymous",
    "workers": "--workers",
    "retention_runs": "--retention-runs",
    "sizing_deadline_ms": "--sizing-deadline-ms",
    "sizing_cache_entries": "--sizing-cache-entries",
    "runner_ceilings_file": "--runner-ceilings-file",
    "price_per_gib_hour": "--price-per-gib-hour",
    "price_per_core_hour": "--price-per-core-hour",
    "price_currency": "--price-currency",
    # connection and write bounds (service/cli/serve.py adds the flags)
    "max_connections": "--max-connections",
    "header_timeout_seconds": "--header-timeout-seconds",
    "body_timeout_seconds": "--body-timeout-seconds",
    "keep_alive_seconds": "--keep-alive-seconds",
    "max_header_bytes": "--max-header-bytes",
    "max_body_bytes": "--max-body-bytes",
    "max_body_bytes_in_flight": "--max-body-bytes-in-flight",
    "listen_backlog": "--listen-backlog",
    "write_timeout_seconds": "--write-timeout-seconds",
}


class CliError(Exception):
    """A one-line error for the user; exits non-zero without a traceback."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """Usage errors become a CliError (one line, exit 2), not argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        raise CliError(message)


def add_settings_flags(p: argparse.ArgumentParser, *, serve: bool) -> None:
    p.add_argument("--database-url", help="SQLAlchemy URL (default: sqlite file ./ci-sizer.db)")
    if not serve:
        return
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", help="port (default 8080)")
    p.add_argument("--cpu-sizing-mode", help="observe (default) or enforce (rule S17)")
    p.add_argument("--memory-qos", help="guaranteed (default) or burstable (rule S16)")
    p.add_argument(
        "--sizing-policy",
        help="seed (default), efficient (rules E1-E13) or growth (G8: efficient, its limit at a typical peak, for "
        "fleets whose runners grow builds in place); a per-scope override can opt a job in or out",
    )
    p.add_argument(
        "--max-memory",
        metavar="QUANTITY",
        help="node ceiling for memory limits, e.g. 16Gi (rule S15)",
    )
    p.add_argument(
        "--max-backoff-memory",
        metavar="QUANTITY",
        help="without a node ceiling, the most the OOM backoff raises a memory limit to (default 64Gi)",
    )
    p.add_argument("--log-level", help="critical, error, warning, info (default) or debug")
    p.add_argument("--tokens-file", help="TOML/YAML file of bearer tokens (CI_SIZER_TOKENS_FILE)")
    p.add_argument(
        "--allow-anonymous",
        action="store_true",
        default=None,
        help="serve without tokens on a non-loopback address",
    )
    p.add_argument("--workers", help="uvicorn worker processes (default 1; metrics aggregate across them)")
    p.add_argument("--retention-runs", help="newest runs kept per job (default 200)")
    p.add_argument("--sizing-deadline-ms", help="fail-open deadline of the sizing call (default 250)")
    p.add_argument("--runner-ceilings-file", help="per-org maxima the CI runners enforce (TOML/YAML)")
    p.add_argument("--sizing-cache-entries", help="jobs whose answers are cached in process (default 20000; 0: off)")
    p.add_argument("--price-per-gib-hour", help="money per GiB-hour of memory saved (default 0.004237, OpenCost's)")
    p.add_argument("--price-per-core-hour", help="money per core-hour of CPU saved (default 0.031611, OpenCost's)")
    p.add_argument("--price-currency", help="the currency shown beside amounts (default USD)")


def settings_from(args: argparse.Namespace) -> Any:
    """The Settings, from the environment and the flags given; a bad value is a CliError naming
    the flag (or the environment variable) it came from."""
    from pydantic import ValidationError

    from service.settings import Settings

    given = {field: getattr(args, field) for field in FLAGS if getattr(args, field, None) is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "settings"
        where = FLAGS.get(field, field) if field in given else f"CI_SIZER_{field.upper()}"
        raise CliError(f"{where}: {str(err['msg']).removeprefix('Value error, ')}") from None


def configure_logging(level: str, *, batched: bool = False) -> None:
    from service.observability import logs

    logs.configure(level, batched=batched)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""


def migrate_database(database_url: str, revision: str, shown_url: str) -> None:
    """Apply the migrations up to ``revision``; a failure is one CliError line (exit 1)."""
    from service import migrations

    log = logging.getLogger("ci_sizer")
    log.info("applying migrations to %s (target %s)", shown_url, revision)
    try:
        migrations.upgrade(database_url, revision)
    except Exception as exc:  # a database that cannot be reached or migrated: one clear line
        raise CliError(
            f"migration failed on {shown_url}: {type(exc).__name__}: {first_line(exc)}",
            code=1,
        ) from None


def validated(model: Any, raw: Any, what: str, *, pointer: bool = False) -> Any:
    """``model`` from ``raw``, or a CliError listing each bad field (as a JSON pointer with ``pointer``)."""
    from pydantic import ValidationError

    from service.errors import validation_errors

    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for e in validation_errors(exc.errors()):
            field = e["field"].removeprefix("body") if pointer else e["field"].removeprefix("body/")
            lines.append(f"{field or '/'}: {e['message']}")
        raise CliError(f"{what}:\n  " + "\n  ".join(lines)) from None


def read_database(args: argparse.Namespace, read: Callable[[Any, Any, Any], Awaitable[T]]) -> T:
    """``read(conn, settings, policy)`` on a connection to the configured database, with the sizing
    policy the settings configure (the reads of stage, simulate and backtest)."""
    import asyncio

    from service.db import build_engine
    from service.sizing import ceilings
    from service.sizing import service as sizing_service

    settings = settings_from(args)
    try:
        policy = sizing_service.Policy.of(settings, ceilings.load(settings.runner_ceilings_file))
    except ceilings.CeilingsFileError as exc:
        raise CliError(str(exc)) from None

    from service.db import DB_FAULTS, redacted

    shown = redacted(settings.database_url)
    faults: tuple[type[Exception], ...] = (*DB_FAULTS, OSError)

    async def run() -> T:
        engine = build_engine(settings.database_url)
        try:
            async with engine.connect() as conn:
                await ensure_migrated(conn, shown)
                return await read(conn, settings, policy)
        except faults as exc:  # one line, not the driver's traceback
            raise CliError(
                f"cannot read the database {shown}: {type(exc).__name__}: {first_line(exc)}", code=1
            ) from None
        finally:
            await engine.dispose()

    return asyncio.run(run())


async def ensure_migrated(conn: Any, shown_url: str) -> None:
    """A CliError unless the database is at the newest migration this version knows."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from service.migrations import alembic_config

    current = await conn.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())
    heads = ScriptDirectory.from_config(alembic_config("")).get_heads()  # only the scripts are read
    if current in heads:
        return
    state = "is not migrated" if current is None else f"is at migration {current}, not the newest ({', '.join(heads)})"
    raise CliError(f"the database {shown_url} {state}: run `ci-sizer migrate --database-url ...` first", code=1)


class Progress:
    """A one-line progress bar on stderr (only when it is a terminal, or when forced)."""

    def __init__(self, label: str, *, force: bool = False) -> None:
        self.label = label
        self.on = force or sys.stderr.isatty()
        self.shown = -1

    def __call__(self, fraction: float) -> None:
        percent = int(fraction * 100)
        if not self.on or percent == self.shown:
            return
        self.shown = percent
        bar = "#" * (percent // 4) + "." * (25 - percent // 4)
        sys.stderr.write(f"\r{self.label} [{bar}] {percent:3d}%")
        if percent >= 100:
            sys.stderr.write("\n")
        sys.stderr.flush()
