"""Ballast advice over HTTP from stored runs (SA2, SA3, SA4)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import yaml

from ..helpers import JOB, MIB, container, post_runs

T0 = datetime(2026, 11, 16, 9, 0, tzinfo=UTC)  # a Monday


def timed_run(n: int, start: datetime, minutes: float, job: str = "build") -> dict[str, Any]:
    return {
        **JOB,
        "job": job,
        "run_id": f"r{n}",
        "started_at": start.isoformat().replace("+00:00", "Z"),
        "finished_at": (start + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z"),
        "containers": [container(cpu=500.0, mem=600 * MIB)],
    }


async def test_ballast_advice_from_stored_runs(client: httpx.AsyncClient) -> None:
    # starts (s after the first): 0, 30, 60 | 3600, 3650 | 7200, 7230, 7290 -> bursts 3, 2, 3 -> 3 replicas
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
    offsets = [0, 30, 60, 3600, 3650, 7200, 7230, 7290]
    await post_runs(client, *(timed_run(i, now + timedelta(seconds=o), 5) for i, o in enumerate(offsets)))
    r = await client.get("/api/v1/ballast", params={"org": JOB["org"], "days": 7, "provision_delay_seconds": 120})
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["replicas"] == 3
    assert a["bursts"] == {"count": 3, "largest": 3, "covered_share": 1.0}
    assert a["window"]["builds"] == 8
    # one job in the learning phase (every run is clean): its recommended requests are the pod size
    assert a["pod"]["cpu_millicores"] > 0
    assert yaml.safe_load(a["helm_values"])["ballast"]["dind"]["replicasCount"] == 3
    busy = {
        f"{['Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun'][(now + timedelta(seconds=o)).weekday()]} {(now + timedelta(seconds=o)).hour:02d}"
        for o in offsets
    }
    assert busy.isdisjoint(a["zero_hours_utc"])
    # SA4: a day of data covers about 24 of the 168 hour-of-week slots; only those can be zero hours
    # (before, every slot without a start was flagged: 165 of 168 here)
    assert 23 <= a["hours_covered"] <= 25
    # the data begins at `now`: its own hour is covered only when `now` is on the hour
    first = f"{['Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun'][now.weekday()]} {now.hour:02d}"
    busy_covered = busy if (now.minute, now.second) == (0, 0) else busy - {first}
    assert len(a["zero_hours_utc"]) == a["hours_covered"] - len(busy_covered)
    # SA2: the replicas cover 90 % of the bursts by default, each choice costed; SA3: the advice names the cutoff
    assert [c["replicas"] for c in a["choices"]] == [2, 3]
    assert a["choices"][-1]["covered_share"] == 1.0
    assert a["choices"][0]["node_hours_per_week"] > 0
    assert "--expendable-pods-priority-cutoff=-1000000" in a["autoscaler"]
    r = await client.get("/api/v1/ballast", params={"org": JOB["org"], "days": 7, "coverage": 0.3})
    assert r.json()["replicas"] == 2  # 2 covers 1 of the 3 bursts (0.33 >= 0.3)
    r = await client.get("/api/v1/ballast", params={"org": JOB["org"], "days": 0})
    assert r.status_code == 422


DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def slot(at: datetime) -> str:
    return f"{DAYS[at.weekday()]} {at.hour:02d}"


def whole_hours(begins: datetime, advice: dict[str, Any]) -> int:
    """Whole hours from ``begins`` (on the hour) to the end of the advice's window."""
    until = datetime.fromisoformat(advice["window"]["until"].replace("Z", "+00:00"))
    return int((until - begins).total_seconds() // 3600)


async def test_zero_hours_are_counted_only_where_retention_left_every_run(make_client: Any, db_url: str) -> None:
    # issue 33, minor 6 (SA4): the covered slots began at the org's first stored run, but retention
    # deletes a busy job's older runs: the hours of its deleted builds were then flagged as zero hours
    from service.db import build_engine

    today = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    busy = [today - timedelta(days=d) for d in (5, 4, 3, 2, 1)]  # one build a day, at the same hour
    rare = today - timedelta(days=6, hours=3)
    async with make_client(retention_runs=3, retention_interval_seconds=0.05) as client:
        await post_runs(client, *(timed_run(n, at, 5, job="busy") for n, at in enumerate(busy)))
        await post_runs(client, timed_run(99, rare, 5, job="rare"))
        engine = build_engine(db_url)
        try:
            for _ in range(400):  # retention keeps the busy job's newest three
                async with engine.connect() as conn:
                    if (await conn.exec_driver_sql("SELECT count(*) FROM runs")).scalar_one() == 4:
                        break
                await asyncio.sleep(0.05)
        finally:
            await engine.dispose()
        a = (await client.get("/api/v1/ballast", params={"org": JOB["org"], "days": 7})).json()
    assert a["window"]["builds"] == 4
    # the data is whole from the busy job's oldest kept run on: three days, not six
    assert a["hours_covered"] == whole_hours(busy[2], a)
    for deleted in busy[:2]:  # its builds of five and four days ago: not a quiet hour, unknown
        assert slot(deleted) not in a["zero_hours_utc"]
    assert slot(busy[2]) not in a["zero_hours_utc"]  # a kept build
    assert slot(busy[2] + timedelta(hours=5)) in a["zero_hours_utc"]  # a covered hour without one


async def test_a_day_without_builds_is_a_day_of_zero_hours(client: httpx.AsyncClient) -> None:
    # SA4 as kept (docs/simulation.md): a day inside the data without a build is quiet, not unknown.
    # Counting only the days that have data (issue 26's wording) would never flag a weekend without
    # builds, the very hours 004 suggests scaling the ballast down in
    today = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    days = [today - timedelta(days=d) for d in (6, 5, 1)]  # nothing on the four days between
    await post_runs(client, *(timed_run(n, at, 5) for n, at in enumerate(days)))
    a = (await client.get("/api/v1/ballast", params={"org": JOB["org"], "days": 7})).json()
    assert a["hours_covered"] == whole_hours(days[0], a)
    quiet = [slot(today - timedelta(days=d, hours=h)) for d in (4, 3, 2) for h in range(24)]
    assert set(quiet) <= set(a["zero_hours_utc"])
