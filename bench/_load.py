"""Databases for the benches: a fresh PostgreSQL database, migrated with ``ci-sizer migrate``
and filled by COPY with a synthetic fleet (not through the API: loading 1,000,000 runs through
HTTP would measure ingest, not sizing)."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from datetime import datetime, timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

from bench._util import ROOT

ORGS = 50
WORKFLOW = "ci.yml"  # no "/": the bare app's route must match the same path (see bench/http.py)
T0 = datetime(2026, 1, 1)


def job_key(i: int) -> tuple[str, str, str, str]:
    return f"org-{i % ORGS}", f"repo-{i % (ORGS * 10)}", WORKFLOW, f"build-{i}"


def sizing_path(i: int) -> str:
    return "/api/v1/sizing/" + "/".join(job_key(i))


def server_url(given: str | None) -> tuple[str, Any]:
    """A PostgreSQL server to bench on, and what to close afterwards: ``--database-url``, else
    ``CI_SIZER_BENCH_DATABASE_URL``/``CI_SIZER_TEST_DATABASE_URL``, else a throwaway cluster."""
    url = given or os.environ.get("CI_SIZER_BENCH_DATABASE_URL") or os.environ.get("CI_SIZER_TEST_DATABASE_URL")
    if url:
        return url, None
    from tests.pg import acquire

    server = acquire()
    print(f"postgresql: {server.origin}", flush=True)
    return server.url, server


def _plain(url: str, database: str | None = None) -> str:
    u = make_url(url).set(drivername="postgresql")
    if database is not None:
        u = u.set(database=database)
    return u.render_as_string(hide_password=False)


async def fresh_database(url: str, name: str) -> str:
    """Drop and create database ``name`` on the server of ``url``; its URL, migrated."""
    conn = await asyncpg.connect(_plain(url, "postgres"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    target = _plain(url, name)
    migrate(target)
    return target


def migrate(url: str) -> None:
    """``ci-sizer migrate`` on ``url`` in a process of its own, as an operator runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "service", "migrate", "--database-url", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ci-sizer migrate failed:\n{done.stderr}")


async def load(url: str, *, jobs: int, runs_per_job: int, containers: int = 2, seed: int = 1) -> float:
    """Fill ``jobs`` x ``runs_per_job`` runs (every 20th run an OOM suspect); seconds taken."""
    started = time.perf_counter()
    rng = random.Random(seed)
    conn = await asyncpg.connect(_plain(url))
    try:
        now = datetime.utcnow()
        await conn.copy_records_to_table(
            "jobs",
            columns=["id", "org", "repo", "workflow", "job", "created_at"],
            records=[(i + 1, *job_key(i), now) for i in range(jobs)],
        )
        chunk = max(1, 200_000 // runs_per_job)
        run_pk = 0
        container_pk = 0
        for first in range(0, jobs, chunk):
            runs: list[tuple[Any, ...]] = []
            rows: list[tuple[Any, ...]] = []
            for i in range(first, min(jobs, first + chunk)):
                cpu_base = rng.uniform(100, 3000)
                mem_base = rng.randint(200, 6000) * 2**20
                for n in range(runs_per_job):
                    run_pk += 1
                    suspect = n % 20 == 19
                    finished = T0 + timedelta(minutes=n * 30 + i % 30)
                    runs.append(
                        (run_pk, i + 1, f"run-{n}", finished - timedelta(minutes=12), finished, now,
                         16 * 2**30, None, not suspect, f"{run_pk:064x}")
                    )  # fmt: skip
                    for c in range(containers):
                        container_pk += 1
                        scale = 1.0 if c == 0 else 0.1
                        cpu = cpu_base * scale * rng.uniform(0.7, 1.3)
                        mem = int(mem_base * scale * rng.uniform(0.8, 1.2))
                        rows.append(
                            (container_pk, run_pk, c, "build" if c == 0 else f"helper-{c}",
                             cpu * 1.4, cpu * 1.3, cpu * 1.2, cpu, cpu * 0.8, cpu * 0.7,
                             mem, mem * 2 if suspect and c == 0 else None, (suspect and c == 0) or None, None,
                             suspect and c == 0)
                        )  # fmt: skip
            await conn.copy_records_to_table(
                "runs",
                columns=["id", "job_id", "run_id", "started_at", "finished_at", "ingested_at",
                         "node_memory_bytes", "pod_memory_peak_bytes", "clean", "content_hash"],
                records=runs,
            )  # fmt: skip
            await conn.copy_records_to_table(
                "run_containers",
                columns=["id", "run_pk", "position", "name", "cpu_peak", "cpu_p99", "cpu_p95", "cpu_p75",
                         "cpu_p50", "cpu_avg", "memory_peak_bytes", "memory_limit_bytes", "oom_killed",
                         "oom_kill_events", "oom_suspect"],
                records=rows,
            )  # fmt: skip
            done = min(jobs, first + chunk)
            print(f"  loaded {done * runs_per_job:,} / {jobs * runs_per_job:,} runs", end="\r", flush=True)
        for table in ("jobs", "runs", "run_containers"):
            await conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
    finally:
        await conn.close()
    # each job's build-path state, as the service keeps it for runs it stored (COPY bypasses it): the
    # service's own repair, which a server would otherwise run in the background at its start
    await build_states(url)
    conn = await asyncpg.connect(_plain(url))
    try:
        # as autovacuum leaves a table in steady state: statistics, and a visibility map so that
        # index-only scans do not visit the heap
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    print()
    return time.perf_counter() - started


async def build_states(url: str) -> int:
    """Every job's build-path state rebuilt from its runs (``service.sizing.state.StateRepair``)."""
    from service.db import build_engine
    from service.sizing.state import StateRepair

    engine = build_engine(make_url(url).set(drivername="postgresql+asyncpg").render_as_string(hide_password=False))
    try:
        return await StateRepair().scan(engine)
    finally:
        await engine.dispose()


def run(coro: Any) -> Any:
    return asyncio.run(coro)
