"""Builders for wire payloads used across the API tests."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote

import asyncpg  # type: ignore[import-untyped]
import httpx

T = TypeVar("T")
MIB = 1 << 20
GIB = 1 << 30
T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
JOB = {
    "org": "acme",
    "repo": "web",
    "workflow": ".github/workflows/ci.yml",
    "job": "build (ubuntu-latest, 3.12)",
}


def container(
    name: str = "build",
    *,
    cpu: float | dict[str, float] | list[float] = 500.0,
    mem: int = 512 * MIB,
    limit: int | None = None,
    oom_killed: bool | None = None,
    oom_events: int | None = None,
) -> dict[str, Any]:
    """A container; ``cpu`` is a number (all six stats equal), a stats dict, or a sample list."""
    c: dict[str, Any] = {"name": name, "memory_peak_bytes": mem}
    if isinstance(cpu, list):
        c["cpu_samples_millicores"] = cpu
    elif isinstance(cpu, dict):
        c["cpu_stats_millicores"] = cpu
    else:
        c["cpu_stats_millicores"] = dict.fromkeys(("peak", "p99", "p95", "p75", "p50", "avg"), cpu)
    if limit is not None:
        c["memory_limit_bytes"] = limit
    if oom_killed is not None:
        c["oom_killed"] = oom_killed
    if oom_events is not None:
        c["oom_kill_events"] = oom_events
    return c


def run(n: int, *containers: dict[str, Any], job: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """Run number ``n`` of the job, finished ``n`` minutes after T0 (higher n = newer)."""
    body: dict[str, Any] = {
        **(job or JOB),
        "run_id": f"run-{n}",
        "finished_at": (T0 + timedelta(minutes=n)).isoformat().replace("+00:00", "Z"),
        "containers": list(containers) or [container()],
    }
    body.update(extra)
    return body


def sizing_path(job: dict[str, str] | None = None) -> str:
    j = job or JOB
    return "/api/v1/sizing/" + "/".join(quote(j[k], safe="") for k in ("org", "repo", "workflow", "job"))


async def post_runs(client: httpx.AsyncClient, *bodies: dict[str, Any]) -> None:
    for body in bodies:
        r = await client.post("/api/v1/runs", json=body)
        assert r.status_code == 201, r.text


async def sizing(client: httpx.AsyncClient, job: dict[str, str] | None = None, **params: Any) -> dict[str, Any]:
    r = await client.get(sizing_path(job), params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def poll(client: httpx.AsyncClient, location: str) -> dict[str, Any]:
    """A background analysis' row once it is done or failed."""
    import asyncio

    for _ in range(300):
        a: dict[str, Any] = (await client.get(location)).json()
        if a["status"] in ("done", "failed"):
            return a
        await asyncio.sleep(0.05)
    raise AssertionError(f"{location} did not finish")


def sqlite_with(path: Any, use: Callable[[httpx.AsyncClient], Awaitable[T]]) -> tuple[str, T]:
    """A migrated SQLite file at ``path`` and ``use(client)`` run against an app on it (to seed it);
    returns the URL and what ``use`` returned."""
    import asyncio

    from service.cli import main
    from service.main import create_app
    from service.settings import Settings

    url = f"sqlite+aiosqlite:///{path}"
    assert main(["migrate", "--database-url", url]) == 0

    async def run() -> T:
        app = create_app(Settings(database_url=url, write_timeout_seconds=30))
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
                return await use(client)

    return url, asyncio.run(run())


async def lock_exclusively(conn: Any, tables: str = "jobs, runs, overrides") -> Any:
    """Hold ``ACCESS EXCLUSIVE`` locks on ``tables`` from ``conn`` (asyncpg), in a transaction left open
    and returned (roll it back to let go): the service's reads and writes of them block. The app's
    background passes (summaries, fleet totals) read these tables too: taking the locks can meet one
    of them halfway and be chosen as the deadlock's victim; try again."""
    for _ in range(20):
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")
        except asyncpg.exceptions.DeadlockDetectedError:
            await tx.rollback()
            continue
        return tx
    raise AssertionError("could not lock the tables")


#: ``CI_SIZER_FULL_EXAMPLES=1`` (set by .ci/run for all its tests): every Hypothesis
#: property runs its full count of examples. Else (the README's command) a quarter of them, at least 10.
FULL_EXAMPLES = os.environ.get("CI_SIZER_FULL_EXAMPLES", "") not in ("", "0")


def examples(full: int) -> int:
    """The ``max_examples`` of a property whose exhaustive count is ``full`` (README, "Development")."""
    return full if FULL_EXAMPLES else min(full, max(10, full // 4))
