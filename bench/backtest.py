"""Backtest speed: a year of history for 1,000 jobs at 20 runs a day (7.3 million runs), walked by
the compiled ``backtest_walk`` for ci-sizer's default parameters and for the whole default report
(ci-sizer, recorded limits and the three baselines), against the pure-Python reference on the same
jobs (a sample of them, the ratio measured side by side). Target: under a minute with Cython.

The histories are generated in memory (a job's columns at a time, so memory stays small); reading
7.3 million runs from a database is not part of the figure (and by default retention keeps the
newest 200 runs per job, so a year is only there with ``--retention-runs`` raised).

    python bench/backtest.py [--jobs 1000] [--runs-per-day 20] [--days 365] [--results bench/out/backtest.json]

``--fleet-db URL`` instead stores a small synthetic fleet (``--fleet-jobs`` jobs of ``--fleet-runs``
runs, posted through the API) in a migrated database, for ``ci-sizer backtest`` (docs/backtest.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import time
from typing import Any

import numpy as np

from bench._util import save, verdict
from service.backtests import service as backtest
from service.core import _reference

try:
    from service.core import _sizing
except ImportError:  # pragma: no cover - the bench needs the compiled module
    sys.exit("the compiled core is not built: pip install -e . on a machine with gcc")

MIB = 1 << 20


def job_columns(n: int, seed: int) -> dict[str, Any]:
    """One job's container columns: a CPU and memory level that drifts, noise, 2% OOM-suspect runs."""
    rng = np.random.default_rng(seed)
    level_cpu = rng.uniform(200, 4000) * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    level_mem = rng.uniform(256, 8192) * MIB * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    p95 = level_cpu * rng.lognormal(0, 0.15, n)
    peak = p95 * rng.uniform(1.0, 1.4, n)
    mem = (level_mem * rng.lognormal(0, 0.1, n)).astype(np.int64)
    oom = (rng.random(n) < 0.02).astype(np.int64)
    limit = np.where(rng.random(n) < 0.5, (mem * 1.3).astype(np.int64), -1)

    def q(x: Any) -> Any:
        return np.ascontiguousarray(x, dtype=np.longlong)

    def d(x: Any) -> Any:
        return np.ascontiguousarray(x, dtype=np.float64)

    return {
        "clean": q(1 - oom),
        "present": q(np.ones(n)),
        "cpu_stat": d(p95),
        "cpu_peak": d(peak),
        "cpu_p95": d(p95),
        "cpu_avg": d(p95 * 0.6),
        "mem_peak": q(mem),
        "mem_limit": q(limit),
        "oom": q(oom),
        "pod_peak": q(mem),
        "ceiling": q(np.full(n, -1)),
        "duration": d(rng.uniform(120, 1800, n)),
    }


def walk_all(module: Any, columns: dict[str, Any], pols: list[backtest.Policy]) -> list[tuple[Any, ...]]:
    return [
        tuple(
            module.backtest_walk(
                *columns.values(), p.code, p.params.runs, p.params.buffer, True, (-1, -1, -1, -1, 0, 0, 0, 0)
            )
        )
        for p in pols
    ]


