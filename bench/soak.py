"""Soak: mixed ingest and sizing against a live ``ci-sizer serve`` for a set time, optionally
through a database outage.

Prints, per phase: answers served, errors, p50/p99 per kind, degraded sizing answers, 503s (the
answer to retry), 5xx other than a 503 with Retry-After (must be 0) and requests with no answer
within the client timeout (must be 0); at the end how many acknowledged (201) runs were verified
present (each is posted again in batches and must answer 200 "duplicate"; lost must be 0).
Not a test: it prints figures.

    python bench/soak.py --seconds 60                       # starts a server on a temp SQLite file
    python bench/soak.py --seconds 60 --database-url postgresql://postgres@127.0.0.1:5432/soak
    python bench/soak.py --seconds 60 --url http://127.0.0.1:8080   # an already running server

Outages (PostgreSQL; a fresh database is created on the server and dropped at the end, and the
server itself is never stopped: a proxy in front of it hangs or vanishes). Three phases of
``--seconds`` each: healthy, outage, recovered.

    python bench/soak.py --outage hung --seconds 20 --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/soak.py --outage unix-socket --seconds 20 --database-url postgresql://postgres@127.0.0.1:5432/postgres

``hung``: the server reaches PostgreSQL over TCP through the proxy, which during the outage
passes no byte and answers no new connection. ``unix-socket``: the server's URL is a Unix socket
(``postgresql:///db?host=DIR``); during the outage the socket file is gone.
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root instead of bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.engine import make_url

from bench._proxy import Proxy
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


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"ingest": [], "sizing": []})
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: {"ingest": Counter(), "sizing": Counter()})
    degraded: int = 0
    server_errors: int = 0  # 5xx other than 503 with Retry-After
    unanswered: int = 0  # no answer within the client timeout, or the connection broke
    elapsed: float = 0.0


#: (phase name, seconds, what to do as it begins)
Phase = tuple[str, float, Callable[[], Awaitable[None]] | None]


async def soak(url: str, phases: list[Phase], concurrency: int, jobs: int, ingest_share: float) -> int:
    tallies = {name: Tally() for name, _, _ in phases}
    acknowledged: list[tuple[int, int]] = []
    counter = 0
    current = phases[0][0]
    done = False

    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def worker(seed: int) -> None:
            nonlocal counter
            rng = random.Random(seed)
            while not done:
                t = tallies[current]
                job = rng.randrange(jobs)
                ingest = rng.random() < ingest_share
                kind = "ingest" if ingest else "sizing"
                started = time.perf_counter()
                try:
                    if ingest:
                        counter += 1
                        n = counter
                        r = await client.post("/api/v1/runs", json=body(job, n))
                        if r.status_code == 201:
                            acknowledged.append((job, n))
                    else:
                        path = f"/api/v1/sizing/soak/repo-{job % 7}/.github%2Fworkflows%2Fci.yml/job-{job}"
                        r = await client.get(path)
                        if r.status_code == 200 and r.json()["meta"]["degraded"]:
                            t.degraded += 1
                except httpx.HTTPError:
                    t.unanswered += 1
                    continue
                t.latencies[kind].append(time.perf_counter() - started)
                t.statuses[kind][r.status_code] += 1
                if r.status_code >= 500 and not (r.status_code == 503 and "retry-after" in r.headers):
                    t.server_errors += 1

        workers = [asyncio.create_task(worker(i)) for i in range(concurrency)]
        for name, seconds, action in phases:
            if action is not None:
                await action()
            current = name
            began = time.monotonic()
            await asyncio.sleep(seconds)
            tallies[name].elapsed = time.monotonic() - began
        done = True
        await asyncio.gather(*workers)

        verified = missing = 0
        for i in range(0, len(acknowledged), 500):
            chunk = acknowledged[i : i + 500]
            for _ in range(60):  # the database may still be recovering
                r = await client.post("/api/v1/runs:batch", json={"runs": [body(j, n) for j, n in chunk]}, timeout=120)
                if r.status_code == 200:
                    break
                await asyncio.sleep(1)
            for item in r.json()["results"]:
                if item["status"] == 200:
                    verified += 1
                else:
                    missing += 1

    print(f"concurrency {concurrency}, {jobs} jobs, ingest share {ingest_share:.0%}")
    for name, t in tallies.items():
        total = sum(len(v) for v in t.latencies.values())
        print(f"-- phase {name}: {t.elapsed:.1f} s")
        print(f"   answers served      {total} ({total / max(t.elapsed, 1e-9):.0f}/s)")
        for kind in ("ingest", "sizing"):
            ms = [v * 1000 for v in t.latencies[kind]]
            codes = ", ".join(f"{code}: {count}" for code, count in sorted(t.statuses[kind].items()))
            print(
                f"   {kind:<19} {len(ms)} answers ({codes or 'none'}), "
                f"p50 {percentile(ms, 50):.1f} ms, p99 {percentile(ms, 99):.1f} ms"
            )
        print(f"   sizing degraded     {t.degraded}")
        print(f"   5xx (not 503+Retry-After) {t.server_errors}")
        print(f"   no answer           {t.unanswered}")
    print(f"runs acknowledged   {len(acknowledged)}")
    print(f"verified present    {verified} (lost {missing})")
    bad = missing or any(t.server_errors or t.unanswered for t in tallies.values())
    if len(phases) == 1:  # a plain soak: every answer must be a clean one
        t = tallies[phases[0][0]]
        bad = bad or t.degraded or any(c != (201 if k == "ingest" else 200) for k in t.statuses for c in t.statuses[k])
    return 1 if bad else 0


async def _admin(url: str, sql: str) -> None:
    u = make_url(url)
    conn = await asyncpg.connect(
        host=u.host, port=u.port or 5432, user=u.username, password=u.password, database=u.database
    )
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def outage(args: argparse.Namespace, tmp: Path) -> int:
    u = make_url(args.database_url)
    if not u.drivername.startswith("postgres"):
        raise SystemExit("--outage needs a PostgreSQL --database-url")
    name = f"ci_sizer_soak_{uuid.uuid4().hex[:10]}"
    await _admin(args.database_url, f'CREATE DATABASE "{name}"')
    upstream = (u.host or "127.0.0.1", u.port or 5432)
    if args.outage == "unix-socket":
        proxy = await Proxy(upstream, unix_path=tmp / ".s.PGSQL.5432").start()
        server_url = f"postgresql://{u.username}@/{name}?host={tmp}"
        bad_mode = "down"
    else:
        proxy = await Proxy(upstream).start()
        server_url = f"postgresql://{u.username}@127.0.0.1:{proxy.port}/{name}"
        bad_mode = "hang"
    try:
        server = LiveServer(server_url, "--log-level", "warning", "--retention-runs", "1000000", log=tmp / "serve.log")
        await asyncio.to_thread(server.start)
        try:
            phases: list[Phase] = [
                ("healthy", args.seconds, None),
                (f"outage ({args.outage})", args.seconds, lambda: proxy.set_mode(bad_mode)),
                ("recovered", args.seconds, lambda: proxy.set_mode("forward")),
            ]
            return await soak(server.url, phases, args.concurrency, args.jobs, args.ingest_share)
        finally:
            await asyncio.to_thread(server.stop)
    finally:
        await proxy.stop()
        await _admin(args.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60, help="the soak's length (with --outage: each phase's)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--jobs", type=int, default=50)
    p.add_argument("--ingest-share", type=float, default=0.2)
    p.add_argument("--url", help="a running server; otherwise one is started")
    p.add_argument("--database-url", help="database for the server this script starts (default: temp SQLite)")
    p.add_argument("--outage", choices=["hung", "unix-socket"], help="healthy, then this outage, then recovered")
    a = p.parse_args()
    if a.outage:
        if not a.database_url:
            p.error("--outage needs --database-url (a PostgreSQL server)")
        with tempfile.TemporaryDirectory() as tmp:
            return asyncio.run(outage(a, Path(tmp)))
    phases: list[Phase] = [("soak", a.seconds, None)]
    if a.url:
        return asyncio.run(soak(a.url, phases, a.concurrency, a.jobs, a.ingest_share))
    with tempfile.TemporaryDirectory() as tmp:
        db = a.database_url or f"sqlite:///{tmp}/soak.db"
        with LiveServer(db, "--log-level", "warning", "--retention-runs", "1000000", log=Path(tmp) / "serve.log") as s:
            return asyncio.run(soak(s.url, phases, a.concurrency, a.jobs, a.ingest_share))


if __name__ == "__main__":
    sys.exit(main())
