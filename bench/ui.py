"""The operator's page and ``GET /api/v1/jobs`` at 10,000 jobs (PostgreSQL).

A database of 10,000 jobs x 20 runs (bench/_load.py), moved into the jobs list's window and
given the limits and CPU requests the runs ran with, plus 500 overrides. The job summaries are
computed once by the service (``jobs.refresh``, what the background refresher does): that is the
cost a design that computed every answer per request would pay on each request, and is printed
beside the stored design's page times. Then a live ``ci-sizer serve`` (answer cache off) answers
each page from one connection in alternating rounds; the baseline, measured in the same rounds,
is one ``GET /api/v1/sizing`` computed from the database.

Target: every page's p95 under 200 ms. Not a test: it prints figures.

    python bench/ui.py [--database-url postgresql://...] [--requests 40] [--rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import statistics
import tempfile
import time
from urllib.parse import quote, urlencode

import asyncpg  # type: ignore[import-untyped]
import httpx

from bench import _load
from bench._util import quantile, save, verdict
from tests.live import LiveServer

JOBS = 10_000
RUNS = 20
OVERRIDES = 500
TARGET_MS = 200.0


async def shape(url: str) -> None:
    """Runs in the last days, with the limits and CPU requests they ran with; some overrides."""
    conn = await asyncpg.connect(_load._plain(url))
    try:
        await conn.execute(
            "UPDATE runs SET finished_at = finished_at + (now() at time zone 'utc' - (SELECT max(finished_at) FROM runs)),"
            " started_at = started_at + (now() at time zone 'utc' - (SELECT max(finished_at) FROM runs))"
        )
        await conn.execute(
            "UPDATE run_containers SET memory_limit_bytes = coalesce(memory_limit_bytes, 8589934592),"
            " cpu_request_millicores = 2000"
        )
        await conn.executemany(
            "INSERT INTO overrides (scope, org, repo, workflow, job, memory_limit_bytes, created_at, updated_at,"
            " updated_by, version) VALUES ('job', $1, $2, $3, $4, 4294967296, now(), now(), 'bench', 1)",
            [_load.job_key(i * (JOBS // OVERRIDES)) for i in range(OVERRIDES)],
        )
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def summarise_all(url: str) -> float:
    """Every job's summary, computed by the service as the refresher does; seconds taken."""
    from sqlalchemy import select

    from service.db import build_engine
    from service.jobs import summaries as jobs_service
    from service.keys import ScopeKey
    from service.sizing.service import Policy
    from service.tables import Job

    engine = build_engine(
        url.replace("postgresql://", "postgresql+asyncpg://", 1) if url.startswith("postgresql://") else url
    )
    try:
        async with engine.connect() as conn:
            t = Job.__table__  # type: ignore[attr-defined]
            rows = list(await conn.execute(select(t.c.id, t.c.org, t.c.repo, t.c.workflow, t.c.job)))
        items = [(r.id, ScopeKey(r.org, r.repo, r.workflow, r.job)) for r in rows]
        started = time.perf_counter()
        for first in range(0, len(items), 500):
            await jobs_service.refresh(engine=engine, jobs=items[first : first + 500], policy=Policy())
        return time.perf_counter() - started
    finally:
        await engine.dispose()


async def trend_cold(url: str, times: int = 5) -> list[float]:
    """The whole fleet's 30-day trend computed from the runs, ``times`` times (ms): what the trends
    view pays when its minute-long copy is gone."""
    from service.db import build_engine
    from service.jobs import trends
    from service.jobs.money import Prices
    from service.jobs.service import JobFilter

    engine = build_engine(
        url.replace("postgresql://", "postgresql+asyncpg://", 1) if url.startswith("postgresql://") else url
    )
    out = []
    try:
        async with engine.connect() as conn:
            for _ in range(times):
                started = time.perf_counter()
                await trends.trend(conn=conn, flt=JobFilter(), orgs=None, prices=Prices())
                out.append((time.perf_counter() - started) * 1000)
    finally:
        await engine.dispose()
    return out


