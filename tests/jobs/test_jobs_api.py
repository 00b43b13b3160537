"""``GET /api/v1/jobs``: every known job with its phase, answer, what it ran with and what the
answer would save; filtered, sorted, paginated, scoped by token; on both databases."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from service.sizing.service import Policy
from service.wire import utcnow

from ..helpers import GIB, MIB, container, sizing
from ..test_auth import SECRETS, write_tokens


def job(name: str, org: str = "acme", repo: str = "web", workflow: str = "ci.yml") -> dict[str, str]:
    return {"org": org, "repo": repo, "workflow": workflow, "job": name}


def recent_run(
    n: int,
    j: dict[str, str],
    *,
    mem: int = 512 * MIB,
    limit: int | None = 4 * GIB,
    cpu_request: float | None = 2000.0,
    minutes: float = 30.0,
    oom: bool = False,
) -> dict[str, Any]:
    """Run ``n`` of ``j`` in the last days (inside the window), ``minutes`` long."""
    finished = utcnow() - timedelta(hours=n)
    c = container(mem=mem, limit=limit, oom_killed=True if oom else None)
    if cpu_request is not None:
        c["cpu_request_millicores"] = cpu_request
    return {
        **j,
        "run_id": f"r{n}",
        "started_at": (finished - timedelta(minutes=minutes)).isoformat() + "Z",
        "finished_at": finished.isoformat() + "Z",
        "containers": [c],
    }


async def post(client: httpx.AsyncClient, *bodies: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    for body in bodies:
        r = await client.post("/api/v1/runs", json=body, headers=headers)
        assert r.status_code == 201, r.text


async def summarise(client: httpx.AsyncClient) -> int:
    """One background pass of the summary refresher, now."""
    app = client.app  # type: ignore[attr-defined]
    policy = Policy.of(app.state.settings, app.state.ceilings)
    done: int = await app.state.summaries.run_once(app.state.engine, policy, app.state.write_engine)
    return done


async def all_pages(client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    next_url: str | None = url
    while next_url is not None:
        r = await client.get(next_url, headers=headers)
        assert r.status_code == 200, r.text
        body = r.json()
        items += body["items"]
        link = r.headers.get("link")
        assert (link is None) == (body["next_cursor"] is None)
        if link is None:
            next_url = None
        else:
            assert link.endswith('>; rel="next"')
            target = urlsplit(link[1 : link.index(">")])
            next_url = f"{target.path}?{target.query}"
    return items


async def test_row_is_the_sizing_answer_and_what_it_saves(client: httpx.AsyncClient) -> None:
    j = job("build")
    await post(client, *(recent_run(n, j, mem=900 * MIB, minutes=60) for n in range(1, 5)))
    assert await summarise(client) >= 1
    r = await client.get("/api/v1/jobs")
    assert r.status_code == 200, r.text
    (row,) = r.json()["items"]
    answer = await sizing(client, j)
    c = answer["containers"][0]
    assert row["phase"] == answer["meta"]["phase"] == "confident"
    assert row["answer"] == {
        "cpu_request_millicores": c["cpu"]["request_millicores"],
        "memory_limit_bytes": c["memory"]["limit_bytes"],
    }
    assert row["in_force"] == {"cpu_request_millicores": 2000.0, "memory_limit_bytes": 4 * GIB}
    assert row["runs"] == 4
    assert row["oom_kills"] == 0
    # four one-hour runs in a seven-day window
    assert row["run_hours_per_day"] == pytest.approx(4 / 7, rel=1e-3)
    saved_mem = (4 * GIB - c["memory"]["limit_bytes"]) / GIB * 4 / 7
    saved_cpu = (2000 - c["cpu"]["request_millicores"]) / 1000 * 4 / 7
    assert row["saved_per_day"]["memory_gib_hours"] == pytest.approx(saved_mem, abs=1e-3)
    assert row["saved_per_day"]["cpu_core_hours"] == pytest.approx(saved_cpu, abs=1e-3)
    assert saved_mem > 0
    assert row["last_run_at"] is not None
    totals = r.json()["totals"]
    assert totals["jobs"] == 1
    assert totals["confident"] == 1
    assert totals["saved_memory_gib_hours_per_day"] == pytest.approx(saved_mem, abs=1e-2)


async def test_unreported_limits_save_nothing_known(client: httpx.AsyncClient) -> None:
    await post(client, recent_run(1, job("a"), limit=None, cpu_request=None))
    await summarise(client)
    (row,) = (await client.get("/api/v1/jobs")).json()["items"]
    assert row["in_force"] == {"cpu_request_millicores": None, "memory_limit_bytes": None}
    assert row["saved_per_day"] == {"memory_gib_hours": None, "cpu_core_hours": None}
    assert row["phase"] == "learning"


async def test_new_job_is_listed_before_it_is_summarised(client: httpx.AsyncClient) -> None:
    await post(client, recent_run(1, job("fresh")))
    (row,) = (await client.get("/api/v1/jobs")).json()["items"]
    assert row["job"] == "fresh"
    assert row["phase"] is None
    assert row["answer"] is None


async def test_sorts_and_paginates_every_job_once(client: httpx.AsyncClient) -> None:
    # job i ran with a limit of (i + 1) GiB over a ~1 GiB answer: the saving grows with i
    for i in range(7):
        await post(client, *(recent_run(n, job(f"j{i}"), mem=700 * MIB, limit=(i + 1) * GIB) for n in range(1, 4)))
    await post(client, recent_run(1, job("oomy"), mem=900 * MIB, limit=GIB, oom=True))
    await post(client, recent_run(2, job("oomy"), mem=900 * MIB, limit=GIB, oom=True))
    await summarise(client)
    for sort in ("waste_memory", "waste_cpu", "oom", "last_run", "name"):
        items = await all_pages(client, f"/api/v1/jobs?sort={sort}&limit=3")
        names = [i["job"] for i in items]
        assert sorted(names) == sorted([f"j{i}" for i in range(7)] + ["oomy"]), sort
    items = await all_pages(client, "/api/v1/jobs?sort=waste_memory&limit=2")
    savings = [i["saved_per_day"]["memory_gib_hours"] for i in items]
    known = [s for s in savings if s is not None]
    assert known == sorted(known, reverse=True)
    assert items[0]["job"] == "j6"
    oom = await all_pages(client, "/api/v1/jobs?sort=oom&limit=2")
    assert oom[0]["job"] == "oomy"
    assert oom[0]["oom_kills"] == 2
    assert oom[0]["oom_backoff"] is True
    by_name = await all_pages(client, "/api/v1/jobs?sort=name&limit=2")
    assert [i["job"] for i in by_name] == sorted(i["job"] for i in by_name)
    recent = await all_pages(client, "/api/v1/jobs?sort=last_run&limit=2")
    stamps = [i["last_run_at"] for i in recent]
    assert stamps == sorted(stamps, reverse=True)


async def test_filters(client: httpx.AsyncClient) -> None:
    await post(client, *(recent_run(n, job("x", repo="api")) for n in range(1, 4)))
    await post(client, recent_run(1, job("y", repo="web", workflow="nightly.yml")))
    await post(client, recent_run(1, job("Deploy <prod>", org="globex")))
    await summarise(client)

    async def names(query: str) -> list[str]:
        r = await client.get(f"/api/v1/jobs?{query}")
        assert r.status_code == 200, r.text
        return sorted(i["job"] for i in r.json()["items"])

    assert await names("repo=api") == ["x"]
    assert await names("org=globex") == ["Deploy <prod>"]
    assert await names("workflow=nightly.yml") == ["y"]
    assert await names("phase=confident") == ["x"]
    assert await names("phase=learning") == ["Deploy <prod>", "y"]
    assert await names("q=deploy") == ["Deploy <prod>"]
    assert await names("q=%25") == []  # a LIKE wildcard is a plain character
    totals = (await client.get("/api/v1/jobs?phase=learning")).json()["totals"]
    assert totals["jobs"] == 2
    assert totals["learning"] == 2


async def test_bad_parameters_are_problems(client: httpx.AsyncClient) -> None:
    for query in ("sort=size", "phase=sure", "limit=0", "limit=501", "cursor=bm9wZQ"):
        r = await client.get(f"/api/v1/jobs?{query}")
        assert r.status_code == 422, query
        assert r.headers["content-type"].startswith("application/problem+json")
    await post(client, *(recent_run(n, job(f"k{n}")) for n in range(1, 4)))
    await summarise(client)
    r = await client.get("/api/v1/jobs?limit=1&sort=oom")
    cursor = r.json()["next_cursor"]
    assert cursor
    # a cursor of one sort is not one of another
    assert (await client.get(f"/api/v1/jobs?limit=1&sort=name&cursor={cursor}")).status_code == 422


async def test_override_changes_the_listed_answer(client: httpx.AsyncClient) -> None:
    j = job("build")
    await post(client, *(recent_run(n, j) for n in range(1, 4)))
    await summarise(client)
    before = (await client.get("/api/v1/jobs")).json()["items"][0]
    r = await client.put("/api/v1/sizing/overrides/acme/web/ci.yml/build", json={"memory_limit": "3Gi"})
    assert r.status_code == 201, r.text
    await summarise(client)
    after = (await client.get("/api/v1/jobs")).json()["items"][0]
    assert after["answer"]["memory_limit_bytes"] == 3 * GIB != before["answer"]["memory_limit_bytes"]
    assert after["override_scope"] == "job"
    assert after["answer"]["memory_limit_bytes"] == (await sizing(client, j))["containers"][0]["memory"]["limit_bytes"]


async def test_scoped_by_token(make_client: Any, tmp_path: Path) -> None:
    async with make_client(tokens_file=write_tokens(tmp_path / "tokens.toml")) as client:
        ingest = {"authorization": f"Bearer {SECRETS['ingest']}"}
        await post(client, recent_run(1, job("mine")), headers=ingest)
        await post(client, recent_run(1, job("theirs", org="globex")), headers=ingest)
        await summarise(client)
        reader = {"authorization": f"Bearer {SECRETS['read']}"}  # read, acme only
        assert (await client.get("/api/v1/jobs")).status_code == 401
        assert (await client.get("/api/v1/jobs", headers=ingest)).status_code == 403
        r = await client.get("/api/v1/jobs", headers=reader)
        assert r.status_code == 200
        assert [i["job"] for i in r.json()["items"]] == ["mine"]
        assert r.json()["totals"]["jobs"] == 1
        assert (await client.get("/api/v1/jobs?org=globex", headers=reader)).status_code == 403
        admin = {"authorization": f"Bearer {SECRETS['admin']}"}
        r = await client.get("/api/v1/jobs", headers=admin)
        assert sorted(i["job"] for i in r.json()["items"]) == ["mine", "theirs"]


async def test_old_runs_leave_the_window(client: httpx.AsyncClient) -> None:
    j = job("old")
    body = recent_run(1, j, oom=True)
    old = utcnow() - timedelta(days=8)
    body["finished_at"] = old.isoformat() + "Z"
    body["started_at"] = (old - timedelta(minutes=5)).isoformat() + "Z"
    await post(client, body)
    await summarise(client)
    (row,) = (await client.get("/api/v1/jobs")).json()["items"]
    assert row["runs"] == 0
    assert row["oom_kills"] == 0
    assert row["run_hours_per_day"] is None
    assert row["last_run_at"].startswith(old.isoformat()[:19])


async def test_refresher_sweeps_missing_expired_and_old_summaries(make_client: Any) -> None:
    async with make_client(jobs_summary_seconds=3600) as client:  # no background pass: this test counts them
        await _sweeps(client)


async def _sweeps(client: httpx.AsyncClient) -> None:
    import asyncio

    from sqlalchemy import update

    from service.tables import JobSummary

    app = client.app  # type: ignore[attr-defined]
    await post(client, *(recent_run(n, job("a")) for n in range(1, 4)))
    app.state.summaries.pending.clear()  # as for jobs stored before the summaries existed
    assert await summarise(client) == 1  # found missing, not noted
    assert await summarise(client) == 0  # nothing stale: nothing recomputed
    expiry = utcnow() + timedelta(seconds=2)
    expires = expiry.isoformat() + "Z"
    r = await client.put("/api/v1/sizing/overrides/acme", json={"memory_limit": "3Gi", "expires_at": expires})
    assert r.status_code == 201, r.text
    assert await summarise(client) == 1  # the org's jobs, after the write
    assert (await client.get("/api/v1/jobs")).json()["items"][0]["answer"]["memory_limit_bytes"] == 3 * GIB
    await asyncio.sleep((expiry - utcnow()).total_seconds() + 0.1)  # expired: the summary that applied it is stale
    assert await summarise(client) == 1
    row = (await client.get("/api/v1/jobs")).json()["items"][0]
    assert row["answer"]["memory_limit_bytes"] != 3 * GIB
    assert row["override_scope"] == "global"
    async with app.state.write_engine.begin() as conn:  # an hour-old summary is recomputed
        await conn.execute(update(JobSummary).values(refreshed_at=utcnow() - timedelta(hours=2)))
    assert await summarise(client) == 1


async def test_hostile_query_values_are_problems(client: httpx.AsyncClient) -> None:
    import base64
    import json

    def cursor(*parts: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(list(parts)).encode()).decode().rstrip("=")

    for query in (
        "org=a%00b",
        "q=%07",
        f"sort=oom&cursor={cursor('oom', 10**30, 1)}",
        f"sort=oom&cursor={cursor('oom', 1, 2**70)}",
        f"sort=last_run&cursor={cursor('last_run', 5, 1)}",
        f"sort=name&cursor={cursor('name', ['a'], 1)}",
    ):
        r = await client.get(f"/api/v1/jobs?{query}")
        assert r.status_code == 422, (query, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
