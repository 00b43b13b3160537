"""The ``ci-sizer`` command: serve, migrate, token create, collect, stage, simulate, backtest, openapi."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from service import __version__

T = TypeVar("T")

#: Settings fields that can be given as flags, and the flag that sets each.
_FLAGS = {
    "database_url": "--database-url",
    "host": "--host",
    "port": "--port",
    "cpu_sizing_mode": "--cpu-sizing-mode",
    "memory_qos": "--memory-qos",
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
}


class CliError(Exception):
    """A one-line error for the user; exits non-zero without a traceback."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CliError(message)


def _add_settings_flags(p: argparse.ArgumentParser, *, serve: bool) -> None:
    p.add_argument("--database-url", help="SQLAlchemy URL (default: sqlite file ./ci-sizer.db)")
    if not serve:
        return
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", help="port (default 8080)")
    p.add_argument("--cpu-sizing-mode", help="observe (default) or enforce (rule S17)")
    p.add_argument("--memory-qos", help="guaranteed (default) or burstable (rule S16)")
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ci-sizer",
        description="Right-sizes Kubernetes requests and limits for CI jobs.",
    )
    parser.add_argument("--version", action="version", version=f"ci-sizer {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    serve = sub.add_parser("serve", help="apply migrations, then serve the API with uvicorn")
    _add_settings_flags(serve, serve=True)
    migrate = sub.add_parser("migrate", help="apply database migrations")
    _add_settings_flags(migrate, serve=False)
    migrate.add_argument("--revision", default="head", help="target revision (default head)")
    token = sub.add_parser("token", help="manage bearer tokens")
    token_sub = token.add_subparsers(dest="token_command", parser_class=_Parser)
    create = token_sub.add_parser("create", help="print a new secret once, and the entry for the tokens file")
    create.add_argument("name")
    create.add_argument("--role", action="append", required=True, choices=["ingest", "read", "admin"])
    create.add_argument("--org", action="append", help="limit the token to this org (repeatable)")
    create.add_argument("--format", choices=["toml", "yaml"], default="toml")
    collect = sub.add_parser(
        "collect",
        help="run a command (after --) or watch a cgroup, measure CPU and memory, post the run",
        description="Exits with the command's exit code; an unreachable sizer never fails the build "
        "(retries, then spools the run: send it later with --flush DIR).",
    )
    env = os.environ.get
    collect.add_argument("--url", default=env("CI_SIZER_URL"), help="the sizer (CI_SIZER_URL)")
    collect.add_argument(
        "--token", default=env("CI_SIZER_TOKEN"), help="bearer token with the ingest role (CI_SIZER_TOKEN)"
    )
    collect.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    for name in ("org", "repo", "workflow", "job", "run-id"):
        collect.add_argument(f"--{name}", help="default: from the CI system's environment")
    collect.add_argument("--container", default="build", help="container name in the run (default build)")
    collect.add_argument("--cgroup", help="a cgroup v2 dir, a cgroup v1 memory dir, or 'self'")
    collect.add_argument("--cpu-cgroup", help="cgroup v1 cpuacct dir, when not beside the memory one")
    collect.add_argument(
        "--spool-dir",
        type=Path,
        default=Path(env("CI_SIZER_SPOOL_DIR") or Path.home() / ".cache" / "ci-sizer" / "spool"),
        help="where unsent runs go (CI_SIZER_SPOOL_DIR)",
    )
    collect.add_argument("--retries", type=int, default=3, help="retries before spooling (default 3)")
    collect.add_argument("--backoff", type=float, default=1.0, help="first retry delay in seconds, doubled each time")
    collect.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="most seconds posting may add to the build, retries included, before the run is spooled "
        "(default 5; with --flush, per spooled run)",
    )
    collect.add_argument("--flush", type=Path, metavar="DIR", help="send the runs spooled in DIR, then exit")
    collect.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run")
    stage = sub.add_parser(
        "stage",
        help="a pipeline stage's pod totals from its steps (as POST /api/v1/stages:compute)",
        description="FILE is YAML or JSON: the body of POST /api/v1/stages:compute ({stage: [...], "
        "options: {...}}) or just the list of items. The flags switch options on.",
    )
    stage.add_argument("file", type=Path, help="the stage file ('-' reads stdin)")
    stage.add_argument("--increase-default-resources", action="store_true", help="default steps 1000m/3000Mi (H1)")
    stage.add_argument(
        "--conservative-addon-limits", action="store_true", help="a flat 100m/100Mi stage container (H3)"
    )
    stage.add_argument(
        "--use-recommendations",
        action="store_true",
        help="steps with a job reference take the sizer's recommended limits, read from --database-url",
    )
    stage.add_argument(
        "--generation",
        choices=("doc", "harness"),
        help="doc: the rules as documented (H1-H7); harness: as Harness CI's source does it (H8-H14)",
    )
    stage.add_argument(
        "--disable-resource-optimization",
        action="store_true",
        help="CI_DISABLE_RESOURCE_OPTIMIZATION: every step's limit is its own (H12)",
    )
    stage.add_argument(
        "--extra-addon-resource", action="store_true", help="CI_EXTRA_ADDON_RESOURCE: a 300m/400Mi setup-addon (H13)"
    )
    stage.add_argument("--database-url", help="SQLAlchemy URL (default: sqlite file ./ci-sizer.db)")
    stage.add_argument("--json", action="store_true", help="print the API's JSON answer instead of a table")
    sim = sub.add_parser(
        "simulate",
        help="replay builds onto a node pool under placement profiles, with and without ballast",
        description="Replays a synthetic trace (default) or an org's stored runs (--org, --since, --until) "
        "and prints the profiles side by side; see docs/simulation.md.",
    )
    sim.add_argument("--days", type=float, default=7, help="synthetic: days of builds (default 7)")
    sim.add_argument("--builds-per-day", type=float, default=1500, help="synthetic: mean builds a day (default 1500)")
    sim.add_argument("--trace-seed", type=int, default=0, help="synthetic: the trace's seed (default 0)")
    sim.add_argument("--bursts-per-day", type=float, default=6, help="synthetic: pushes starting many builds at once")
    sim.add_argument("--org", help="replay this org's stored runs instead of a synthetic trace")
    sim.add_argument("--since", help="history: RFC 3339 start of the window")
    sim.add_argument("--until", help="history: RFC 3339 end of the window")
    sim.add_argument("--sizes", choices=["recommended", "recorded"], default="recommended", help="history: pod sizes")
    sim.add_argument("--database-url", help="history: SQLAlchemy URL (default: sqlite file ./ci-sizer.db)")
    sim.add_argument(
        "--shape",
        action="append",
        metavar="NAME=CPU,MEMORY[,PRICE]",
        help="a node shape, e.g. m5.2xlarge=8,32Gi,0.384 (repeatable; default that one)",
    )
    sim.add_argument("--initial-nodes", type=int, default=0)
    sim.add_argument("--min-nodes", type=int, default=0)
    sim.add_argument("--max-nodes", type=int, default=1000)
    sim.add_argument("--provision-delay", type=float, default=120, help="seconds to bring a node (default 120)")
    sim.add_argument("--scale-down-idle", type=float, default=600, help="seconds an empty node lives (default 600)")
    sim.add_argument(
        "--expendable-cutoff",
        type=int,
        default=-10,
        help="cluster-autoscaler's --expendable-pods-priority-cutoff (default -10; the ballast runs at -1000000)",
    )
    sim.add_argument("--ballast-coverage", type=float, default=0.9, help="auto ballast: share of bursts (default 0.9)")
    sim.add_argument("--profiles", default="spread,ci-bin-pack", help="comma-separated (default spread,ci-bin-pack)")
    sim.add_argument(
        "--ballast", default="auto", help="auto (sized from the trace), none, or N[:CPU,MEMORY] (default auto)"
    )
    sim.add_argument("--seed", type=int, default=0, help="the simulation's seed (ties between equal nodes)")
    sim.add_argument("--plot", type=Path, help="write nodes and CPU allocation over time here (SVG)")
    sim.add_argument("--json", action="store_true", help="print the report as JSON")
    bt = sub.add_parser(
        "backtest",
        help="how good the recommendations would have been on the stored history",
        description="Walks each job's runs in time order, sizes each run from the runs before it with every "
        "combination of the parameters, and scores it against what it used; see docs/backtest.md.",
    )
    bt.add_argument("--org", help="one org's jobs (default: every org)")
    bt.add_argument("--since", help="RFC 3339: runs that finished from then")
    bt.add_argument("--until", help="RFC 3339: runs that finished before then")
    bt.add_argument("--runs", default="5", help="newest clean runs analysed, comma-separated (default 5)")
    bt.add_argument("--buffer", default="20", help="CPU headroom in percent, comma-separated (default 20)")
    bt.add_argument("--cpu-percentile", default="p95", help="peak, p99, p95, p75, p50, avg; comma-separated")
    bt.add_argument(
        "--memory-qos", dest="qos_list", default="guaranteed", help="guaranteed, burstable; comma-separated"
    )
    bt.add_argument("--no-baselines", action="store_true", help="leave out the fixed default and the approximations")
    bt.add_argument("--jobs", type=int, default=10, help="riskiest jobs to list (default 10)")
    bt.add_argument("--database-url", help="SQLAlchemy URL (default: sqlite file ./ci-sizer.db)")
    bt.add_argument("--json", action="store_true", help="print the report as JSON")
    openapi = sub.add_parser("openapi", help="print the OpenAPI document")
    openapi.add_argument("--output", type=Path, help="write to this file instead of stdout")
    return parser