def pages(client: httpx.Client) -> dict[str, str]:
    k = _load.job_key(123)
    job_q = urlencode({"org": k[0], "repo": k[1], "workflow": k[2], "job": k[3]}, quote_via=quote)
    deep = "/api/v1/jobs?sort=waste_memory&limit=50"
    for _ in range(100):  # page 101 of 200
        deep = client.get(deep).links["next"]["url"]
    cursor = deep.split("cursor=", 1)[1]
    return {
        "baseline: GET /api/v1/sizing (one answer, from the database)": "/api/v1/sizing/" + "/".join(k),
        "GET /api/v1/jobs sort=waste_memory, first page of 50": "/api/v1/jobs?sort=waste_memory&limit=50",
        "GET /api/v1/jobs sort=waste_memory, page 101 of 200": deep,
        "GET /api/v1/jobs sort=oom, phase=confident": "/api/v1/jobs?sort=oom&phase=confident&limit=50",
        "GET /api/v1/jobs sort=risk, first page of 50": "/api/v1/jobs?sort=risk&limit=50",
        "page shell /ui/": "/ui/",
        "fleet view: jobs fragment, sort=waste_memory": "/ui/fragments/jobs?sort=waste_memory",
        "fleet view: page 101, sort=waste_memory": f"/ui/fragments/jobs?sort=waste_memory&cursor={cursor}",
        "fleet view: sort=last_run, name contains 'build-99'": "/ui/fragments/jobs?sort=last_run&q=build-99",
        "fleet view: sort=money (the page's default), totals by org and repo": "/ui/fragments/jobs?sort=money",
        "trends view: one org, 30 days": f"/ui/fragments/trends?org={quote(k[0])}",
        "trends view: the whole fleet, 30 days (kept a minute)": "/ui/fragments/trends",
        "job view (answer, today, runs by date, trend, 8 formats, resolution)": f"/ui/fragments/job?{job_q}",
        "overrides view (first 50 of 500)": "/ui/fragments/overrides",
        "analyses view": "/ui/fragments/analyses",
    }


