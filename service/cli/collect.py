"""``ci-sizer collect``: run a command (or watch a cgroup), measure it, post the run; ``--flush`` sends
what was spooled. Imports only the standard library and the package (it runs in build images)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from service.cli.common import CliError
from service.growth import MODES

if TYPE_CHECKING:
    from service.growth import Options


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    _register_grow(collect.add_argument_group("growth (docs/integrations/growth.md)"), env)
    collect.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run")
    collect.set_defaults(handler=run)


def _register_grow(group: argparse._ArgumentGroup, env: Callable[[str], str | None]) -> None:
    group.add_argument(
        "--grow",
        action=argparse.BooleanOptionalAction,
        default=(env("CI_SIZER_GROW") or "").lower() in ("1", "true", "yes", "on"),
        help="raise the build's memory limit before the kernel kills it, as the answer's grow block allows "
        "(CI_SIZER_GROW=1); anything missing is said in one line and the build runs without growth",
    )
    group.add_argument(
        "--grow-with",
        choices=MODES,
        default=env("CI_SIZER_GROW_WITH") or "auto",
        help="kubernetes (an in-place resize of the pod; needs ci-sizer[grow]), cgroup (as root: the build in "
        "a cgroup of its own), or auto: kubernetes when CI_SIZER_POD_NAME is set, else cgroup (CI_SIZER_GROW_WITH)",
    )
    group.add_argument(
        "--answer",
        type=Path,
        default=env("CI_SIZER_ANSWER"),
        help="the JSON answer the recipe saved, for its grow block (default: GET it from --url) (CI_SIZER_ANSWER)",
    )
    group.add_argument("--pod-container", help="the build's container in the pod (default: --container)")
    group.add_argument(
        "--grow-cgroup-parent", type=Path, help="cgroup: where the build's cgroup goes (default: the collector's)"
    )
    group.add_argument("--grow-poll", type=float, default=0.01, help="seconds between memory readings (default 0.01)")
    group.add_argument(
        "--grow-notify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="cgroup v1: wake on the kernel's usage threshold notification as well as every --grow-poll (default on; "
        "off measures polling alone, as cgroup v2 and pods have it)",
    )
    group.add_argument(
        "--grow-timeout", type=float, default=2.0, help="most seconds for each call growth makes (default 2)"
    )


def _grow_options(args: argparse.Namespace, values: dict[str, str]) -> Options | None:
    from service.growth import Options

    if not args.grow:
        return None
    if not 0 < args.grow_poll <= 0.1:
        raise CliError("--grow-poll must be above 0 and at most 0.1 s")
    if not args.grow_timeout > 0:
        raise CliError("--grow-timeout must be positive")
    return Options(
        mode=args.grow_with,
        answer_file=args.answer,
        url=args.url,
        token=args.token,
        names=(values["org"], values["repo"], values["workflow"], values["job"]),
        container=args.container,
        pod_container=args.pod_container,
        cgroup=args.cgroup,
        parent=args.grow_cgroup_parent,
        poll=args.grow_poll,
        notify=args.grow_notify,
        timeout=args.grow_timeout,
    )


def run(args: argparse.Namespace) -> int:
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
    grow = _grow_options(args, values)
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
            grow=grow,
            say=say,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
