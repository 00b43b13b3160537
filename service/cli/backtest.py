"""``ci-sizer backtest``: how good the recommendations would have been on the stored history
(docs/backtest.md)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from service.cli.common import CliError, Progress, read_database, validated
from service.sizing.params import BUFFER, CPU_PERCENTILE_DOC, DEFAULT_CPU_PERCENTILE, RUNS, STAT_NAMES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bt = sub.add_parser(
        "backtest",
        help="how good the recommendations would have been on the stored history",
        description="Walks each job's runs in time order, sizes each run from the runs before it with every "
        "combination of the parameters, and scores it against what it used; see docs/backtest.md.",
    )
    bt.add_argument("--org", help="one org's jobs (default: every org)")
    bt.add_argument("--since", help="RFC 3339: runs that finished from then")
    bt.add_argument("--until", help="RFC 3339: runs that finished before then")
    bt.add_argument("--runs", default=str(RUNS.default), help=f"{RUNS.doc}, comma-separated (default {RUNS.default})")
    bt.add_argument(
        "--buffer", default=str(BUFFER.default), help=f"{BUFFER.doc}, comma-separated (default {BUFFER.default})"
    )
    bt.add_argument(
        "--cpu-percentile",
        default=DEFAULT_CPU_PERCENTILE,
        help=f"{CPU_PERCENTILE_DOC}: {', '.join(STAT_NAMES)}; comma-separated (default {DEFAULT_CPU_PERCENTILE})",
    )
    bt.add_argument(
        "--memory-qos", dest="qos_list", default="guaranteed", help="guaranteed, burstable; comma-separated"
    )
    bt.add_argument("--no-baselines", action="store_true", help="leave out the fixed default and the approximations")
    bt.add_argument("--no-efficient", action="store_true", help="leave out the efficient policy (rules E1-E13)")
    bt.add_argument("--jobs", type=int, default=10, help="riskiest jobs to list (default 10)")
    bt.add_argument("--database-url", help="SQLAlchemy URL (default: sqlite file ./ci-sizer.db)")
    bt.add_argument("--json", action="store_true", help="print the report as JSON")
    bt.set_defaults(handler=run)


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
        "efficient": not args.no_efficient,
    }
    return validated(BacktestCreate, raw, "invalid backtest")


def run(args: argparse.Namespace) -> int:
    from service.backtests import service as backtest
    from service.backtests.service import param_sets

    body = _backtest_body(args)
    started = time.perf_counter()

    async def read(conn: Any, settings: Any, policy: Any) -> tuple[Any, Any, int]:
        series = await backtest.load(
            conn=conn, org=body.org, since=body.since, until=body.until, max_memory=settings.max_memory
        )
        return series, await backtest.load_pins(conn=conn, org=body.org), policy.max_backoff_memory

    series, overrides, max_backoff_memory = read_database(args, read)
    if not series:
        raise CliError("no stored runs to backtest" + (f" for org {body.org!r}" if body.org else ""), code=1)
    loaded = time.perf_counter()
    pols = backtest.policies(param_sets(body), baselines=body.baselines, efficient=body.efficient)
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