def load_sqlite(url: str, runs: int) -> None:
    """The same fleet through the API (SQLite has no COPY): ``runs`` runs a job in the last days,
    with the limits and CPU requests they ran with, and the overrides."""
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC).replace(tzinfo=None)
    bodies = []
    for i in range(JOBS):
        org, repo, workflow, name = _load.job_key(i)
        mem = (200 + (i * 7919) % 5800) * 2**20
        for n in range(runs):
            finished = now - timedelta(hours=6 * n + i % 6)
            stats = dict.fromkeys(("peak", "p99", "p95", "p75", "p50", "avg"), 100.0 + i % 2900)
            bodies.append(
                {
                    "org": org, "repo": repo, "workflow": workflow, "job": name, "run_id": f"run-{n}",
                    "started_at": (finished - timedelta(minutes=12)).isoformat() + "Z",
                    "finished_at": finished.isoformat() + "Z",
                    "containers": [{"name": "build", "cpu_stats_millicores": stats, "memory_peak_bytes": mem,
                                    "memory_limit_bytes": 8 * 2**30, "cpu_request_millicores": 2000}],
                }
            )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        with LiveServer(url, "--log-level", "warning", log=Path(tmp, "load.log")) as live:
            with httpx.Client(base_url=live.url, timeout=120) as client:
                for first in range(0, len(bodies), 500):
                    r = client.post("/api/v1/runs:batch", json={"runs": bodies[first : first + 500]})
                    assert r.status_code == 200, r.text
                    assert r.json()["created"] == len(bodies[first : first + 500]), r.text
                    print(f"  loaded {first + 500:,} / {len(bodies):,} runs", end="\r", flush=True)
                for i in range(OVERRIDES):
                    path = "/".join(_load.job_key(i * (JOBS // OVERRIDES)))
                    r = client.put(f"/api/v1/sizing/overrides/{path}", json={"memory_limit": "4Gi"})
                    assert r.status_code == 201, r.text
    print()


def measure(url: str, args: argparse.Namespace) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        live = LiveServer(url, "--sizing-cache-entries", "0", "--log-level", "warning", log=Path(tmp, "serve.log"))
        live.start()
        try:
            with httpx.Client(base_url=live.url, timeout=30) as client:
                targets = pages(client)
                for path in targets.values():  # warm up: prepared statements, templates
                    assert client.get(path).status_code == 200, path
                for _ in range(args.rounds):
                    for name, path in targets.items():
                        for _ in range(args.requests):
                            started = time.perf_counter()
                            r = client.get(path)
                            samples.setdefault(name, []).append((time.perf_counter() - started) * 1000)
                            assert r.status_code == 200, (path, r.status_code)
        finally:
            live.stop()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a PostgreSQL server (database ci_sizer_bench_ui is made on it)")
    parser.add_argument(
        "--sqlite", action="store_true", help="on SQLite instead (loaded through the API, 5 runs a job)"
    )
    parser.add_argument("--requests", type=int, default=40, help="requests per page per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", help="write the figures as JSON here (for bench/report.py)")
    args = parser.parse_args()

    if args.sqlite:
        runs, database = 5, "SQLite"
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench-ui.db"
            print(f"loading {JOBS:,} jobs x {runs} runs through the API ...", flush=True)
            load_sqlite(url, runs)
            summarise_s = _load.run(summarise_all(url.replace("sqlite://", "sqlite+aiosqlite://", 1)))
            print(f"{JOBS:,} job summaries computed in {summarise_s:.1f} s", flush=True)
            samples = measure(url, args)
            cold = _load.run(trend_cold(url.replace("sqlite://", "sqlite+aiosqlite://", 1)))
    else:
        runs, database = RUNS, "PostgreSQL"
        server, owned = _load.server_url(args.database_url)
        try:
            url = _load.run(_load.fresh_database(server, "ci_sizer_bench_ui"))
            print(f"loading {JOBS:,} jobs x {RUNS} runs ...", flush=True)
            _load.run(_load.load(url, jobs=JOBS, runs_per_job=RUNS, seed=7))
            _load.run(shape(url))
            summarise_s = _load.run(summarise_all(url))
            print(f"{JOBS:,} job summaries computed in {summarise_s:.1f} s", flush=True)
            samples = measure(url, args)
            cold = _load.run(trend_cold(url))
        finally:
            if owned is not None:
                owned.close()
    base = statistics.median(next(iter(samples.values())))
    rows = []
    print(f"\n{'page':<62}{'p50 ms':>9}{'p95 ms':>9}{'x base':>8}")
    for name, values in samples.items():
        p50, p95 = statistics.median(values), quantile(values, 0.95)
        ok = p95 < TARGET_MS
        print(
            f"{name:<62}{p50:>9.2f}{p95:>9.2f}{p50 / base:>8.1f}  {'' if name.startswith('baseline') else verdict(ok)}"
        )
        rows.append(
            {
                "figure": name,
                "p50_ms": round(p50, 2),
                "p95_ms": round(p95, 2),
                "p50_vs_baseline": round(p50 / base, 1),
                "target": "" if name.startswith("baseline") else f"p95 < {TARGET_MS:.0f} ms",
                "result": "-" if name.startswith("baseline") else verdict(ok),
            }
        )
    print(
        f"\nthe whole fleet's 30-day trend computed from the runs (the trends view's cold start): {statistics.median(cold):,.0f} ms"
    )
    rows.append(
        {
            "figure": "the whole fleet's 30-day trend computed from the runs (the trends view without its kept copy)",
            "p50_ms": round(statistics.median(cold)),
            "p95_ms": round(max(cold)),
            "p50_vs_baseline": round(statistics.median(cold) / base),
            "target": "(no target; reported)",
            "result": "-",
        }
    )
    per_request = summarise_s * 1000
    print(
        f"\ncomputing all {JOBS:,} answers (what sorting by waste would cost per request without stored summaries): {per_request:,.0f} ms"
    )
    rows.append(
        {
            "figure": f"all {JOBS:,} answers computed (the per-request cost without stored summaries; "
            "here paid once, off the request path)",
            "p50_ms": round(per_request),
            "p95_ms": "",
            "p50_vs_baseline": round(per_request / base),
            "target": "(no target; reported)",
            "result": "-",
        }
    )
    save(
        args.results,
        "ui-sqlite" if args.sqlite else "ui",
        rows,
        notes=[f"{JOBS:,} jobs x {runs} runs, {OVERRIDES} overrides, {database}"],
    )


if __name__ == "__main__":
    main()
