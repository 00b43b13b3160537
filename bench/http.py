"""The sizing call over HTTP: a live ``ci-sizer serve`` (one worker, PostgreSQL) with 10,000 jobs x
20 runs loaded, hammered by wrk on random known jobs, against a bare FastAPI app on the same stack
answering a constant JSON of the same size from a route of the same path shape (bench/bare_app.py).
Rounds alternate between the two so that noise on this shared machine falls on both alike.

Target: ratio >= 0.8 and p99 <= 20 ms at 32 connections. Also printed, without a target: the same
load with the answer cache off (every request reads the database), which is what a build that
follows its job's previous ingest gets; and the cold start: a freshly started server asked for every
job once, in a random order (each GET the first of its job since the restart), beside the bare app.
Cold target (issue 20): ratio >= 0.8 and p99 <= 30 ms.

    python bench/http.py [--database-url postgresql://...] [--seconds 5] [--rounds 3]

``--sqlite``: the cold shape on SQLite (issue 38) instead: a SQLite file filled through
``POST /api/v1/runs:batch`` (``--cold-jobs`` jobs x 3-5 runs), then in each round a freshly started
server asked for each job once beside the bare app (no warm rounds). ``--baseline DIR``: one more
contestant in the cold rounds, another build's source tree (``git archive integ | tar -x -C DIR``,
with the compiled core copied into ``DIR/service/core``), started from ``DIR`` on the same database,
so that a change is measured side by side with what it replaces:

    python bench/http.py --sqlite --baseline /tmp/integ-tree
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench import _load, _wrk
from bench._util import ROOT, latencies, save, verdict
from tests.live import LiveServer


class BareApp(LiveServer):
    def __init__(self, body_file: Path, log: Path, *, workers: int = 1, loop: str = "uvloop") -> None:
        super().__init__("", log=log, env={"BARE_SIZING_BODY_FILE": str(body_file)})
        self.workers = workers
        self.loop = loop

    def command(self) -> list[str]:
        return [
            *(sys.executable, str(ROOT / "bench" / "bare_app.py")),
            *("--port", str(self.port), "--workers", str(self.workers), "--loop", self.loop),
        ]


def serve_loop(database_url: str) -> str:
    """The event loop ``ci-sizer serve`` runs on this database (``cli/serve.py``): the bare app beside
    it runs the same, so that both accept connections alike (docs/performance.md, "uvloop's accept")."""
    from service.cli.serve import event_loop
    from service.settings import Settings

    return "asyncio" if event_loop(Settings(database_url=database_url)) == "asyncio" else "uvloop"


class Checkout(LiveServer):
    """``ci-sizer serve`` from another source tree (``--baseline``): its ``service`` package first on the path."""

    def __init__(self, tree: Path, database_url: str, *args: str, log: Path) -> None:
        super().__init__(database_url, *args, log=log)
        self.tree = tree

    def command(self) -> list[str]:
        boot = f"import runpy, sys; sys.path.insert(0, {str(self.tree)!r}); runpy.run_module('service', run_name='__main__')"
        return [sys.executable, "-c", boot, *super().command()[3:]]


async def warm(url: str, paths: list[str], concurrency: int = 32) -> None:
    """Each job once, so that the measured rounds are not the first request of any job."""
    queue = list(paths)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def worker() -> None:
            while queue:
                r = await client.get(queue.pop())
                r.raise_for_status()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


#: every path once (in the order of the file): the first request of each job. When all have answered,
#: the script says so and wrk is interrupted (SIGINT: it then reports up to that moment). When the list
#: runs out before the last answers arrive, the few connections still asking repeat the last path.
COLD_SCRIPT = r"""
local paths = {}
local i = 0
local answered = 0

