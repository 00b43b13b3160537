"""``ci-sizer simulate``: replay builds onto a node pool under placement profiles, with and without
ballast (docs/simulation.md)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from service.cli.common import CliError, Progress, read_database, validated


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    sim.set_defaults(handler=run)


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
    return validated(SimulationCreate, raw, "invalid simulation")


def run(args: argparse.Namespace) -> int:
    from service import simulations as simulate
    from service.simulations.service import ballast_of, pool_of

    body = _simulation_body(args)
    pool = pool_of(body)
    started = time.perf_counter()
    if body.synthetic is not None:
        builds = simulate.synthetic_from(body.synthetic)
        source: dict[str, Any] = {"synthetic": body.synthetic.model_dump()}
    else:
        h = body.history
        builds, info = read_database(
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
