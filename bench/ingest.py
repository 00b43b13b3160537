"""Ingest throughput: runs of 1 container x 3,600 CPU samples posted to a live ``ci-sizer serve``
(one worker, PostgreSQL; each a new run, stored and committed), against the bare FastAPI app
parsing the same body into a pydantic model of the same shape (bench/bare_app.py). wrk posts
with 16 connections; rounds alternate between the two.

Targets: >= 400 runs/s, ratio >= 0.5. Not a test: it prints figures.

    python bench/ingest.py [--database-url postgresql://...] [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import random
import statistics
import tempfile

import httpx
import orjson

from bench import _load, _wrk
from bench._util import save, verdict
from bench.http import BareApp
from tests.live import LiveServer

SAMPLES = 3_600


def body_template(seed: int = 7) -> bytes:
    """A run body with ``@RUN@`` where wrk puts a unique run id."""
    rng = random.Random(seed)
    samples = [round(max(0.0, rng.gauss(900.0, 300.0)), 3) for _ in range(SAMPLES)]
    run = {
        "org": "bench",
        "repo": "ingest",
        "workflow": "ci.yml",
        "job": "build",
        "run_id": "@RUN@",
        "finished_at": "2026-11-20T10:00:00Z",
        "containers": [{"name": "build", "cpu_samples_millicores": samples, "memory_peak_bytes": 1_500_000_000}],
    }
    return orjson.dumps(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a PostgreSQL server (a database ci_sizer_bench_ingest is made on it)")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--results", help="write the figures as JSON here (for bench/report.py)")
    args = parser.parse_args()
    if not _wrk.available():
        sys.exit("wrk is not installed: apt-get install wrk")

    body = body_template()
    print(f"body: {len(body):,} bytes ({SAMPLES:,} samples)", flush=True)
    server, owned = _load.server_url(args.database_url)
    try:
        url = _load.run(_load.fresh_database(server, "ci_sizer_bench_ingest"))
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "answer.json").write_bytes(b"{}")
            with (
                LiveServer(url, "--log-level", "info", log=Path(tmp, "ci-sizer.log")) as ours,
                BareApp(Path(tmp, "answer.json"), Path(tmp, "bare.log")) as bare,
            ):
                # one post through each first: both must accept the body as a new run
                for target in (ours.url, bare.url):
                    r = httpx.post(
                        target + "/api/v1/runs",
                        content=body.replace(b"@RUN@", b"check"),
                        headers={"content-type": "application/json"},
                        timeout=30,
                    )
                    assert r.status_code == 201, r.text
                figs: dict[str, list[dict[str, float]]] = {"bare FastAPI": [], "ci-sizer": []}
                for r_ in range(args.rounds):
                    for name, target in (("bare FastAPI", bare.url), ("ci-sizer", ours.url)):
                        fig = _wrk.run(
                            target,
                            ["/api/v1/runs"],
                            seconds=args.seconds,
                            connections=args.connections,
                            body=body,
                            seed=r_ + 1,
                        )
                        figs[name].append(fig)
                        print(
                            f"  round {r_ + 1} {name:<14} {fig['rps']:>7.0f} runs/s  p50 {fig['p50_ms']:.1f} ms  p99 {fig['p99_ms']:.1f} ms  errors {fig['errors']}",
                            flush=True,
                        )
                stored = httpx.get(ours.url + "/metrics").text
    finally:
        if owned is not None:
            owned.close()
    created = next(
        float(line.split()[-1])
        for line in stored.splitlines()
        if line.startswith('ci_sizer_runs_ingested_total{result="created"}')
    )
    bare_f, ours_f = (
        {k: statistics.median(f[k] for f in figs[name]) for k in ("rps", "p50_ms", "p99_ms")}
        for name in ("bare FastAPI", "ci-sizer")
    )
    errors = sum(f["errors"] for f in figs["ci-sizer"])
    ratio = ours_f["rps"] / bare_f["rps"]
    ok = ours_f["rps"] >= 400 and ratio >= 0.5
    print()
    print(f"{'':<14}{'runs/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for name, fig in (("bare FastAPI", bare_f), ("ci-sizer", ours_f)):
        print(f"{name:<14}{fig['rps']:>10.0f}{fig['p50_ms']:>10.1f}{fig['p99_ms']:>10.1f}")
    print(f"runs stored (201): {created:.0f}; errors or non-2xx: {errors}")
    print(f"ci-sizer {ours_f['rps']:.0f} runs/s (target >= 400: {verdict(ours_f['rps'] >= 400)}); "
          f"ratio {ratio:.2f} (target >= 0.5: {verdict(ratio >= 0.5)})")  # fmt: skip
    save(
        args.results,
        "ingest",
        [
            {
                "figure": f"POST runs, 1 container x {SAMPLES:,} samples, {args.connections} connections",
                "ci_sizer_rps": round(ours_f["rps"]),
                "bare_rps": round(bare_f["rps"]),
                "ratio": round(ratio, 2),
                "ci_sizer_p99_ms": round(ours_f["p99_ms"], 1),
                "target": ">= 400 runs/s, ratio >= 0.5",
                "result": verdict(ok),
            }
        ],
    )


if __name__ == "__main__":
    main()
