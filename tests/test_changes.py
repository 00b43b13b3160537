"""The change feed's announcements of the build path's runs (issue 38): after the commit, many jobs in
one notification, in a transaction of their own; every job noted is announced, and a worker hears
each of them."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson
import pytest
from sqlalchemy.engine import make_url

from service import changes
from service.cache import AnswerCache, CacheKey, Entry
from service.keys import ScopeKey
from service.pgpool import Pool
from service.sizing import service as sizing_service
from service.sizing.history import History

from .helpers import JOB, MIB, container, run, sizing_path

P = CacheKey(5, 20, "p95")


def keys(n: int, org: str = "acme") -> list[ScopeKey]:
    return [ScopeKey(org, f"repo-{i}", "ci.yml", f"build-{i}") for i in range(n)]


def cached(cache: AnswerCache, key: ScopeKey) -> None:
    answer = sizing_service.compute(key=key, history=History(), pins={}, params=P, policy=sizing_service.Policy())
    cache.put(key, P, cache.ticket(key), Entry(answer=answer, body=b"{}", fresh_until=float("inf")))


def test_payloads_name_every_job_once_within_the_bound() -> None:
    many = keys(300)
    out = changes.payloads("worker-a", many, limit=2000)
    assert len(out) > 1  # 300 jobs do not fit in 2,000 bytes
    assert all(len(p.encode()) <= 2000 for p in out)
    named = [ScopeKey(*item) for p in out for item in orjson.loads(p)["jobs"]]
    assert named == many
    assert {orjson.loads(p)["origin"] for p in out} == {"worker-a"}
    assert changes.payloads("worker-a", []) == []


def test_a_notification_of_several_jobs_invalidates_each_and_no_other() -> None:
    cache = AnswerCache(100)
    a, b, c = keys(3)
    for key in (a, b, c):
        cached(cache, key)
    (payload,) = changes.payloads("another worker", [a, c])
    changes.apply(cache, payload)
    assert cache.fresh(a, P) is None
    assert cache.fresh(c, P) is None
    assert cache.fresh(b, P) is not None
    cached(cache, a)
    (own,) = changes.payloads(cache.origin, [a])
    changes.apply(cache, own)  # its own announcement: it invalidated after its commit already
    assert cache.fresh(a, P) is not None


def test_a_worker_of_an_older_release_invalidates_everything_on_a_batch() -> None:
    # an older worker reads only "changed": a batch has none, which it treats as "everything changed"
    message = orjson.loads(changes.payloads("another worker", keys(2))[0])
    assert "changed" not in message
    # what such a worker does with it: the lines it shares with this release (no "jobs" branch there),
    # run here on the message without the key it does not know
    cache = AnswerCache(100)
    others = keys(3, org="globex")
    for key in others:
        cached(cache, key)
    del message["jobs"]
    changes.apply(cache, orjson.dumps(message).decode())
    assert all(cache.fresh(key, P) is None for key in others)


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _listener(url: str) -> tuple[Any, list[str]]:
    heard: list[str] = []
    conn = await asyncpg.connect(_dsn(url))
    await conn.add_listener(changes.CHANNEL, lambda *args: heard.append(args[3]))
    return conn, heard


async def _until(check: Any, seconds: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not check():
        assert loop.time() < deadline, "not in time"
        await asyncio.sleep(0.01)


async def test_jobs_noted_together_are_announced_in_few_notifications(postgresql_database: str) -> None:
    listener, heard = await _listener(postgresql_database)
    pool = Pool(postgresql_database, size=2)
    notifier = changes.Notifier(pool, "worker-a")
    task = asyncio.create_task(notifier.run())
    try:
        many = keys(50)
        done = [notifier.note(key) for key in many]  # as 50 POSTs committing at once would
        await asyncio.wait_for(asyncio.gather(*done), 10)
        assert notifier.batches < len(many)
        await _until(lambda: sum(len(orjson.loads(p)["jobs"]) for p in heard) >= len(many))
        announced = [ScopeKey(*item) for p in heard for item in orjson.loads(p)["jobs"]]
        assert sorted(map(str, announced)) == sorted(map(str, many))
        assert len(announced) == len(many)
        assert notifier.sent == len(heard)
        # and a job noted later is announced on its own, at once
        await asyncio.wait_for(notifier.note(ScopeKey("acme", "late", "ci.yml", "build")), 10)
        await _until(lambda: any("late" in p for p in heard))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pool.close()
        await listener.close()


async def test_jobs_whose_announcement_failed_are_announced_by_the_next_flush(postgresql_database: str) -> None:
    listener, heard = await _listener(postgresql_database)
    down = Pool("postgresql://postgres@127.0.0.1:1/nowhere", size=1, acquire_timeout=1)
    notifier = changes.Notifier(down, "worker-a")
    key = ScopeKey("acme", "web", "ci.yml", "build")
    done = notifier.note(key)
    assert await notifier.flush() is False  # the database cannot be reached
    assert done.done()  # the run is stored: its POST is not held
    assert notifier.sent == 0
    up = Pool(postgresql_database, size=1)
    try:
        notifier.pool = up
        assert await notifier.flush() is True  # the last flush (at shutdown), or the task's retry
        await _until(lambda: len(heard) == 1)
        assert orjson.loads(heard[0])["jobs"] == [[key.org, key.repo, key.workflow, key.job]]
    finally:
        await up.close()
        await down.close()
        await listener.close()


async def test_a_run_posted_to_one_worker_is_announced_to_another(make_client: Any, db_url: str) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("the change feed is PostgreSQL's LISTEN/NOTIFY")
    async with make_client() as a, make_client() as b:
        first = await a.get(sizing_path())
        assert first.status_code == 200
        assert (await a.get(sizing_path())).json() == first.json()  # now a serves it from its cache
        before = b.app.state.notifier.batches
        r = await b.post("/api/v1/runs", json=run(1, container(mem=300 * MIB)))
        assert r.status_code == 201, r.text

        async def a_sees_it() -> bool:
            return bool((await a.get(sizing_path())).json()["meta"]["clean_samples"] == 1)

        # the 201 does not wait for the announcement (issue 38): it follows, in b's next batch
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not await a_sees_it():
            assert loop.time() < deadline, f"{JOB} not announced to the other worker"
            await asyncio.sleep(0.02)
        while b.app.state.notifier.batches == before:  # counted once b's statement has returned
            assert loop.time() < deadline, "b's Notifier sent nothing"
            await asyncio.sleep(0.01)


async def test_a_run_stored_by_the_route_is_announced_after_its_commit(make_client: Any, db_url: str) -> None:
    # a batch (or a large body, or a run with growth events) is stored by the route, not the build
    # path's statement: it is announced the same way, by the worker's Notifier after the commit
    if not db_url.startswith("postgresql"):
        pytest.skip("the change feed is PostgreSQL's LISTEN/NOTIFY")
    async with make_client() as a, make_client() as b:
        await a.get(sizing_path())
        before = b.app.state.notifier.batches
        r = await b.post("/api/v1/runs:batch", json={"runs": [run(1, container(mem=300 * MIB))]})
        assert r.status_code == 200, r.text
        assert r.json()["created"] == 1

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while (await a.get(sizing_path())).json()["meta"]["clean_samples"] != 1:
            assert loop.time() < deadline, "the batch's run was not announced to the other worker"
            await asyncio.sleep(0.02)
        while b.app.state.notifier.batches == before:  # by b's Notifier, after the commit
            assert loop.time() < deadline, "b's Notifier sent nothing"
            await asyncio.sleep(0.01)
