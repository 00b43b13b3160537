"""The sizing call over HTTP: a live ``ci-sizer serve`` (one worker, PostgreSQL) with 10,000 jobs x
20 runs loaded, hammered by wrk on random known jobs, against a bare FastAPI app on the same stack
answering a constant JSON of the same size from a route of the same path shape (bench/bare_app.py).
Rounds alternate between the two so that noise on this shared machine falls on both alike.

Target: ratio >= 0.8 and p99 <= 20 ms at 32 connections. Also printed, without a target: the same
load with the answer cache off (every request reads the database), which is what a build that
follows its job's previous ingest gets.

    python bench/http.py [--database-url postgresql://...] [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench import _load, _wrk
from bench._util import ROOT, save, verdict
from tests.live import LiveServer


class BareApp(LiveServer):
    def __init__(self, body_file: Path, log: Path) -> None:
        super().__init__("", log=log, env={"BARE_SIZING_BODY_FILE": str(body_file)})

    def command(self) -> list[str]:
        return [sys.executable, str(ROOT / "bench" / "bare_app.py"), "--port", str(self.port)]


async def warm(url: str, paths: list[str], concurrency: int = 32) -> None:
    """Each job once, so that the measured rounds are not the first request of any job."""
    queue = list(paths)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def worker() -> None:
            while queue:
                r = await client.get(queue.pop())
                r.raise_for_status()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def rounds(
    servers: dict[str, str], n: int, measure: Callable[[str, int], dict[str, Any]]
) -> dict[str, dict[str, float]]:
    """``measure(url, seed)`` on each server in turn, ``n`` rounds; the median of each figure."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    for r in range(n):
        for name, url in servers.items():
            fig = measure(url, r + 1)
            results[name].append(fig)
            print(
                f"  round {r + 1} {name:<16} {fig['rps']:>8.0f} req/s  p50 {fig['p50_ms']:.2f} ms  p99 {fig['p99_ms']:.2f} ms  errors {fig['errors']}",
                flush=True,
            )
    return {
        name: {
            "rps": statistics.median(f["rps"] for f in figs),
            "p50_ms": statistics.median(f["p50_ms"] for f in figs),
            "p99_ms": statistics.median(f["p99_ms"] for f in figs),
            "errors": sum(f["errors"] for f in figs),
        }
        for name, figs in results.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a PostgreSQL server (a database ci_sizer_bench_http is made on it)")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs-per-job", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--results", help="write the figures as JSON here (for bench/report.py)")
    args = parser.parse_args()
    if not _wrk.available():
        sys.exit("wrk is not installed: apt-get install wrk")

    server, owned = _load.server_url(args.database_url)
    try:
        url = _load.run(_load.fresh_database(server, "ci_sizer_bench_http"))
        print(f"loading {args.jobs:,} jobs x {args.runs_per_job} runs ...", flush=True)
        took = _load.run(_load.load(url, jobs=args.jobs, runs_per_job=args.runs_per_job))
        print(f"loaded in {took:.1f} s", flush=True)
        paths = [_load.sizing_path(i) for i in range(args.jobs)]
        with tempfile.TemporaryDirectory() as tmp:
            figures = bench(url, paths, Path(tmp), args)
    finally:
        if owned is not None:
            owned.close()
    cached, bare, uncached = figures["ci-sizer"], figures["bare FastAPI"], figures["ci-sizer, no cache"]
    ratio = cached["rps"] / bare["rps"]
    ratio_uncached = uncached["rps"] / bare["rps"]
    print()
    print(f"{'':<22}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}")
    for name, fig in (("bare FastAPI", bare), ("ci-sizer", cached), ("ci-sizer, no cache", uncached)):
        print(f"{name:<22}{fig['rps']:>10.0f}{fig['p50_ms']:>10.2f}{fig['p99_ms']:>10.2f}{fig['errors']:>8}")
    print(f"ratio ci-sizer / bare: {ratio:.2f} (target >= 0.8: {verdict(ratio >= 0.8)}); "
          f"p99 {cached['p99_ms']:.2f} ms (target <= 20 ms: {verdict(cached['p99_ms'] <= 20)})")  # fmt: skip
    print(f"ratio without the cache: {ratio_uncached:.2f}")
    rows = [
        {
            "figure": (
                f"GET sizing on a warm answer cache (each job asked once before), {args.jobs:,} jobs x "
                f"{args.runs_per_job} runs, {args.connections} connections: not what runners make (see mixed)"
            ),
            "ci_sizer_rps": round(cached["rps"]),
            "bare_rps": round(bare["rps"]),
            "ratio": round(ratio, 2),
            "ci_sizer_p50_ms": round(cached["p50_ms"], 2),
            "ci_sizer_p99_ms": round(cached["p99_ms"], 2),
            "bare_p50_ms": round(bare["p50_ms"], 2),
            "bare_p99_ms": round(bare["p99_ms"], 2),
            "target": "ratio >= 0.8, p99 <= 20 ms",
            "result": verdict(ratio >= 0.8 and cached["p99_ms"] <= 20),
        },
        {
            "figure": "GET sizing, answer cache off (every request reads PostgreSQL)",
            "ci_sizer_rps": round(uncached["rps"]),
            "bare_rps": round(bare["rps"]),
            "ratio": round(ratio_uncached, 2),
            "ci_sizer_p50_ms": round(uncached["p50_ms"], 2),
            "ci_sizer_p99_ms": round(uncached["p99_ms"], 2),
            "target": "(no target; reported)",
            "result": "-",
        },
    ]
    save(args.results, "http", rows)


def bench(url: str, paths: list[str], tmp: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    def measure(server: str, seed: int) -> dict[str, Any]:
        return _wrk.run(server, paths, seconds=args.seconds, connections=args.connections, seed=seed)

    common = ("--log-level", "info")  # production defaults: one JSON access line per request (to a file here)
    with LiveServer(url, *common, log=tmp / "ci-sizer.log") as ours:
        answer = httpx.get(ours.url + paths[0], timeout=10)
        answer.raise_for_status()
        (tmp / "answer.json").write_bytes(answer.content)
        print(f"answer body: {len(answer.content)} bytes; warming {len(paths):,} jobs ...", flush=True)
        asyncio.run(warm(ours.url, paths))
        with BareApp(tmp / "answer.json", tmp / "bare.log") as bare:
            assert httpx.get(bare.url + paths[1]).content == answer.content
            figures = rounds({"bare FastAPI": bare.url, "ci-sizer": ours.url}, args.rounds, measure)
    with LiveServer(url, *common, "--sizing-cache-entries", "0", log=tmp / "ci-sizer-nocache.log") as nocache:
        figures.update(rounds({"ci-sizer, no cache": nocache.url}, args.rounds, measure))
    return figures


if __name__ == "__main__":
    main()