def fleet(url: str, jobs: int, runs: int) -> None:
    """Post a synthetic fleet's runs: jobs with steady, drifting, spiky or leaking memory."""
    import asyncio
    from datetime import UTC, datetime, timedelta

    import httpx

    from service.main import create_app
    from service.settings import Settings

    rng = np.random.default_rng(7)
    t0 = datetime(2026, 9, 1, tzinfo=UTC)
    kinds = ("steady", "drifting", "spiky", "leaking")
    limit = 8 << 30  # what the runs were given: 8Gi each

    async def post() -> None:
        app = create_app(Settings(database_url=url, retention_runs=max(200, runs)))
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
                for j in range(jobs):
                    kind = kinds[j % len(kinds)]
                    cpu0, mem0 = rng.uniform(200, 3000), rng.uniform(300, 6000) * MIB
                    batch = []
                    for i in range(runs):
                        grow = 1 + (0.01 * i if kind == "leaking" else 0.003 * i if kind == "drifting" else 0)
                        spike = rng.uniform(1.5, 2.5) if kind == "spiky" and rng.random() < 0.1 else 1.0
                        cpu = float(cpu0 * grow * rng.lognormal(0, 0.15))
                        mem = int(mem0 * grow * spike * rng.lognormal(0, 0.08))
                        killed = mem >= limit  # the kernel stops it at its limit
                        mem = min(mem, limit)
                        start = t0 + timedelta(hours=6 * i + j % 6, minutes=int(rng.integers(0, 60)))
                        stats = {
                            "peak": cpu * 1.3,
                            "p99": cpu * 1.15,
                            "p95": cpu,
                            "p75": cpu * 0.8,
                            "p50": cpu * 0.6,
                            "avg": cpu * 0.6,
                        }
                        batch.append(
                            {
                                "org": "acme", "repo": f"repo-{j // 8}", "workflow": "ci.yml", "job": f"{kind}-{j}",
                                "run_id": str(i),
                                "started_at": start.isoformat().replace("+00:00", "Z"),
                                "finished_at": (start + timedelta(seconds=float(rng.uniform(300, 1500)))).isoformat().replace("+00:00", "Z"),
                                "node_memory_bytes": 32 << 30,
                                "containers": [{"name": "build", "cpu_stats_millicores": stats, "memory_peak_bytes": mem,
                                                "memory_limit_bytes": limit, "oom_killed": killed}],
                            }
                        )  # fmt: skip
                    for k in range(0, len(batch), 500):
                        r = await client.post("/api/v1/runs:batch", json={"runs": batch[k : k + 500]})
                        r.raise_for_status()

    asyncio.run(post())
    print(f"stored {jobs} jobs x {runs} runs in {url}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet-db", help="store a synthetic fleet in this (migrated) database and exit")
    parser.add_argument("--fleet-jobs", type=int, default=32)
    parser.add_argument("--fleet-runs", type=int, default=120)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs-per-day", type=int, default=20)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--sample", type=int, default=5, help="jobs the reference walks for the ratio")
    parser.add_argument("--results", help="write the figures as JSON here (for bench/report.py)")
    args = parser.parse_args()
    if args.fleet_db:
        fleet(args.fleet_db, args.fleet_jobs, args.fleet_runs)
        return
    n = args.runs_per_day * args.days
    default = backtest.policies([backtest.Params()], baselines=True)
    ci_only = default[:1]
    # compiled vs reference, side by side on the same sample jobs
    t_c = t_r = 0.0
    for j in range(args.sample):
        cols = job_columns(n, seed=10_000 + j)
        t = time.perf_counter()
        got = walk_all(_sizing, cols, default)
        t_c += time.perf_counter() - t
        t = time.perf_counter()
        want = walk_all(_reference, cols, default)
        t_r += time.perf_counter() - t
        assert got == want, (got, want)
    ratio = t_r / t_c
    # the whole fleet with the compiled walk (generation of the columns timed apart)
    gen = walk_ci = walk_default = 0.0
    for j in range(args.jobs):
        t = time.perf_counter()
        cols = job_columns(n, seed=j)
        gen += time.perf_counter() - t
        t = time.perf_counter()
        walk_all(_sizing, cols, ci_only)
        walk_ci += time.perf_counter() - t
        t = time.perf_counter()
        walk_all(_sizing, cols, default[1:])
        walk_default += time.perf_counter() - t
        if j % 100 == 99:
            print(f"  {j + 1} jobs", file=sys.stderr, flush=True)
    walk_default += walk_ci
    runs = args.jobs * n
    print(f"{args.jobs:,} jobs x {n:,} runs = {runs:,} runs")
    print(f"ci-sizer defaults, compiled:            {walk_ci:6.1f} s ({runs / walk_ci / 1e6:.1f} M runs/s)")
    print(f"default report ({len(default)} policies), compiled: {walk_default:6.1f} s")
    print(f"compiled vs reference ({args.sample} jobs, {len(default)} policies): {ratio:.0f}x")
    print(f"(generating the columns took {gen:.1f} s, not counted)")
    rows = [
        {
            "figure": f"backtest {runs:,} runs, ci-sizer defaults",
            "cython_s": round(walk_ci, 1),
            "target": "< 60 s",
            "result": verdict(walk_ci < 60),
        },
        {
            "figure": f"backtest {runs:,} runs, default report ({len(default)} policies)",
            "cython_s": round(walk_default, 1),
            "target": "(reported)",
            "result": "-",
        },
        {
            "figure": f"compiled vs reference, {args.sample} jobs x {n:,} runs",
            "cython_s": round(t_c, 2),
            "reference_s": round(t_r, 1),
            "ratio": round(ratio, 1),
            "target": "(reported)",
            "result": "-",
        },
    ]
    save(
        args.results,
        "backtest",
        rows,
        ["histories generated in memory; reading them from the database is not included"],
    )


if __name__ == "__main__":
    main()
