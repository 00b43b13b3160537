"""The lean asyncpg pool (service/pgpool.py) against the real PostgreSQL of the test session."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from service.pgpool import Pool, PoolClosed, PoolTimeout, asyncpg_dsn


@pytest.fixture
async def pool(postgresql_database: str) -> AsyncIterator[Pool]:
    p = Pool(postgresql_database, size=2, acquire_timeout=2)
    yield p
    await p.close()


def test_dsn_drops_the_driver() -> None:
    assert asyncpg_dsn("postgresql+asyncpg://u@h:5/db") == "postgresql://u@h:5/db"
    assert asyncpg_dsn("postgresql://u@h/db") == "postgresql://u@h/db"


async def test_helpers_and_reuse_without_reset(pool: Pool) -> None:
    assert await pool.fetchval("SELECT 1 + $1::int", 2) == 3
    row = await pool.fetchrow("SELECT $1::text AS a", "x")
    assert row["a"] == "x"
    assert await pool.execute("SELECT 1") == "SELECT 1"
    assert [r[0] for r in await pool.fetch("SELECT generate_series(1, 3)")] == [1, 2, 3]
    # one connection serves them all, handed back as it is: the same backend each time
    pids = {await pool.fetchval("SELECT pg_backend_pid()") for _ in range(5)}
    assert len(pids) == 1
    assert pool.opened == 1
    assert pool.discarded == 0


async def test_concurrency_beyond_the_size_waits(pool: Pool) -> None:
    running = 0
    peak = 0

    async def one() -> int:
        nonlocal running, peak
        async with pool.acquire() as conn:
            running += 1
            peak = max(peak, running)
            await conn.execute("SELECT pg_sleep(0.05)")
            running -= 1
            return int(await conn.fetchval("SELECT pg_backend_pid()"))

    started = time.monotonic()
    pids = await asyncio.gather(*(one() for _ in range(6)))
    took = time.monotonic() - started
    assert peak == 2  # never more than the size at once
    assert len(set(pids)) == 2
    assert took >= 0.15  # six sleeps of 50 ms over two connections: three waves
    assert pool.opened == 2
    assert pool.free == 2


async def test_a_released_connection_goes_to_the_acquire_that_waited_longest(postgresql_database: str) -> None:
    # a worker at saturation releases a connection and asks for one again at once (its next request);
    # the acquire already waiting gets the connection first. asyncio's queue let the newcomer take it
    # and sent the waiter to the back of the queue again: POSTs waited 50-235 ms for a connection where
    # a fair turn was about 45 ms (docs/performance.md, "The pool's queue")
    order: list[str] = []
    async with Pool(postgresql_database, size=1, acquire_timeout=5) as pool:

        async def waiter() -> None:
            async with pool.acquire():
                order.append("waiting one")

        async with pool.acquire():
            waiting = asyncio.create_task(waiter())
            await asyncio.sleep(0.05)  # it waits for the one connection
        async with pool.acquire():  # asked in the same turn as the release, before the waiter has run
            order.append("newcomer")
        await waiting
        assert order == ["waiting one", "newcomer"]
        assert pool.free == 1


async def test_a_wait_ended_as_it_was_handed_a_connection_passes_it_on(postgresql_database: str) -> None:
    # the release hands the connection to a waiter whose wait is cancelled in the same turn (its
    # timeout, its request gone): the connection goes on to the next waiter, none is lost
    async with Pool(postgresql_database, size=1, acquire_timeout=5) as pool:
        got: list[int] = []

        async def take(n: int) -> None:
            async with pool.acquire():
                got.append(n)

        async with pool.acquire():
            first, second = asyncio.create_task(take(1)), asyncio.create_task(take(2))
            await asyncio.sleep(0.05)  # both wait, the first in front
        first.cancel()  # handed the connection by the release just above, then cancelled
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.wait_for(second, 5)
        assert got == [2]
        assert pool.free == 1
        assert await pool.fetchval("SELECT 1") == 1


async def test_acquire_timeout_raises_a_clear_error(pool: Pool) -> None:
    async with pool.acquire(), pool.acquire():
        started = time.monotonic()
        with pytest.raises(PoolTimeout, match=r"no database connection free within 0\.1s \(pool of 2"):
            async with pool.acquire(timeout=0.1):
                pass
        assert 0.09 <= time.monotonic() - started < 1
    # the slots came back: acquiring works again
    assert await pool.fetchval("SELECT 1") == 1
    assert pool.free == 2


async def test_a_broken_connection_is_replaced(pool: Pool, postgresql_database: str) -> None:
    pid = await pool.fetchval("SELECT pg_backend_pid()")
    admin = await asyncpg.connect(asyncpg_dsn(postgresql_database))
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    # the first use after the kill may fail (the pool cannot know before trying); the connection is then
    # dropped, so the next use works on a new one
    try:
        await pool.fetchval("SELECT 1")
    except (
        asyncpg.AdminShutdownError,
        asyncpg.ConnectionDoesNotExistError,
        asyncpg.exceptions.InternalClientError,  # asyncpg read the FATAL while idle and lost step
        ConnectionError,
    ):
        assert pool.discarded == 1
    assert await pool.fetchval("SELECT 1") == 1
    new_pid = await pool.fetchval("SELECT pg_backend_pid()")
    assert new_pid != pid
    assert pool.opened == 1


async def test_a_closed_connection_is_replaced(pool: Pool) -> None:
    async with pool.acquire() as conn:
        old = conn
        await conn.close()
    assert pool.discarded == 1
    async with pool.acquire() as conn:
        assert conn is not old
        assert await conn.fetchval("SELECT 1") == 1


async def test_a_connection_left_in_a_transaction_is_discarded(pool: Pool) -> None:
    async with pool.acquire() as conn:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        await conn.execute("BEGIN")
        await conn.execute("CREATE TEMPORARY TABLE leftover (x int)")
    assert pool.discarded == 1
    async with pool.acquire() as conn:
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SELECT pg_backend_pid()") != pid
        # nothing of the abandoned transaction is visible
        assert await conn.fetchval("SELECT to_regclass('pg_temp.leftover')") is None


async def test_a_failed_transaction_is_discarded(pool: Pool) -> None:
    async with pool.acquire() as conn:
        await conn.execute("BEGIN")
        with pytest.raises(asyncpg.DivisionByZeroError):
            await conn.execute("SELECT 1 / 0")
        assert conn.is_in_transaction()  # aborted, awaiting a ROLLBACK
    assert pool.discarded == 1
    assert await pool.fetchval("SELECT 1") == 1


async def test_a_server_error_outside_a_transaction_keeps_the_connection(pool: Pool) -> None:
    pid = await pool.fetchval("SELECT pg_backend_pid()")
    with pytest.raises(asyncpg.DivisionByZeroError):
        await pool.fetchval("SELECT 1 / 0")
    assert pool.discarded == 0
    assert await pool.fetchval("SELECT pg_backend_pid()") == pid


async def test_a_cancelled_query_discards_the_connection(pool: Pool) -> None:
    async def slow() -> None:
        async with pool.acquire() as conn:
            await conn.execute("SELECT pg_sleep(5)")

    task = asyncio.create_task(slow())
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.discarded == 1
    assert pool.free == 2
    assert await pool.fetchval("SELECT 1") == 1


async def test_close_closes_all(postgresql_database: str) -> None:
    pool = Pool(postgresql_database, size=3)
    held = []
    for _ in range(3):
        cm = pool.acquire()
        held.append((cm, await cm.__aenter__()))
    conns = [c for _, c in held]
    for cm, _ in held[:2]:
        await cm.__aexit__(None, None, None)
    # one still in use: close waits for it (briefly), then terminates it
    pool.close_timeout = 0.2
    await pool.close()
    assert all(c.is_closed() for c in conns)
    assert pool.opened == 0
    with pytest.raises(PoolClosed):
        async with pool.acquire():
            pass
    await held[2][0].__aexit__(None, None, None)  # a late release is harmless


async def test_close_waits_for_a_connection_in_use(postgresql_database: str) -> None:
    pool = Pool(postgresql_database, size=2)
    release = asyncio.Event()

    async def user() -> int:
        async with pool.acquire() as conn:
            await release.wait()
            return int(await conn.fetchval("SELECT 7"))

    task = asyncio.create_task(user())
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(pool.close())
    await asyncio.sleep(0.05)
    assert not closing.done()
    release.set()
    assert await task == 7  # the query in flight finished on its connection
    await closing
    assert pool.opened == 0


async def test_database_down_fails_fast_and_recovers() -> None:
    # nothing listens on port 1: opening a connection fails, the slot stays usable
    pool = Pool("postgresql://postgres@127.0.0.1:1/postgres", size=1, acquire_timeout=1)
    for _ in range(2):
        with pytest.raises(OSError, match=r"[Cc]onnect"):
            await pool.fetchval("SELECT 1")
    assert pool.free == 1
    await pool.close()


async def test_warm_opens_every_connection_and_primes_each(pool: Pool) -> None:
    primed: list[int] = []

    async def prime(conn: Any) -> None:
        primed.append(await conn.fetchval("SELECT pg_backend_pid()"))

    assert await pool.warm(prime) == pool.size
    assert pool.opened == pool.size
    assert len(set(primed)) == pool.size  # one connection each


async def test_warm_with_the_database_down_opens_nothing_and_does_not_fail() -> None:
    async with Pool("postgresql://nobody@127.0.0.1:1/x", size=2, acquire_timeout=1) as down:
        assert await down.warm() == 0
        assert down.opened == 0
        assert down.free == 2  # the slots stay, to be opened later


async def test_init_runs_on_every_new_connection_before_its_first_use(postgresql_database: str) -> None:
    opened: list[int] = []

    async def init(conn: Any) -> None:
        opened.append(await conn.fetchval("SELECT pg_backend_pid()"))

    p = Pool(postgresql_database, size=1, acquire_timeout=2, init=init)
    try:
        async with p.acquire() as conn:
            assert opened == [await conn.fetchval("SELECT pg_backend_pid()")]
            conn.terminate()  # discarded on release: the next acquire opens (and inits) another
        async with p.acquire() as conn:
            assert len(opened) == 2
            assert opened[-1] == await conn.fetchval("SELECT pg_backend_pid()")
    finally:
        await p.close()


async def test_a_failing_init_leaves_the_slot_empty_and_raises(postgresql_database: str) -> None:
    async def init(conn: Any) -> None:
        raise RuntimeError("no")

    p = Pool(postgresql_database, size=1, acquire_timeout=2, init=init)
    try:
        with pytest.raises(RuntimeError):
            async with p.acquire():
                pass
        assert p.opened == 0
        assert p.free == 1
    finally:
        await p.close()


async def test_the_build_paths_array_types_are_learned_as_a_connection_opens(postgresql_database: str) -> None:
    # issue 38: asyncpg knows none of the array types the POST binds; the first POST on each connection
    # stopped to ask the catalog (WITH RECURSIVE typeinfo_tree), mid-run; now the pool's init asks once
    from service.main import lean_pool
    from service.runs import fastpath
    from service.settings import Settings

    p = lean_pool(Settings(database_url=postgresql_database))
    try:
        async with p.acquire() as conn:
            asked: list[str] = []
            conn.add_query_logger(lambda q: asked.append(q.query))
            tx = conn.transaction()  # rolled back: the session's database is shared with later tests
            await tx.start()
            try:
                row = await conn.fetchrow(fastpath.STATEMENT, *_run_arguments())
                assert row["run_pk"] is not None
            finally:
                await tx.rollback()
            await conn.fetchval("SELECT cardinality($1::bigint[])", [1, 2])
            assert asked, "the query logger saw nothing"
            assert not [q for q in asked if "typeinfo_tree" in q]
    finally:
        await p.close()


async def test_the_engines_connections_learn_the_array_types_as_they_open(postgresql_database: str) -> None:
    # retention and the job states bind job ids as bigint[] through the engine: its connections open
    # lazily, mid-run, and each stopped at its first such statement to ask the catalog
    from sqlalchemy import text

    from service.db import build_engine

    engine = build_engine(postgresql_database)
    try:
        async with engine.connect() as c:
            raw = (await c.get_raw_connection()).driver_connection
            asked: list[str] = []
            raw.add_query_logger(lambda q: asked.append(q.query))
            ids = (await c.execute(text("SELECT CAST(:ids AS bigint[])"), {"ids": [3, 4]})).scalar_one()
            assert ids == [3, 4]
            assert asked
            assert not [q for q in asked if "typeinfo_tree" in q]
    finally:
        await engine.dispose()


def _run_arguments() -> list[Any]:
    """The POST statement's arguments for one run (tests/helpers.run)."""
    from service.runs import fastpath
    from service.runs import service as runs_service
    from service.runs.schemas import RunCreate
    from service.wire import utcnow

    from .helpers import container, run

    body = RunCreate.model_validate(run(1, container(), container("side")))
    return fastpath.arguments(runs_service.prepare(body), now=utcnow())