function init(args)
  for line in io.lines(args[1]) do paths[#paths + 1] = line end
end

function request()
  if i < #paths then i = i + 1 end
  return wrk.format("GET", paths[i])
end

function response(status, headers, body)
  answered = answered + 1
  if answered == #paths then io.write("COLDDONE\n"); io.flush() end
end
"""


def cold(url: str, paths: list[str], *, connections: int, seed: int, tmp: Path, cap: float = 20) -> dict[str, Any]:
    """Every path once, shuffled by ``seed``, through wrk: stopped when all have answered, or after
    ``cap`` seconds (every request is still the first of its job, so the figures hold; this keeps
    ``make bench`` bounded while the cold path is slow)."""
    order = list(paths)
    random.Random(seed).shuffle(order)
    path_file = tmp / f"cold-{seed}.txt"
    path_file.write_text("\n".join(order) + "\n")
    script = tmp / "cold.lua"
    script.write_text(COLD_SCRIPT + _wrk.DONE)
    command = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{cap:g}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        url,
        "--",
        str(path_file),
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("COLDDONE"):
                proc.send_signal(signal.SIGINT)
            if line.startswith("WRKJSON "):
                raw = json.loads(line.removeprefix("WRKJSON "))
    if proc.returncode != 0:
        raise RuntimeError("wrk failed:\n" + "".join(lines))
    return {
        "rps": raw["requests"] / (raw["duration_us"] / 1e6),
        "p50_ms": raw["p50_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "errors": raw["errors"] + raw["non_2xx"],
        "requests": raw["requests"],
    }


def rounds(
    servers: dict[str, str], n: int, measure: Callable[[str, int], dict[str, Any]]
) -> dict[str, dict[str, float]]:
    """``measure(url, seed)`` on each server in turn, ``n`` rounds; the median of each figure."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    for r in range(n):
        for name, url in servers.items():
            fig = measure(url, r + 1)
            results[name].append(fig)
            peak = f"  max {fig['max_ms']:.2f} ms" if "max_ms" in fig else ""
            print(
                f"  round {r + 1} {name:<16} {fig['rps']:>8.0f} req/s  p50 {fig['p50_ms']:.2f} ms  p99 {fig['p99_ms']:.2f} ms{peak}  errors {fig['errors']}",
                flush=True,
            )
    medians = ("rps", "p50_ms", "p99_ms", "max_ms", "app_cpu_us", "pg_cpu_us")  # the last three where measured
    return {
        name: {
            **{k: statistics.median(f[k] for f in figs) for k in medians if all(k in f for f in figs)},
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
    parser.add_argument("--cold-jobs", type=int, default=3000, help="jobs asked for in the cold-start rounds")
    parser.add_argument("--results", help="write the figures as JSON here (for bench/report.py)")
    parser.add_argument("--sqlite", action="store_true", help="the cold rounds on SQLite, filled through the API")
    parser.add_argument("--baseline", type=Path, help="another build's source tree, beside ci-sizer in the cold rounds")
    args = parser.parse_args()
    if not _wrk.available():
        sys.exit("wrk is not installed: apt-get install wrk")
    if args.sqlite:
        sqlite_main(args)
        return

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
    cold_ours, cold_bare = figures["ci-sizer, cold"], figures["bare FastAPI, cold"]
    ratio_cold = cold_ours["rps"] / cold_bare["rps"]
    cold_ok = ratio_cold >= 0.8 and cold_ours["p99_ms"] <= 30
    ratio = cached["rps"] / bare["rps"]
    ratio_uncached = uncached["rps"] / bare["rps"]
    print()
    print(f"{'':<22}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}")
    for name, fig in (
        ("bare FastAPI", bare),
        ("ci-sizer", cached),
        ("ci-sizer, no cache", uncached),
        ("bare FastAPI, cold", cold_bare),
        ("ci-sizer, cold", cold_ours),
    ):
        print(f"{name:<22}{fig['rps']:>10.0f}{fig['p50_ms']:>10.2f}{fig['p99_ms']:>10.2f}{fig['errors']:>8}")
    print(f"ratio ci-sizer / bare: {ratio:.2f} (target >= 0.8: {verdict(ratio >= 0.8)}); "
          f"p99 {cached['p99_ms']:.2f} ms (target <= 20 ms: {verdict(cached['p99_ms'] <= 20)})")  # fmt: skip
    print(f"ratio without the cache: {ratio_uncached:.2f}")
    print(
        f"cold start (first GET of each of {min(args.cold_jobs, args.jobs):,} jobs after a restart): ratio {ratio_cold:.2f}, "
        f"p99 {cold_ours['p99_ms']:.2f} ms (target ratio >= 0.8, p99 <= 30 ms: {verdict(cold_ok)})"
    )
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
        {
            "figure": (
                f"cold start: a server just restarted, the first GET of each of {min(args.cold_jobs, args.jobs):,} of "
                f"{args.jobs:,} jobs (random order, history present), {args.connections} connections, PostgreSQL"
            ),
            "ci_sizer_rps": round(cold_ours["rps"]),
            "bare_rps": round(cold_bare["rps"]),
            "ratio": round(ratio_cold, 2),
            "ci_sizer_p50_ms": round(cold_ours["p50_ms"], 2),
            "ci_sizer_p99_ms": round(cold_ours["p99_ms"], 2),
            "bare_p50_ms": round(cold_bare["p50_ms"], 2),
            "bare_p99_ms": round(cold_bare["p99_ms"], 2),
            "target": "ratio >= 0.8, p99 <= 30 ms",
            "result": verdict(cold_ok),
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
    figures.update(cold_rounds(url, paths, tmp, args))
    return figures


def cold_rounds(url: str, paths: list[str], tmp: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Each round restarts ci-sizer (an empty answer cache, a new process) and asks for each of
    ``--cold-jobs`` jobs once (a different sample each round); the bare app, restarted too, answers the
    same sequence; with ``--baseline``, the other build too, on the same sample."""
    results: dict[str, list[dict[str, Any]]] = {"bare FastAPI, cold": [], "ci-sizer, cold": []}
    if args.baseline is not None:
        results["baseline, cold"] = []
    for r in range(args.rounds):
        sample = random.Random(r).sample(paths, min(args.cold_jobs, len(paths)))
        with BareApp(tmp / "answer.json", tmp / "bare-cold.log", loop=serve_loop(url)) as bare:
            results["bare FastAPI, cold"].append(
                cold(bare.url, paths, connections=args.connections, seed=r + 1, tmp=tmp)
            )
        with LiveServer(url, "--log-level", "info", log=tmp / "ci-sizer-cold.log") as ours:
            results["ci-sizer, cold"].append(cold(ours.url, sample, connections=args.connections, seed=r + 1, tmp=tmp))
        if args.baseline is not None:
            with Checkout(args.baseline, url, "--log-level", "info", log=tmp / "baseline-cold.log") as other:
                results["baseline, cold"].append(
                    cold(other.url, sample, connections=args.connections, seed=r + 1, tmp=tmp)
                )
        for name, figs in results.items():
            fig = figs[-1]
            print(
                f"  round {r + 1} {name:<20} {fig['rps']:>8.0f} req/s  p50 {fig['p50_ms']:.2f} ms  "
                f"p99 {fig['p99_ms']:.2f} ms  errors {fig['errors']}  requests {fig['requests']}",
                flush=True,
            )
    medians = ("rps", "p50_ms", "p99_ms", "app_cpu_us", "pg_cpu_us")  # the last two where measured
    return {
        name: {
            **{k: statistics.median(f[k] for f in figs) for k in medians if all(k in f for f in figs)},
            "errors": sum(f["errors"] for f in figs),
        }
        for name, figs in results.items()
    }


def fill_sqlite(url: str, jobs: int, tmp: Path) -> None:
    """``jobs`` jobs x 3-5 runs through ``POST /api/v1/runs:batch`` (SQLite has no COPY)."""
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC).replace(tzinfo=None)
    rng = random.Random(1)
    bodies = []
    for i in range(jobs):
        org, repo, workflow, name = _load.job_key(i)
        cpu, mem = rng.uniform(100, 3000), rng.randint(200, 6000) * 2**20
        for n in range(3 + i % 3):
            finished = now - timedelta(hours=6 * n + i % 6)
            stats = {
                k: cpu * f
                for k, f in zip(("peak", "p99", "p95", "p75", "p50", "avg"), (1.4, 1.3, 1.2, 1, 0.8, 0.7), strict=True)
            }
            helper = {
                "name": "helper",
                "cpu_stats_millicores": {k: v / 10 for k, v in stats.items()},
                "memory_peak_bytes": mem // 10,
            }
            bodies.append(
                {
                    "org": org, "repo": repo, "workflow": workflow, "job": name, "run_id": f"run-{n}",
                    "started_at": (finished - timedelta(minutes=12)).isoformat() + "Z",
                    "finished_at": finished.isoformat() + "Z", "node_memory_bytes": 16 * 2**30,
                    "containers": [{"name": "build", "cpu_stats_millicores": stats,
                                    "memory_peak_bytes": int(mem * rng.uniform(0.8, 1.2))}, helper],
                }
            )  # fmt: skip
    with LiveServer(url, "--log-level", "warning", log=tmp / "load.log") as live:
        with httpx.Client(base_url=live.url, timeout=120) as client:
            for first in range(0, len(bodies), 500):
                r = client.post("/api/v1/runs:batch", json={"runs": bodies[first : first + 500]})
                assert r.status_code == 200, r.text
                print(f"  loaded {min(first + 500, len(bodies)):,} / {len(bodies):,} runs", end="\r", flush=True)
    print()


def filled_sqlite(tmp: Path, name: str, jobs: int) -> str:
    """The URL of a SQLite file ``tmp/name``, migrated and filled with ``jobs`` jobs through the API."""
    url = f"sqlite:///{tmp}/{name}"
    _load.migrate(url)
    print(f"filling {jobs:,} jobs x 3-5 runs through the API ...", flush=True)
    fill_sqlite(url, jobs, tmp)
    return url


def sqlite_main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        url = filled_sqlite(tmp, "bench-http.db", args.cold_jobs)
        paths = [_load.sizing_path(i) for i in range(args.cold_jobs)]
        with LiveServer(url, log=tmp / "answer.log") as once:
            answer = httpx.get(once.url + paths[0], timeout=10)
            answer.raise_for_status()
            (tmp / "answer.json").write_bytes(answer.content)
        figures = cold_rounds(url, paths, tmp, args)
    print()
    print(f"{'':<22}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}")
    for name, fig in figures.items():
        print(f"{name:<22}{fig['rps']:>10.0f}{fig['p50_ms']:>10.2f}{fig['p99_ms']:>10.2f}{fig['errors']:>8}")
    ours, bare = figures["ci-sizer, cold"], figures["bare FastAPI, cold"]
    ok = ours["p99_ms"] <= 30
    print(
        f"SQLite cold start (first GET of each of {args.cold_jobs:,} jobs after a restart): ratio "
        f"{ours['rps'] / bare['rps']:.2f}, p99 {ours['p99_ms']:.2f} ms (target p99 <= 30 ms: {verdict(ok)})"
    )
    if "baseline, cold" in figures:
        base = figures["baseline, cold"]
        print(f"against the baseline: p99 {base['p99_ms']:.2f} -> {ours['p99_ms']:.2f} ms, "
              f"req/s {base['rps']:.0f} -> {ours['rps']:.0f}")  # fmt: skip
    rows = [
        {
            "figure": (
                f"cold start on SQLite: a server just restarted, the first GET of each of {args.cold_jobs:,} jobs "
                f"(3-5 runs each, filled through the API), {args.connections} connections"
            ),
            "ci_sizer_rps": round(ours["rps"]),
            "bare_rps": round(bare["rps"]),
            "ratio": round(ours["rps"] / bare["rps"], 2),
            **latencies(ours, bare, with_max=False),
            "target": "p99 <= 30 ms",
            "result": verdict(ok),
        }
    ]
    if "baseline, cold" in figures:
        rows[0]["baseline_rps"] = round(figures["baseline, cold"]["rps"])
        rows[0]["baseline_p99_ms"] = round(figures["baseline, cold"]["p99_ms"], 2)
    save(args.results, "http-sqlite", rows)


if __name__ == "__main__":
    main()