def settings_from(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from service.settings import Settings

    given = {field: getattr(args, field) for field in _FLAGS if getattr(args, field, None) is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "settings"
        where = _FLAGS.get(field, field) if field in given else f"CI_SIZER_{field.upper()}"
        raise CliError(f"{where}: {str(err['msg']).removeprefix('Value error, ')}") from None


def _serve(args: argparse.Namespace) -> None:
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


def _serve_with(settings: Any) -> None:
    import uvicorn

    from service.auth import TokensFileError, load_tokens
    from service.main import ExposureError, check_exposure, create_app, redacted

    _configure_logging(settings.log_level)
    from service.sizing.ceilings import CeilingsFileError, load

    try:
        check_exposure(settings, load_tokens(settings.tokens_file))
        load(settings.runner_ceilings_file)
    except (ExposureError, TokensFileError, CeilingsFileError) as exc:
        raise CliError(str(exc)) from None
    _migrate(settings.database_url, "head", redacted(settings.database_url))
    common: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "log_config": None,
        "access_log": False,  # one JSON line per request comes from the app's own middleware
        "proxy_headers": False,
    }
    if settings.workers == 1:
        uvicorn.run(create_app(settings), **common)
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


def _migrate(database_url: str, revision: str, shown_url: str) -> None:
    from service import migrations

    log = logging.getLogger("ci_sizer")
    log.info("applying migrations to %s (target %s)", shown_url, revision)
    try:
        migrations.upgrade(database_url, revision)
    except Exception as exc:  # a database that cannot be reached or migrated: one clear line
        raise CliError(
            f"migration failed on {shown_url}: {type(exc).__name__}: {_first_line(exc)}",
            code=1,
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""


def _token_create(args: argparse.Namespace) -> None:
    from service.auth import new_secret, token_line

    secret = new_secret()
    roles = list(dict.fromkeys(args.role))
    print(f"secret (shown once; give it to the client as 'Authorization: Bearer <secret>'):\n{secret}\n")
    print(f"add this to the tokens file ({args.format.upper()}):")
    print(token_line(args.name, secret, roles, args.org, toml=args.format == "toml"))


def _openapi(args: argparse.Namespace) -> None:
    from service.main import create_app
    from service.settings import Settings

    doc = json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"
    if args.output:
        args.output.write_text(doc)
    else:
        sys.stdout.write(doc)


def _configure_logging(level: str) -> None:
    from service.observability import logs

    logs.configure(level)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "serve":
            _serve(args)
        elif args.command == "migrate":
            settings = settings_from(args)
            _configure_logging(settings.log_level)
            from service.main import redacted

            _migrate(settings.database_url, args.revision, redacted(settings.database_url))
        elif args.command == "token" and args.token_command == "create":
            _token_create(args)
        elif args.command == "openapi":
            _openapi(args)
        elif args.command == "collect":
            return _collect(args)
        elif args.command == "stage":
            return _stage(args)
        elif args.command == "simulate":
            return _simulate(args)
        elif args.command == "backtest":
            return _backtest(args)
        else:
            parser.print_help()
            return 2
    except CliError as exc:
        print(f"ci-sizer: error: {exc}", file=sys.stderr)
        return exc.code
    return 0


def _collect(args: argparse.Namespace) -> int:
    from service import collector

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.flush is not None:
        if not args.url:
            raise CliError("--flush needs --url (or CI_SIZER_URL)")
        try:
            remaining = collector.flush(args.flush, args.url, args.token, timeout=args.timeout, say=say)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        if remaining:
            say(f"ci-sizer: {remaining} run(s) still spooled in {args.flush}")
        return 1 if remaining else 0
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    found = collector.identity_from_env(os.environ)
    given = {"org": args.org, "repo": args.repo, "workflow": args.workflow, "job": args.job, "run_id": args.run_id}
    values = {k: v if v is not None else found.get(k, "") for k, v in given.items()}
    if not values["run_id"]:
        values["run_id"] = f"local-{int(time.time())}-{os.getpid()}"
    missing = [k.replace("_", "-") for k, v in values.items() if not v]
    if missing:
        raise CliError(f"no --{', --'.join(missing)} given and none found in the CI environment")
    if args.interval <= 0:
        raise CliError("--interval must be positive")
    if not args.timeout > 0:
        raise CliError("--timeout must be positive")
    try:
        return collector.run_collect(
            command=command,
            identity=collector.Identity(**values),
            url=args.url,
            token=args.token,
            interval=args.interval,
            cgroup=args.cgroup,
            cpu_cgroup=args.cpu_cgroup,
            container=args.container,
            spool_dir=args.spool_dir,
            retries=args.retries,
            backoff=args.backoff,
            timeout=args.timeout,
            say=say,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _validated(model: Any, raw: Any, what: str, *, pointer: bool = False) -> Any:
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


def _read_database(args: argparse.Namespace, read: Callable[[Any, Any, Any], Awaitable[T]]) -> T:
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

    from service.db import DB_FAULTS
    from service.main import redacted

    shown = redacted(settings.database_url)
    faults: tuple[type[Exception], ...] = (*DB_FAULTS, OSError)

    async def run() -> T:
        engine = build_engine(settings.database_url)
        try:
            async with engine.connect() as conn:
                await _ensure_migrated(conn, shown)
                return await read(conn, settings, policy)
        except faults as exc:  # one line, not the driver's traceback
            raise CliError(
                f"cannot read the database {shown}: {type(exc).__name__}: {_first_line(exc)}", code=1
            ) from None
        finally:
            await engine.dispose()

    return asyncio.run(run())


async def _ensure_migrated(conn: Any, shown_url: str) -> None:
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


_STAGE_FLAGS = (
    "increase_default_resources",
    "conservative_addon_limits",
    "use_recommendations",
    "disable_resource_optimization",
    "extra_addon_resource",
)


def _stage_body(args: argparse.Namespace) -> Any:
    """The validated stage file, with the flags' options switched on."""
    import yaml

    from service.stages.schemas import StageCompute

    name = str(args.file)
    try:
        text = sys.stdin.read() if name == "-" else args.file.read_text()
        raw = yaml.safe_load(text)
    except OSError as exc:
        raise CliError(f"{name}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise CliError(f"{name}: not YAML or JSON: {_first_line(exc)}") from None
    if isinstance(raw, list):
        raw = {"stage": raw}
    if not isinstance(raw, dict):
        raise CliError(f"{name}: expected a mapping with a 'stage' list, or a list of items")
    options = raw.get("options", {})
    if isinstance(options, dict):
        flags: dict[str, Any] = {f: True for f in _STAGE_FLAGS if getattr(args, f)}
        if args.generation is not None:
            flags["generation"] = args.generation
        raw = {**raw, "options": {**options, **flags}}
    return _validated(StageCompute, raw, f"{name}: invalid stage", pointer=True)


def _stage(args: argparse.Namespace) -> int:
    from service.errors import ServiceError
    from service.sizing import service as sizing_service
    from service.stages import service as stages
    from service.stages.flatten import flatten
    from service.stages.render import render

    body = _stage_body(args)
    try:
        items = flatten(body.stage)
        keys = stages.wanted_jobs(body, items)
        answers = (
            _read_database(args, lambda conn, _, policy: sizing_service.fetch_many(conn=conn, keys=keys, policy=policy))
            if keys
            else {}
        )
        answer = stages.compose(body, items, answers)
    except ServiceError as exc:
        lines = [f"{e['field'].removeprefix('body')}: {e['message']}" for e in exc.errors or []]
        raise CliError("\n  ".join([f"{args.file}: {exc.detail}", *lines])) from None
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(render(answer))
    return 0


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


def _simulation_body(args: argparse.Namespace) -> Any:
    from service.simulations.schemas import SimulationCreate

    shapes = []
    for text in args.shape or ["m5.2xlarge=8,32Gi,0.384"]:
        name, _, rest = text.partition("=")
        parts = rest.split(",")
        if not name or len(parts) not in (2, 3):
            raise CliError(f"--shape {text!r}: expected NAME=CPU,MEMORY[,PRICE]")
        try:
            price = float(parts[2]) if len(parts) == 3 else 0.0
        except ValueError:
            raise CliError(f"--shape {text!r}: the price is not a number") from None
        shapes.append({"name": name, "cpu": parts[0], "memory": parts[1], "price_per_hour": price})
    ballast: Any = args.ballast
    if ballast == "none":
        ballast = None
    elif ballast != "auto":
        count, _, size = ballast.partition(":")
        if not count.isdigit():
            raise CliError(f"--ballast {args.ballast!r}: expected auto, none or N[:CPU,MEMORY]")
        ballast = {"replicas": int(count)}
        if size:
            cpu, _, memory = size.partition(",")
            ballast.update(cpu=cpu, memory=memory)
    raw: dict[str, Any] = {
        "pool": {
            "shapes": shapes,
            "initial_nodes": args.initial_nodes,
            "min_nodes": args.min_nodes,
            "max_nodes": args.max_nodes,
            "provision_delay_seconds": args.provision_delay,
            "scale_down_idle_seconds": args.scale_down_idle,
            "expendable_pods_priority_cutoff": args.expendable_cutoff,
        },
        "profiles": [p.strip() for p in args.profiles.split(",")],
        "ballast": ballast,
        "ballast_coverage": args.ballast_coverage,
        "seed": args.seed,
    }
    if args.org:
        raw["history"] = {"org": args.org, "since": args.since, "until": args.until, "sizes": args.sizes}
    else:
        raw["synthetic"] = {
            "days": args.days,
            "builds_per_day": args.builds_per_day,
            "seed": args.trace_seed,
            "bursts_per_day": args.bursts_per_day,
        }
    return _validated(SimulationCreate, raw, "invalid simulation")


def _simulate(args: argparse.Namespace) -> int:
    from service.simulations import engine as simulate
    from service.simulations.router import ballast_of, pool_of

    body = _simulation_body(args)
    pool = pool_of(body)
    started = time.perf_counter()
    if body.synthetic is not None:
        builds = simulate.synthetic_from(body.synthetic)
        source: dict[str, Any] = {"synthetic": body.synthetic.model_dump()}
    else:
        h = body.history
        builds, info = _read_database(
            args,
            lambda conn, _, policy: simulate.load_trace(
                conn=conn, org=h.org, since=h.since, until=h.until, sizes=h.sizes, policy=policy
            ),
        )
        source = {"history": info}
    if not builds:
        raise CliError("no builds to replay in that window", code=1)
    scenarios = simulate.scenarios_for(body.profiles, ballast_of(body, builds, pool.provision_delay))
    result = simulate.run_all(builds, pool, scenarios, seed=body.seed, progress=Progress("simulating"))
    result["trace"].update(source)
    if args.plot:
        args.plot.write_text(simulate.plot(result))
    if args.json:
        print(json.dumps(result if args.plot is None else {**result, "timelines": None}, indent=2))
    else:
        print(simulate.render(result))
        took = time.perf_counter() - started
        print(f"\n{len(scenarios)} scenarios in {took:.1f} s" + (f"; plot written to {args.plot}" if args.plot else ""))
    return 0


def _backtest_body(args: argparse.Namespace) -> Any:
    from service.backtests.schemas import BacktestCreate

    def listed(text: str, as_int: bool) -> list[Any]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if as_int and not all(p.isdigit() for p in parts):
            raise CliError(f"expected comma-separated whole numbers, not {text!r}")
        return [int(p) for p in parts] if as_int else parts

    raw = {
        "org": args.org,
        "since": args.since,
        "until": args.until,
        "runs": listed(args.runs, True),
        "buffer": listed(args.buffer, True),
        "cpu_percentile": listed(args.cpu_percentile, False),
        "memory_qos": listed(args.qos_list, False),
        "baselines": not args.no_baselines,
    }
    return _validated(BacktestCreate, raw, "invalid backtest")


def _backtest(args: argparse.Namespace) -> int:
    from service.backtests import service as backtest
    from service.simulations.router import param_sets

    body = _backtest_body(args)
    started = time.perf_counter()

    async def read(conn: Any, settings: Any, policy: Any) -> tuple[Any, Any, int]:
        series = await backtest.load(
            conn=conn, org=body.org, since=body.since, until=body.until, max_memory=settings.max_memory
        )
        return series, await backtest.load_pins(conn=conn, org=body.org), policy.max_backoff_memory

    series, overrides, max_backoff_memory = _read_database(args, read)
    if not series:
        raise CliError("no stored runs to backtest" + (f" for org {body.org!r}" if body.org else ""), code=1)
    loaded = time.perf_counter()
    pols = backtest.policies(param_sets(body), baselines=body.baselines)
    result = backtest.run(
        series, pols, overrides, progress=Progress("backtesting"), max_backoff_memory=max_backoff_memory
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(backtest.render(result, jobs=args.jobs))
        took = time.perf_counter() - loaded
        print(f"\nread in {loaded - started:.1f} s, {len(pols)} policies scored in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
