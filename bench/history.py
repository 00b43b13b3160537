"""Sizing latency against history size: 1,000 vs 1,000,000 stored runs (PostgreSQL).

Two live ``ci-sizer serve`` processes with the answer cache off (every request reads the
database), one on a database of 50 jobs x 20 runs, one on 5,000 jobs x 200 runs (200 is the
default retention), hammered in alternating rounds by wrk with one connection on random jobs.

Target: p50 ratio (1,000,000 / 1,000) <= 1.2. Not a test: it prints figures.

    python bench/history.py [--database-url postgresql://...] [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import statistics
import tempfile

from bench import _load, _wrk
from bench._util import save, verdict
from tests.live import LiveServer

SHAPES = {"1,000 runs": (50, 20), "1,000,000 runs": (5_000, 200)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a PostgreSQL server (databases ci_sizer_bench_h* are made on it)")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", help="write the figures as JSON here (for bench/report.py)")
    args = parser.parse_args()
    if not _wrk.available():
        sys.exit("wrk is not installed: apt-get install wrk")

    server, owned = _load.server_url(args.database_url)
    try:
        urls = {}
        for n, (name, (jobs, per_job)) in enumerate(SHAPES.items()):
            urls[name] = _load.run(_load.fresh_database(server, f"ci_sizer_bench_h{n}"))
            print(f"loading {name} ({jobs:,} jobs x {per_job}) ...", flush=True)
            took = _load.run(_load.load(urls[name], jobs=jobs, runs_per_job=per_job, seed=n + 1))
            print(f"loaded in {took:.1f} s", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            servers = {
                name: LiveServer(
                    url, "--sizing-cache-entries", "0", "--log-level", "warning", log=Path(tmp, f"{n}.log")
                )
                for n, (name, url) in enumerate(urls.items())
            }
            try:
                for s in servers.values():
                    s.start()
                figs: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
                for r in range(args.rounds):
                    for name, s in servers.items():
                        jobs = SHAPES[name][0]
                        fig = _wrk.run(
                            s.url,
                            [_load.sizing_path(i) for i in range(jobs)],
                            seconds=args.seconds,
                            connections=1,
                            seed=r + 1,
                        )
                        figs[name].append(fig)
                        print(
                            f"  round {r + 1} {name:<16} p50 {fig['p50_ms']:.3f} ms  p99 {fig['p99_ms']:.3f} ms  {fig['rps']:.0f} req/s  errors {fig['errors']}",
                            flush=True,
                        )
            finally:
                for s in servers.values():
                    s.stop()
    finally:
        if owned is not None:
            owned.close()
    small, big = (
        {k: statistics.median(f[k] for f in figs[name]) for k in ("p50_ms", "p99_ms", "rps")} for name in SHAPES
    )
    ratio = big["p50_ms"] / small["p50_ms"]
    print()
    print(f"{'':<18}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}")
    for name, fig in zip(SHAPES, (small, big), strict=True):
        print(f"{name:<18}{fig['p50_ms']:>10.3f}{fig['p99_ms']:>10.3f}{fig['rps']:>10.0f}")
    print(f"p50 ratio 1,000,000 / 1,000: {ratio:.2f} (target <= 1.2: {verdict(ratio <= 1.2)})")
    save(
        args.results,
        "history",
        [
            {
                "figure": "GET sizing p50, cache off, 1 connection: 1,000,000 vs 1,000 stored runs",
                "small_p50_ms": round(small["p50_ms"], 3),
                "big_p50_ms": round(big["p50_ms"], 3),
                "small_p99_ms": round(small["p99_ms"], 3),
                "big_p99_ms": round(big["p99_ms"], 3),
                "ratio": round(ratio, 2),
                "target": "p50 ratio <= 1.2",
                "result": verdict(ratio <= 1.2),
            }
        ],
    )


if __name__ == "__main__":
    main()
