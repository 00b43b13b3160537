"""Each job's build-path state (service/sizing/state.py, migration 0006; PostgreSQL only): the counts
a new run's one-statement POST merges in equal the counts rebuilt from the stored runs, whatever the
order and mix of runs; every other writer of runs (the route's ingest and batch, retention) rebuilds
them; a job stored without them is repaired and answered from its runs meanwhile; the org's first-run
prior (rule E6) counts a job's first sample once and is not rewritten by runs that change nothing."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.sizing import state

from ..helpers import GIB, JOB, MIB, T0, container, examples, run, sizing

STATE = "SELECT runs, clean_runs, samples, node_memory_bytes, node_memory_at, node_memory_run FROM job_state WHERE job_id = $1"


@pytest.fixture
def db_url(postgresql_only: str) -> str:
    """PostgreSQL only: SQLite keeps no state (its routes count the runs)."""
    return postgresql_only


async def job_id(pg: asyncpg.Connection, job: dict[str, str] | None = None) -> int:
    j = job or JOB
    found = await pg.fetchval(
        "SELECT id FROM jobs WHERE org = $1 AND repo = $2 AND workflow = $3 AND job = $4",
        j["org"],
        j["repo"],
        j["workflow"],
        j["job"],
    )
    assert found is not None
    return int(found)


async def rebuilt(client: httpx.AsyncClient, pg: asyncpg.Connection, jid: int) -> tuple[Any, Any]:
    """(the row as the writes left it, the row rebuilt from the stored runs)."""
    kept = await pg.fetchrow(STATE, jid)
    async with client.app.state.write_engine.begin() as conn:  # type: ignore[attr-defined]
        await state.rebuild(conn=conn, job_ids=[jid])
    return kept, await pg.fetchrow(STATE, jid)


def fast(client: httpx.AsyncClient) -> int:
    """Statements run on the lean pool so far: the one-statement POST and GET paths."""
    pool = client.app.state.pgpool  # type: ignore[attr-defined]
    return int(pool.opened)


# --------------------------------------------------------------------------- merge == rebuild

RUN = st.fixed_dictionaries(
    {
        "minute": st.integers(0, 40),  # out of order, ties included
        "mem": st.sampled_from([100 * MIB, 500 * MIB, 950 * MIB, 2 * GIB]),
        "limit": st.sampled_from([None, 1 * GIB]),  # 950Mi is S1-suspect under 1Gi, 2Gi is killed (E1)
        "killed": st.sampled_from([None, False, True]),
        "node": st.sampled_from([None, 8 * GIB, 16 * GIB]),
        "sidecar": st.booleans(),
    }
)


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=st.lists(RUN, min_size=1, max_size=12))
async def test_the_posts_merge_equals_a_rebuild_from_the_runs(
    make_client: Any, pg: asyncpg.Connection, runs: list[dict[str, Any]]
) -> None:
    await pg.execute("DELETE FROM jobs")
    await pg.execute("DELETE FROM fleet_priors")
    async with make_client() as client:
        for n, r in enumerate(runs):
            main = container(mem=r["mem"], limit=r["limit"], oom_killed=r["killed"])
            extra = [container("db", mem=64 * MIB)] if r["sidecar"] else []
            body = run(n, main, *extra, node_memory_bytes=r["node"])
            body["finished_at"] = (T0 + timedelta(minutes=r["minute"])).isoformat().replace("+00:00", "Z")
            assert (await client.post("/api/v1/runs", json=body)).status_code == 201
        assert fast(client) >= 1  # stored by the one-statement POST, not the route
        jid = await job_id(pg)
        kept, fresh = await rebuilt(client, pg, jid)
        assert kept is not None
        assert kept["clean_runs"] is not None
        assert dict(kept) == dict(fresh)
        # rule S4 as the route counts it, and the answer's clean_samples
        assert kept["clean_runs"] == await pg.fetchval("SELECT count(*) FROM runs WHERE job_id = $1 AND clean", jid)
        assert kept["runs"] == len(runs)
        assert (await sizing(client))["meta"]["clean_samples"] == kept["clean_runs"]


async def test_concurrent_posts_and_rebuilds_of_one_job_lose_no_run(
    client: httpx.AsyncClient, pg: asyncpg.Connection
) -> None:
    assert (await client.post("/api/v1/runs", json=run(0))).status_code == 201
    jid = await job_id(pg)
    engine = client.app.state.write_engine  # type: ignore[attr-defined]
    rng = random.Random(7)

    async def post(n: int) -> None:
        body = run(n, container(mem=rng.choice([100, 930]) * MIB, limit=rng.choice([None, 950 * MIB])))  # 930Mi: S1
        assert (await client.post("/api/v1/runs", json=body)).status_code == 201

    async def rebuild() -> None:
        async with engine.begin() as conn:
            await state.rebuild(conn=conn, job_ids=[jid])

    await asyncio.gather(*(post(n) if n % 4 else rebuild() for n in range(1, 41)))
    kept, fresh = await rebuilt(client, pg, jid)
    assert dict(kept) == dict(fresh)
    assert kept["clean_runs"] == await pg.fetchval("SELECT count(*) FROM runs WHERE job_id = $1 AND clean", jid)


# --------------------------------------------------------------------------- the other writers


async def test_the_routes_batch_and_retention_rebuild_the_state(make_client: Any, pg: asyncpg.Connection) -> None:
    async with make_client(retention_runs=3, retention_interval_seconds=0.1) as client:
        batch = [run(n, container(mem=(n + 1) * 100 * MIB), node_memory_bytes=(8 + n) * GIB) for n in range(6)]
        r = await client.post("/api/v1/runs:batch", json={"runs": batch})
        assert r.status_code == 200, r.text
        assert r.json()["created"] == 6
        jid = await job_id(pg)

        async def pruned() -> bool:
            return bool(await pg.fetchval("SELECT count(*) FROM runs WHERE job_id = $1", jid) == 3)

        for _ in range(100):
            if await pruned():
                break
            await asyncio.sleep(0.05)
        assert await pruned()
        row = await pg.fetchrow(STATE, jid)
        assert row["runs"] == row["clean_runs"] == 3  # the three pruned runs no longer count (S4 after retention)
        assert row["node_memory_bytes"] == 13 * GIB  # the newest run's node (S15)
        assert (await sizing(client))["meta"]["clean_samples"] == 3


async def test_a_job_stored_without_state_is_answered_from_its_runs_and_repaired(
    client: httpx.AsyncClient, pg: asyncpg.Connection
) -> None:
    for n in range(4):
        assert (await client.post("/api/v1/runs", json=run(n, node_memory_bytes=16 * GIB))).status_code == 201
    jid = await job_id(pg)
    before = await sizing(client, runs=3)
    # as a job stored before migration 0006, or whose runs were edited by hand: no row
    await pg.execute("DELETE FROM job_state WHERE job_id = $1", jid)
    assert (await client.post("/api/v1/runs", json=run(4, node_memory_bytes=32 * GIB))).status_code == 201
    invalid = await pg.fetchrow(STATE, jid)
    assert invalid["clean_runs"] is None  # the POST could not count the runs it did not see
    answer = await sizing(client, runs=3)  # answered from the runs, and the job noted for repair
    assert answer["meta"]["clean_samples"] == before["meta"]["clean_samples"] + 1 == 5
    assert answer["meta"]["node_ceiling_bytes"] == 32 * GIB * 9 // (10 * MIB) * MIB  # S15 from the newest run
    repair = client.app.state.state_repair  # type: ignore[attr-defined]
    assert jid in repair.pending
    assert await repair.run_once(client.app.state.write_engine) == 1  # type: ignore[attr-defined]
    row = await pg.fetchrow(STATE, jid)
    assert row["clean_runs"] == 5
    assert row["node_memory_bytes"] == 32 * GIB


async def test_the_start_scan_rebuilds_every_job_without_state(
    client: httpx.AsyncClient, pg: asyncpg.Connection
) -> None:
    jobs = [{**JOB, "job": f"j{i}"} for i in range(3)]
    for j in jobs:
        assert (await client.post("/api/v1/runs", json=run(1, job=j))).status_code == 201
    await pg.execute("DELETE FROM job_state")
    repair = state.StateRepair()
    repair.BATCH = 2  # more than one batch
    assert await repair.run_once(client.app.state.write_engine) == 0  # type: ignore[attr-defined]  # nothing noted
    assert repair.scanned
    assert await pg.fetchval("SELECT count(*) FROM job_state WHERE clean_runs = 1 AND samples = 1") == 3


# --------------------------------------------------------------------------- rule E6's prior


async def test_the_prior_counts_a_jobs_first_sample_once_and_is_not_rewritten_for_nothing(
    client: httpx.AsyncClient, pg: asyncpg.Connection
) -> None:
    prior = "SELECT sampled_jobs, peak_bytes, updated_at FROM fleet_priors WHERE org = $1"
    killed = container(mem=2 * GIB, limit=1 * GIB)  # past its limit: a kill (E1), no sample
    assert (await client.post("/api/v1/runs", json=run(1, killed))).status_code == 201
    assert await pg.fetchrow(prior, JOB["org"]) is None
    assert (await client.post("/api/v1/runs", json=run(2, container(mem=300 * MIB)))).status_code == 201
    first = await pg.fetchrow(prior, JOB["org"])
    assert (first["sampled_jobs"], first["peak_bytes"]) == (1, 300 * MIB)
    # near its limit (S1's clause) but not killed: a sample, not the job's first; a lower peak
    near = container(mem=190 * MIB, limit=195 * MIB)
    assert (await client.post("/api/v1/runs", json=run(3, near))).status_code == 201
    assert await pg.fetchrow(prior, JOB["org"]) == first  # nothing changed: not even rewritten
    assert (await client.post("/api/v1/runs", json=run(4, container(mem=700 * MIB)))).status_code == 201
    higher = await pg.fetchrow(prior, JOB["org"])
    assert (higher["sampled_jobs"], higher["peak_bytes"]) == (1, 700 * MIB)
    other = {**JOB, "job": "lint"}
    assert (await client.post("/api/v1/runs", json=run(1, container(mem=100 * MIB), job=other))).status_code == 201
    assert (await pg.fetchrow(prior, JOB["org"]))["sampled_jobs"] == 2
    assert await pg.fetchval("SELECT samples FROM job_state WHERE job_id = $1", await job_id(pg)) == 3


async def test_retention_looks_only_at_jobs_over_the_bound(make_client: Any, pg: asyncpg.Connection) -> None:
    # a job under the bound costs retention no statement of its own; one over it is pruned
    async with make_client(retention_runs=3, retention_interval_seconds=3600) as client:
        small, big = {**JOB, "job": "small"}, {**JOB, "job": "big"}
        for n in range(2):
            assert (await client.post("/api/v1/runs", json=run(n, job=small))).status_code == 201
        for n in range(5):
            assert (await client.post("/api/v1/runs", json=run(n, job=big))).status_code == 201
        pruner = client.app.state.pruner  # type: ignore[attr-defined]
        assert set(pruner.pending) == {await job_id(pg, small), await job_id(pg, big)}
        over = await pruner._over_limit(client.app.state.write_sessionmaker, dict(pruner.pending))  # type: ignore[attr-defined]
        assert set(over) == {await job_id(pg, big)}
        assert await pruner.run_once(client.app.state.write_sessionmaker, client.app.state.answers) == 2  # type: ignore[attr-defined]
        assert await pg.fetchval("SELECT runs FROM job_state WHERE job_id = $1", await job_id(pg, big)) == 3
        assert await pg.fetchval("SELECT runs FROM job_state WHERE job_id = $1", await job_id(pg, small)) == 2
