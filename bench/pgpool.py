"""A SELECT by primary key through asyncpg's stock ``Pool`` against service/pgpool.py's lean pool, in
the same run: 32 concurrent tasks, each acquiring a connection, reading one row of ``jobs`` by its
id and releasing it, for a fixed time. Rounds alternate between the two pools; the figures are the
medians. asyncpg's pool resets a connection on release (a round trip); the lean pool does not.

    python bench/pgpool.py [--database-url postgresql://...] [--seconds 3] [--rounds 3] [--size 8]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from bench import _load
from bench._util import save
from service.pgpool import Pool

QUERY = "SELECT id, org, repo, workflow, job FROM jobs WHERE id = $1"


async def drive(acquire: Any, *, jobs: int, seconds: float, tasks: int) -> tuple[float, float]:
    """Queries per second and p99 latency (ms) of ``tasks`` loops of acquire + fetchrow."""
    stop = time.perf_counter() + seconds
    latencies: list[float] = []

    async def loop(seed: int) -> None:
        rng = random.Random(seed)
        while (now := time.perf_counter()) < stop:
            async with acquire() as conn:
                row = await conn.fetchrow(QUERY, rng.randint(1, jobs))
            assert row is not None
            latencies.append(time.perf_counter() - now)

    started = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(tasks)))
    took = time.perf_counter() - started
    latencies.sort()
    return len(latencies) / took, latencies[int(len(latencies) * 0.99)] * 1000


async def bench(url: str, args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    dsn = _load._plain(url)
    stock = await asyncpg.create_pool(dsn, min_size=args.size, max_size=args.size)
    lean = Pool(dsn, size=args.size)
    results: dict[str, list[tuple[float, float]]] = {"asyncpg Pool": [], "service.pgpool": []}
    try:
        for acquire in (stock.acquire, lean.acquire):
            await drive(acquire, jobs=args.jobs, seconds=0.5, tasks=args.tasks)  # warm: open every connection
        for r in range(args.rounds):
            for name, acquire in (("asyncpg Pool", stock.acquire), ("service.pgpool", lean.acquire)):
                qps, p99 = await drive(acquire, jobs=args.jobs, seconds=args.seconds, tasks=args.tasks)
                results[name].append((qps, p99))
                print(f"  round {r + 1} {name:<16}{qps:>10.0f} q/s  p99 {p99:.2f} ms", flush=True)
    finally:
        await stock.close()
        await lean.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a PostgreSQL server (a database ci_sizer_bench_pgpool is made on it)")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--results", help="write the figures as JSON here (for bench/report.py)")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()  # the loop the server runs on
    except ImportError:
        pass

    server, owned = _load.server_url(args.database_url)
    try:
        url = _load.run(_load.fresh_database(server, "ci_sizer_bench_pgpool"))
        _load.run(_load.load(url, jobs=args.jobs, runs_per_job=1))
        results = _load.run(bench(url, args))
    finally:
        if owned is not None:
            owned.close()
    med = {
        name: (statistics.median(q for q, _ in r), statistics.median(p for _, p in r)) for name, r in results.items()
    }
    stock, lean = med["asyncpg Pool"], med["service.pgpool"]
    print()
    for name, (qps, p99) in med.items():
        print(f"{name:<16}{qps:>10.0f} q/s  p99 {p99:.2f} ms")
    print(f"lean / stock: {lean[0] / stock[0]:.2f}x")
    save(
        args.results,
        "pgpool",
        [
            {
                "figure": f"SELECT by PK, acquire+release per query, pool of {args.size}, {args.tasks} tasks: lean pool vs asyncpg Pool",
                "stock_qps": round(stock[0]),
                "lean_qps": round(lean[0]),
                "ratio": round(lean[0] / stock[0], 2),
                "stock_p99_ms": round(stock[1], 2),
                "lean_p99_ms": round(lean[1], 2),
                "target": "(no target; reported)",
                "result": "-",
            }
        ],
    )


if __name__ == "__main__":
    main()
