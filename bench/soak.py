"""Soak: mixed ingest and sizing against a live ``ci-sizer serve`` for a set time.

Prints requests, errors, p50/p99 per kind, and how many acknowledged (201) runs were verified
present at the end (each is posted again in batches and must answer 200 "duplicate").
Not a test: it prints figures.

    python bench/soak.py --seconds 60                       # starts a server on a temp SQLite file
    python bench/soak.py --seconds 60 --database-url postgresql://postgres@127.0.0.1:5432/soak
    python bench/soak.py --seconds 60 --url http://127.0.0.1:8080   # an already running server
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.live import LiveServer

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def body(job: int, n: int) -> dict[str, Any]:
    rng = random.Random(job * 100_003 + n)
    return {
        "org": "soak",
        "repo": f"repo-{job % 7}",
        "workflow": ".github/workflows/ci.yml",
        "job": f"job-{job}",
        "run_id": f"{job}-{n}",
        "finished_at": (T0 + timedelta(seconds=n)).isoformat().replace("+00:00", "Z"),
        "containers": [
            {
                "name": "build",
                "cpu_samples_millicores": [rng.uniform(50, 2000) for _ in range(120)],
                "memory_peak_bytes": rng.randint(200, 3000) * 2**20,
            }
        ],
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


async def soak(url: str, seconds: float, concurrency: int, jobs: int, ingest_share: float) -> int:
    latencies: dict[str, list[float]] = {"ingest": [], "sizing": []}
    errors: dict[str, int] = {"ingest": 0, "sizing": 0}
    acknowledged: list[tuple[int, int]] = []
    counter = 0
    stop_at = time.monotonic() + seconds

    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def worker(seed: int) -> None:
            nonlocal counter
            rng = random.Random(seed)
            while time.monotonic() < stop_at:
                job = rng.randrange(jobs)
                if rng.random() < ingest_share:
                    counter += 1
                    n = counter
                    started = time.perf_counter()
                    try:
                        r = await client.post("/api/v1/runs", json=body(job, n))
                        ok = r.status_code == 201
                    except httpx.HTTPError:
                        ok = False
                    latencies["ingest"].append(time.perf_counter() - started)
                    if ok:
                        acknowledged.append((job, n))
                    else:
                        errors["ingest"] += 1
                else:
                    path = f"/api/v1/sizing/soak/repo-{job % 7}/.github%2Fworkflows%2Fci.yml/job-{job}"
                    started = time.perf_counter()
                    try:
                        r = await client.get(path)
                        ok = r.status_code == 200 and not r.json()["meta"]["degraded"]
                    except httpx.HTTPError:
                        ok = False
                    latencies["sizing"].append(time.perf_counter() - started)
                    if not ok:
                        errors["sizing"] += 1

        began = time.monotonic()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.monotonic() - began

        verified = 0
        missing = 0
        for i in range(0, len(acknowledged), 500):
            chunk = acknowledged[i : i + 500]
            r = await client.post("/api/v1/runs:batch", json={"runs": [body(j, n) for j, n in chunk]}, timeout=120)
            for item in r.json()["results"]:
                if item["status"] == 200:
                    verified += 1
                else:
                    missing += 1

    total = sum(len(v) for v in latencies.values())
    print(f"duration            {elapsed:.1f} s, concurrency {concurrency}, {jobs} jobs")
    print(f"requests            {total} ({total / elapsed:.0f}/s)")
    for kind in ("ingest", "sizing"):
        ms = [v * 1000 for v in latencies[kind]]
        print(
            f"{kind:<19} {len(ms)} requests, {errors[kind]} errors, "
            f"p50 {percentile(ms, 50):.1f} ms, p99 {percentile(ms, 99):.1f} ms"
        )
    print(f"runs acknowledged   {len(acknowledged)}")
    print(f"verified present    {verified} (missing {missing})")
    return 0 if missing == 0 and not any(errors.values()) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--jobs", type=int, default=50)
    p.add_argument("--ingest-share", type=float, default=0.2)
    p.add_argument("--url", help="a running server; otherwise one is started")
    p.add_argument("--database-url", help="database for the server this script starts (default: temp SQLite)")
    a = p.parse_args()
    if a.url:
        return asyncio.run(soak(a.url, a.seconds, a.concurrency, a.jobs, a.ingest_share))
    with tempfile.TemporaryDirectory() as tmp:
        db = a.database_url or f"sqlite:///{tmp}/soak.db"
        with LiveServer(db, "--log-level", "warning", "--retention-runs", "1000000", log=Path(tmp) / "serve.log") as s:
            return asyncio.run(soak(s.url, a.seconds, a.concurrency, a.jobs, a.ingest_share))


if __name__ == "__main__":
    sys.exit(main())
