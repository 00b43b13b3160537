"""The PostgreSQL build path answered before routing (service/sizing/fastpath.py, sizing/pgread.py,
service/runs/fastpath.py): one statement per sizing miss and per new run, through the lean pool,
with the route's answers, rules and fail-open promises. PostgreSQL only: SQLite's POSTs stay on the routes and its
sizing misses have their own read (tests/test_fastpath_sqlite.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import ValidationError

from service.keys import ScopeKey
from service.settings import Settings
from service.sizing import pgread
from service.sizing import service as sizing_service
from service.sizing.params import SizingParams

from .helpers import GIB, JOB, MIB, container, run, sizing, sizing_path

KEY = ScopeKey(JOB["org"], JOB["repo"], JOB["workflow"], JOB["job"])


@pytest.fixture
def db_url(postgresql_only: str) -> str:
    """This module's tests run on PostgreSQL only (overrides conftest's both-databases fixture)."""
    return postgresql_only


async def counts(pg: asyncpg.Connection) -> tuple[int, int, int]:
    row = await pg.fetchrow(
        "SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM runs), (SELECT count(*) FROM run_containers)"
    )
    return row[0], row[1], row[2]


# --------------------------------------------------------------------------- POST


async def test_fast_post_is_idempotent_201_200_409(client: httpx.AsyncClient, pg: asyncpg.Connection) -> None:
    # rule I4: a new run 201 (stored here, in one statement), the same run 200, other content 409
    body = run(1, container(cpu=[4.0, 1.0, 5.5, 3.0, 2.0]), container("sidecar", mem=64 * MIB, limit=66 * MIB))
    first = await client.post("/api/v1/runs", json=body)
    assert first.status_code == 201, first.text
    assert client.app.state.pgpool.opened >= 1  # type: ignore[attr-defined]  # answered by the fast path
    created = first.json()
    assert created["result"] == "created"
    assert created["clean"] is False  # rule S1: the sidecar's peak is >= 95 % of its limit
    assert created["oom_suspect_containers"] == ["sidecar"]
    assert created["containers"][0]["cpu_stats_millicores"]["peak"] == 5.5
    again = await client.post("/api/v1/runs", json=body)
    assert again.status_code == 200
    assert again.json()["result"] == "duplicate"
    assert again.json()["containers"] == created["containers"]
    other = run(1, container(cpu=[4.0, 1.0, 5.5, 3.0, 9.0]))
    conflict = await client.post("/api/v1/runs", json=other)
    assert conflict.status_code == 409
    assert conflict.headers["content-type"] == "application/problem+json"
    assert await counts(pg) == (1, 1, 2)
    stored = await pg.fetch("SELECT name, position, cpu_peak, oom_suspect FROM run_containers ORDER BY position")
    assert [tuple(r) for r in stored] == [("build", 0, 5.5, False), ("sidecar", 1, 500.0, True)]


async def test_concurrent_fast_posts_store_the_run_once(client: httpx.AsyncClient, pg: asyncpg.Connection) -> None:
    # rule I4 under concurrency, including the first sight of the job by several requests at once
    answers = await asyncio.gather(*(client.post("/api/v1/runs", json=run(1)) for _ in range(8)))
    assert sorted(r.status_code for r in answers) == [200] * 7 + [201]
    assert await counts(pg) == (1, 1, 1)


@pytest.mark.parametrize(
    ("content", "field"),
    [
        (b'{"org": ', None),  # not JSON
        (b'{"org": "acme"}', "body/repo"),  # fields missing
        (b"[]", None),
    ],
)
async def test_fast_post_bad_bodies_are_problem_json_and_store_nothing(
    client: httpx.AsyncClient, pg: asyncpg.Connection, content: bytes, field: str | None
) -> None:
    r = await client.post("/api/v1/runs", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["status"] == 422
    if field is not None:
        assert field in [e["field"] for e in problem["errors"]]
    bad_time = run(1, finished_at=(datetime.now(UTC) + timedelta(days=2)).isoformat())
    late = await client.post("/api/v1/runs", json=bad_time)
    assert late.status_code == 422
    assert late.headers["content-type"] == "application/problem+json"
    assert await counts(pg) == (0, 0, 0)


async def test_a_post_that_cannot_commit_in_time_is_503_and_stores_nothing(
    make_client: Any, pg: asyncpg.Connection
) -> None:
    # one statement: the job, the run and its containers are stored together or not at all
    async with make_client(ingest_timeout_seconds=0.5) as client:
        tx = pg.transaction()
        await tx.start()
        await pg.execute("LOCK TABLE run_containers IN ACCESS EXCLUSIVE MODE")
        try:
            r = await asyncio.wait_for(client.post("/api/v1/runs", json=run(1)), 20)
        finally:
            await tx.rollback()
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "2"
        assert r.headers["content-type"] == "application/problem+json"
        await asyncio.sleep(0.2)  # the cancelled statement is gone with its connection
        assert await counts(pg) == (0, 0, 0)
        # and the retry is stored
        assert (await client.post("/api/v1/runs", json=run(1))).status_code == 201
        assert await counts(pg) == (1, 1, 1)


# --------------------------------------------------------------------------- GET


async def test_a_post_invalidates_this_workers_answer(client: httpx.AsyncClient) -> None:
    assert (await client.post("/api/v1/runs", json=run(1, container(mem=1 * GIB)))).status_code == 201
    before = await sizing(client)
    assert before["meta"]["clean_samples"] == 1
    assert (await sizing(client)) == before  # cached
    assert (await client.post("/api/v1/runs", json=run(2, container(mem=2 * GIB)))).status_code == 201
    after = await sizing(client)  # not the cached answer: this worker invalidated it after its own commit
    assert after["meta"]["clean_samples"] == 2
    assert after["containers"][0]["observed"]["memory_bytes"] == 2 * GIB


async def test_one_statement_answers_as_the_route_reads_them(client: httpx.AsyncClient) -> None:
    # the same history, overrides and answer as the three SQLAlchemy statements of the route's read
    bodies = [
        run(n, container(cpu=100.0 * n, mem=(n % 5 + 1) * 100 * MIB, limit=600 * MIB, oom_killed=n % 4 == 0))
        for n in range(1, 16)
    ]
    bodies.append(run(16, container(), container("db", mem=64 * MIB), node_memory_bytes=8 * GIB))
    for body in bodies:
        assert (await client.post("/api/v1/runs", json=body)).status_code == 201
    assert (await client.put("/api/v1/sizing/overrides/acme", json={"cpu_limit": "3"})).status_code == 201
    app: Any = client.app  # type: ignore[attr-defined]
    policy = sizing_service.Policy()
    for params in (SizingParams(), SizingParams(runs=1), SizingParams(runs=5, buffer=0, cpu_percentile="peak")):
        async with app.state.pgpool.acquire() as conn:
            fast = await pgread.recommend(conn=conn, key=KEY, params=params, policy=policy)
        async with app.state.engine.connect() as conn:
            slow = await sizing_service.recommend(conn=conn, key=KEY, params=params, policy=policy)
        a, b = fast.answer.as_dict(), slow.answer.as_dict()
        a["meta"].pop("generated_at")
        b["meta"].pop("generated_at")
        assert a == b
        assert a["meta"]["override_scope"] == "org"
        assert fast.job_id == slow.job_id
    async with app.state.pgpool.acquire() as conn:
        unseen = await pgread.recommend(
            conn=conn, key=ScopeKey("acme", "other", "w", "j"), params=SizingParams(), policy=policy
        )
    assert unseen.job_id is None
    assert unseen.answer.meta.phase == "unknown"
    assert unseen.answer.containers[0].cpu.limit == "3"  # the org's pin applies to a job never seen (O2)


async def test_an_expiring_override_stops_applying_at_its_expiry(client: httpx.AsyncClient) -> None:
    for n in range(1, 4):
        assert (await client.post("/api/v1/runs", json=run(n))).status_code == 201
    expires = datetime.now(UTC) + timedelta(seconds=2)
    put = await client.put(
        "/api/v1/sizing/overrides/acme/web", json={"cpu_limit": "7", "expires_at": expires.isoformat()}
    )
    assert put.status_code == 201, put.text
    pinned = await sizing(client)
    assert pinned["containers"][0]["cpu"]["limit"] == "7"
    assert pinned["meta"]["override_scope"] == "repo"
    assert (await sizing(client)) == pinned  # cached until the expiry
    await asyncio.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.2)
    after = await sizing(client)
    assert after["containers"][0]["cpu"]["source"]["limit"] == "algorithm"
    assert after["meta"]["override_scope"] == "global"


async def test_a_hung_read_answers_the_last_answer_degraded(make_client: Any, pg: asyncpg.Connection) -> None:
    async with make_client(sizing_deadline_ms=300) as client:
        for n in range(1, 4):
            assert (await client.post("/api/v1/runs", json=run(n, container(mem=3 * GIB)))).status_code == 201
        good = await sizing(client)
        client.app.state.answers.invalidate(KEY)  # type: ignore[attr-defined]
        tx = pg.transaction()
        await tx.start()
        await pg.execute("LOCK TABLE jobs, runs, overrides IN ACCESS EXCLUSIVE MODE")
        try:
            started = asyncio.get_running_loop().time()
            r = await asyncio.wait_for(client.get(sizing_path()), 20)
            took = asyncio.get_running_loop().time() - started
        finally:
            await tx.rollback()
        assert r.status_code == 200
        assert r.headers["ci-sizer-degraded"] == "true"
        assert took < 3
        degraded = r.json()
        assert degraded["meta"]["degraded"] is True
        assert degraded["containers"] == good["containers"]  # the last answer served, not the defaults
        # the database answers again: so does the path, no longer degraded
        again = await client.get(sizing_path(), params={"format": "k8s"})
        assert again.status_code == 200
        assert "ci-sizer-degraded" not in again.headers


def test_a_job_under_steady_runs_is_summarised_at_most_every_min_interval() -> None:
    from service.jobs.summaries import SummaryRefresher

    refresher = SummaryRefresher(min_interval=60.0)
    refresher.note(1, KEY)
    assert refresher._due() == {1: KEY}  # first run after a quiet spell: on the next pass
    assert refresher.pending == {}
    refresher.note(1, KEY)
    other = ScopeKey("acme", "web", "ci", "other")
    refresher.note(2, other)
    assert refresher._due() == {2: other}  # job 1 was summarised a moment ago: it waits
    assert refresher.pending == {1: KEY}  # kept, not dropped
    assert SummaryRefresher()._due() == {}
    eager = SummaryRefresher()
    eager.note(1, KEY)
    assert eager._due() == {1: KEY}
    eager.note(1, KEY)
    assert eager._due() == {1: KEY}  # min_interval 0: every pass


# --------------------------------------------------------------------------- the pools' size


@pytest.mark.parametrize("size", [8, 3])
async def test_the_pool_size_setting_bounds_both_pools(
    make_client: Any, pg: asyncpg.Connection, db_url: str, size: int
) -> None:
    # CI_SIZER_DATABASE_POOL_SIZE (README, Configuration): the build path's pool opens that many
    # connections at start (Pool.warm), the engine's pool holds at most that many; 8 by default
    # (tests/conftest.py's apps take 3 unless told)
    assert Settings(database_url=db_url).database_pool_size == 8
    async with make_client(database_pool_size=size) as client:
        app = client.app  # type: ignore[attr-defined]
        assert app.state.settings.database_pool_size == size
        assert app.state.pgpool.size == size
        assert app.state.pgpool.opened == size  # all opened at start
        assert app.state.engine.pool.size() == size
        backends = await pg.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        # the lean pool's connections at least; at most both pools full and the change feed's listener,
        # the bound the README gives for PostgreSQL's max_connections
        assert size <= backends <= 2 * size + 1


def test_the_pool_size_setting_is_bounded() -> None:
    for bad in (0, 101):
        with pytest.raises(ValidationError, match="database_pool_size"):
            Settings(database_url="sqlite:///x.db", database_pool_size=bad)
