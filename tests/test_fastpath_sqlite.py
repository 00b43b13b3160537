"""The SQLite build path answered before routing (service/sizing/fastpath.py, sizing/sqliteread.py,
sizing/inline.py):
a sizing miss read on the event loop with a read-only connection of its own, giving way to a thread
when it would wait for a lock or runs past its budget (or, for an in-memory database, read in one hop
to a pooled aiosqlite connection's thread), with the route's answers, rules and
fail-open promises. SQLite only: PostgreSQL's misses have their own one-statement read
(tests/test_fastpath_pg.py)."""

from __future__ import annotations

import asyncio
import gc
import re
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from service import migrations
from service.keys import ScopeKey
from service.sizing import inline, sqliteread
from service.sizing import service as sizing_service
from service.sizing.params import SizingParams

from .helpers import GIB, JOB, MIB, container, run, sizing_path


@pytest.fixture
def db_url(sqlite_only: str) -> str:
    """This module's tests run on SQLite only (overrides conftest's both-databases fixture)."""
    return sqlite_only


def job(name: str, *, org: str = "acme", repo: str = "web", workflow: str = "ci.yml") -> dict[str, str]:
    return {"org": org, "repo": repo, "workflow": workflow, "job": name}


def key_of(j: dict[str, str]) -> ScopeKey:
    return ScopeKey(j["org"], j["repo"], j["workflow"], j["job"])


#: jobs with histories of every kind the read path tells apart
CLEAN = job("clean")
OOM = job("oom")
TWO = job("two-containers")
ONE = job("one-run")
KILLED = job("killed-only")  # no clean run: the whole history is the window (and no efficient sample: E6's prior)
PINNED = job("pinned")  # a job override
WORKFLOW = job("wf-job", workflow="wf2.yml")  # a workflow override
EFFICIENT = job("eff-job", repo="eff")  # a repo override choosing the efficient policy
GROWTH = job("growth-job", repo="grow")  # a job override choosing the growth policy
BETA = job("beta-job", org="beta")  # an org override, expiring
UNSEEN = job("never-seen")
BETA_UNSEEN = job("never-seen", org="beta")
JOBS = (CLEAN, OOM, TWO, ONE, KILLED, PINNED, WORKFLOW, EFFICIENT, GROWTH, BETA, UNSEEN, BETA_UNSEEN)
PARAMS = (
    SizingParams(),
    SizingParams(runs=1),
    SizingParams(runs=5, buffer=0, cpu_percentile="peak"),
    SizingParams(runs=50, buffer=40, cpu_percentile="p50"),
)


async def fill(client: httpx.AsyncClient) -> None:
    bodies: list[dict[str, Any]] = []
    for n in range(1, 13):
        bodies.append(run(n, container(cpu=90.0 * n, mem=(n % 5 + 1) * 120 * MIB, limit=900 * MIB), job=CLEAN))
        bodies.append(
            run(n, container(cpu=200.0, mem=(n % 3 + 2) * 200 * MIB, limit=800 * MIB, oom_killed=n % 3 == 0), job=OOM)
        )
        bodies.append(
            run(
                n,
                container(cpu=[100.0 * n, 50.0, 300.0]),
                container("db", mem=64 * MIB * n, limit=2 * GIB),
                job=TWO,
                node_memory_bytes=(8 + n % 2) * GIB,
            )
        )
    for n in range(1, 5):
        bodies.append(run(n, container(mem=700 * MIB, limit=512 * MIB, oom_killed=True), job=KILLED))
    bodies.append(run(1, container(cpu=1500.0, mem=3 * GIB), job=ONE))
    for j, m in ((PINNED, 1), (WORKFLOW, 2), (EFFICIENT, 3), (GROWTH, 4), (BETA, 5)):
        for n in range(1, 7):
            oom = n == 5 and j in (EFFICIENT, GROWTH)
            bodies.append(
                run(n, container(cpu=100.0 * m, mem=m * 256 * MIB, limit=m * 300 * MIB, oom_killed=oom), job=j)
            )
    r = await client.post("/api/v1/runs:batch", json={"runs": bodies})
    assert r.status_code in (200, 201, 207), r.text
    expires = (datetime.now(UTC) + timedelta(days=3)).isoformat()
    overrides = {
        "/api/v1/sizing/overrides/acme/web/ci.yml/pinned": {"memory_limit": "3Gi", "cpu_request": "250m"},
        "/api/v1/sizing/overrides/acme/web/wf2.yml": {"cpu_request": "750m"},
        "/api/v1/sizing/overrides/acme/eff": {"sizing_policy": "efficient"},
        "/api/v1/sizing/overrides/acme/grow/ci.yml/growth-job": {"sizing_policy": "growth"},
        "/api/v1/sizing/overrides/beta": {"cpu_limit": "3", "expires_at": expires},
    }
    for path, body in overrides.items():
        put = await client.put(path, json=body)
        assert put.status_code == 201, put.text
    # an override that expired (set in the past by hand: the API refuses one): it no longer applies
    put = await client.put("/api/v1/sizing/overrides/acme/web/ci.yml/clean", json={"cpu_limit": "9"})
    assert put.status_code == 201, put.text
    app: Any = client.app  # type: ignore[attr-defined]
    db = sqlite3.connect(make_url(app.state.settings.database_url).database or "", isolation_level=None)
    try:
        past = (datetime.now(UTC) - timedelta(minutes=1)).replace(tzinfo=None).isoformat(sep=" ")
        db.execute("UPDATE overrides SET expires_at = ? WHERE job = 'clean'", (past,))
    finally:
        db.close()
    app.state.answers.invalidate(key_of(CLEAN))


def comparable(answer: dict[str, Any]) -> dict[str, Any]:
    answer["meta"].pop("generated_at")
    return answer


@pytest.mark.parametrize("policy", ["seed", "efficient"])
async def test_one_hop_answers_as_the_route_reads_them(make_client: Any, policy: str) -> None:
    # the same overrides, history, prior and answer as the route's SQLAlchemy statements, for every job
    async with make_client(
        sizing_policy=policy, memory_qos="burstable" if policy == "seed" else "guaranteed"
    ) as client:
        await fill(client)
        app: Any = client.app  # type: ignore[attr-defined]
        engine = app.state.engine
        pol = sizing_service.Policy.of(app.state.settings, app.state.ceilings)
        seen: set[bytes] = set()
        policies: set[str] = set()
        scopes: set[str] = set()
        assert isinstance(app.state.sqlite_reads, inline.Reader)  # a database file: connections of its own
        path = app.state.sqlite_reads.path
        # every read inline (a budget no read reaches, even on a busy machine), and every read interrupted
        # inline at once (a budget of 0) and read again on a thread
        reader = inline.Reader(path, inline_budget=60)
        giving_way = inline.Reader(path, inline_budget=0, inline_pause=0)
        for j in JOBS:
            for params in PARAMS:
                async with engine.connect() as conn:
                    slow = await sizing_service.recommend(conn=conn, key=key_of(j), params=params, policy=pol)
                b = comparable(slow.answer.as_dict())
                for fast in (
                    await reader.recommend(key=key_of(j), params=params, policy=pol),
                    await giving_way.recommend(key=key_of(j), params=params, policy=pol),
                    await sqliteread.recommend(engine=engine, key=key_of(j), params=params, policy=pol),
                ):
                    a = comparable(fast.answer.as_dict())
                    assert a == b, (j, params)
                    assert fast.job_id == slow.job_id
                    assert fast.fresh_until == slow.fresh_until, (j, params)
                seen.add(orjson.dumps(a))
                policies.add(a["meta"]["policy"])
                scopes.add(a["meta"]["override_scope"])
        await giving_way.close()
        await reader.close()
        # both ways were taken: inline, and on a thread after an interrupted inline read
        assert reader.inline_reads == len(JOBS) * len(PARAMS)
        assert giving_way.gave_way >= (len(JOBS) - 2) * len(PARAMS)  # all but the two jobs never seen
        # the comparison covered answers of every kind, not one default compared with itself
        assert len(seen) >= 30
        assert {"efficient", "growth"} <= policies
        assert {"global", "org", "workflow", "job"} <= scopes


def strip_times(body: bytes) -> bytes:
    return re.sub(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", b"T", body)


async def test_the_front_answers_misses_byte_for_byte_as_the_route(
    make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads_seen: list[ScopeKey] = []
    real = sqliteread.read

    def counted(db: sqlite3.Connection, key: ScopeKey, params: SizingParams, policy: Any) -> sqliteread.Read:
        reads_seen.append(key)
        return real(db, key, params, policy)

    monkeypatch.setattr(inline, "read", counted)  # the name the Reader calls
    async with make_client() as client:
        await fill(client)
        app: Any = client.app  # type: ignore[attr-defined]
        answers = app.state.answers
        reads = app.state.sqlite_reads
        queries: list[dict[str, str]] = [
            {},
            {"runs": "3", "buffer": "0", "cpu_percentile": "p95"},
            {"format": "k8s"},
            {"format": "dotenv"},
            {"format": "gitlab", "containers": "main=build"},
        ]
        for j in JOBS:
            for query in queries:
                answers.invalidate(key_of(j))
                app.state.sqlite_reads = reads
                before = len(reads_seen)
                front = await client.get(sizing_path(j), params=query)
                # read by the front: inline, or twice when the inline read ran past its budget on a
                # busy machine and gave way to a thread
                assert reads_seen[before:] in ([key_of(j)], [key_of(j)] * 2)
                after = len(reads_seen)
                answers.invalidate(key_of(j))
                app.state.sqlite_reads = None  # the route's read
                route = await client.get(sizing_path(j), params=query)
                assert len(reads_seen) == after
                assert front.status_code == route.status_code == 200, (front.text, route.text)
                assert front.headers["content-type"] == route.headers["content-type"]
                assert "ci-sizer-degraded" not in front.headers
                assert strip_times(front.content) == strip_times(route.content), (j, query)
        app.state.sqlite_reads = reads
        # a miss is cached as the route caches it: the next GET is a hit, no read
        answers.invalidate(key_of(CLEAN))
        first = await client.get(sizing_path(CLEAN))
        count = len(reads_seen)
        assert (await client.get(sizing_path(CLEAN))).content == first.content
        assert len(reads_seen) == count


async def test_misses_asked_at_once_answer_as_one_by_one(client: httpx.AsyncClient) -> None:
    # every job's miss asked three times at once, interleaved on the loop (each yields once before its
    # read): each answer is the one the same miss gets alone
    await fill(client)
    app: Any = client.app  # type: ignore[attr-defined]
    reads = app.state.sqlite_reads
    assert isinstance(reads, inline.Reader)
    # a budget no read reaches, even on a busy machine: every miss is counted as read inline
    app.state.sqlite_reads = reader = inline.Reader(reads.path, inline_budget=60)
    alone = {}
    for j in JOBS:
        app.state.answers.invalidate(key_of(j))
        alone[j["job"] + j["org"]] = strip_times((await client.get(sizing_path(j))).content)
    for j in JOBS:
        app.state.answers.invalidate(key_of(j))
    before = reader.inline_reads
    at_once = await asyncio.gather(*(client.get(sizing_path(j)) for j in JOBS for _ in range(3)))
    app.state.sqlite_reads = reads
    await reader.close()
    assert reader.inline_reads - before >= len(JOBS)  # misses, not answers from the cache
    assert reader.gave_way == 0
    for r, j in zip(at_once, [j for j in JOBS for _ in range(3)], strict=True):
        assert r.status_code == 200
        assert "ci-sizer-degraded" not in r.headers
        assert strip_times(r.content) == alone[j["job"] + j["org"]], j


async def test_the_answers_follow_the_history_and_overrides(client: httpx.AsyncClient) -> None:
    # what the parity test compares is not the same default everywhere: the pins, the OOM backoff,
    # the policies and a job never seen each show in the front's answer
    await fill(client)
    got = {j["job"] + "@" + j["org"]: (await client.get(sizing_path(j))).json() for j in JOBS}
    pinned = got["pinned@acme"]
    assert pinned["containers"][0]["memory"]["limit"] == "3Gi"
    assert pinned["containers"][0]["cpu"]["request"] == "250m"
    assert pinned["meta"]["override_scope"] == "job"
    assert got["wf-job@acme"]["meta"]["override_scope"] == "workflow"
    assert got["wf-job@acme"]["containers"][0]["cpu"]["request"] == "750m"
    assert got["eff-job@acme"]["meta"]["policy"] == "efficient"
    assert got["growth-job@acme"]["meta"]["policy"] == "growth"
    assert got["beta-job@beta"]["containers"][0]["cpu"]["limit"] == "3"
    assert got["never-seen@beta"]["containers"][0]["cpu"]["limit"] == "3"  # O2 on a job never seen
    assert got["never-seen@acme"]["meta"]["phase"] == "unknown"
    assert got["oom@acme"]["containers"][0]["oom"]["consecutive"] >= 1
    assert got["clean@acme"]["meta"]["phase"] == "confident"
    assert got["clean@acme"]["meta"]["override_scope"] == "global"  # its override expired
    assert got["one-run@acme"]["meta"]["phase"] == "learning"
    assert [c["name"] for c in got["two-containers@acme"]["containers"]] == ["build", "db"]
    assert (
        got["two-containers@acme"]["meta"]["node_ceiling_bytes"] == 8 * GIB * 9 // 10 // MIB * MIB
    )  # the newest run's node (S15)


def database_path(url: str) -> str:
    return make_url(url).database or ""


async def test_a_broken_read_answers_degraded_on_the_front_and_the_route(make_client: Any, db_url: str) -> None:
    # a fault of the raw sqlite3 connection (here a table gone) is a degraded answer, as the route's
    async with make_client() as client:
        for n in range(1, 4):
            assert (await client.post("/api/v1/runs", json=run(n, container(mem=3 * GIB)))).status_code == 201
        good = (await client.get(sizing_path())).json()
        app: Any = client.app  # type: ignore[attr-defined]
        key = key_of(JOB)
        other = sqlite3.connect(database_path(db_url), isolation_level=None)
        try:
            other.execute("ALTER TABLE overrides RENAME TO overrides_away")
            reads = app.state.sqlite_reads
            for front in (reads, None):  # the front, then the route
                app.state.sqlite_reads = front
                app.state.answers.invalidate(key)
                r = await asyncio.wait_for(client.get(sizing_path()), 20)
                assert r.status_code == 200
                assert r.headers["ci-sizer-degraded"] == "true"
                degraded = r.json()
                assert degraded["meta"]["degraded"] is True
                assert degraded["containers"] == good["containers"]  # the last answer served
        finally:
            other.execute("ALTER TABLE overrides_away RENAME TO overrides")
            other.close()
        app.state.sqlite_reads = reads
        again = await client.get(sizing_path(), params={"format": "k8s"})
        assert again.status_code == 200
        assert "ci-sizer-degraded" not in again.headers


#: a statement that keeps a reading thread busy for a second or two
SLOW = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10000000) SELECT count(*) FROM c"


async def three_runs_and_a_reader(client: httpx.AsyncClient, **options: Any) -> tuple[Any, Any, inline.Reader]:
    """Three runs of JOB stored, and the app's reads swapped for a ``Reader`` with ``options`` on the
    same file: (the app, its own reads to put back, the new reader)."""
    for n in range(1, 4):
        assert (await client.post("/api/v1/runs", json=run(n))).status_code == 201
    app: Any = client.app  # type: ignore[attr-defined]
    reads = app.state.sqlite_reads
    assert isinstance(reads, inline.Reader)
    app.state.sqlite_reads = reader = inline.Reader(reads.path, **options)
    return app, reads, reader


def keep_busy(reader: inline.Reader) -> list[asyncio.Future[Any]]:
    """Every reading thread of ``reader`` busy with ``SLOW``."""
    loop = asyncio.get_running_loop()
    return [
        loop.run_in_executor(reader._executor, lambda: reader._db().execute(SLOW).fetchall())
        for _ in range(reader._executor._max_workers)
    ]


async def test_a_miss_is_read_inline_while_the_threads_are_busy(make_client: Any) -> None:
    # every reading thread busy with a slow statement: the miss does not wait for them, it is read on
    # the event loop (no hop to a thread) and answered fresh
    async with make_client(sizing_deadline_ms=3000) as client:
        # a budget no read reaches, even on a busy machine: the read is inline whatever the load
        app, reads, reader = await three_runs_and_a_reader(client, inline_budget=60)
        busy = keep_busy(reader)
        await asyncio.sleep(0.05)
        r = await asyncio.wait_for(client.get(sizing_path()), 20)
        assert not all(b.done() for b in busy)  # answered while the threads were still busy
        await asyncio.gather(*busy)
        app.state.sqlite_reads = reads
        await reader.close()
        assert r.status_code == 200
        assert "ci-sizer-degraded" not in r.headers
        assert r.json()["meta"]["clean_samples"] == 3
        assert reader.inline_reads == 1
        assert reader.gave_way == 0


async def test_a_second_read_past_its_budget_pauses_inline_reads(make_client: Any) -> None:
    # two reads that held the loop past their budget (here a budget of 0) send the misses that follow
    # to the threads for the pause, without trying inline first; each answer is still the right one
    async with make_client() as client:
        app, reads, reader = await three_runs_and_a_reader(client, inline_budget=0, inline_pause=60)
        app.state.sqlite_reads = reads
        good = comparable((await client.get(sizing_path())).json())
        app.state.sqlite_reads = reader
        try:
            for _ in range(4):
                app.state.answers.invalidate(key_of(JOB))
                r = await client.get(sizing_path())
                assert r.status_code == 200
                assert "ci-sizer-degraded" not in r.headers
                assert comparable(r.json()) == good
            # the first two tried inline (interrupted, or finished past the budget); the next two did not try
            assert reader.inline_reads + reader.gave_way == 2
            assert reader.late_reads == 2
        finally:
            app.state.sqlite_reads = reads
            await reader.close()


async def test_one_read_past_its_budget_alone_does_not_pause_inline_reads(make_client: Any) -> None:
    # a late read LATE_AGAIN_WITHIN misses or more after the last one is the machine's (a process
    # descheduled on a busy host), not the database's: the misses after it are still read inline; a
    # second late read within LATE_AGAIN_WITHIN misses pauses them
    async with make_client() as client:
        app, reads, reader = await three_runs_and_a_reader(client, inline_budget=60, inline_pause=60)
        app.state.sqlite_reads = reads
        ask = {"key": key_of(JOB), "params": SizingParams(), "policy": sizing_service.Policy()}
        try:

            def late() -> None:
                reader.inline_budget = 0
                reader.inline(**ask)  # interrupted (None) or finished past the budget
                reader.inline_budget = 60

            late()
            for _ in range(inline.LATE_AGAIN_WITHIN):
                assert reader.inline(**ask) is not None  # read inline, not paused
            late()
            assert reader.late_reads == 2
            assert reader.inline(**ask) is not None  # the second late read came LATE_AGAIN_WITHIN + 1 misses later
            late()
            assert reader.late_reads == 3
            assert reader.inline(**ask) is None  # two misses after the last: paused, to the threads
            reader._inline_paused_until = 0.0  # the pause over
            late()  # the pair that paused is spent: one late read alone again
            assert reader.late_reads == 4
            assert reader.inline(**ask) is not None
        finally:
            await reader.close()


async def test_a_collection_due_in_an_inline_read_runs_after_it(
    make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the budget times the read, not the heap's collector: a collection due while the miss is read
    # (here every allocation makes one due; one inside the read would take 0.3 s) runs after the
    # read, which is neither late nor given way to a thread
    async with make_client() as client:
        app, reads, reader = await three_runs_and_a_reader(client, inline_budget=0.15, inline_pause=60)
        app.state.sqlite_reads = reads
        reading = False
        real = inline.read

        def read(*args: Any) -> sqliteread.Read:
            nonlocal reading
            reading = True
            try:
                return real(*args)
            finally:
                reading = False

        monkeypatch.setattr(inline, "read", read)
        started_in_read: list[bool] = []

        def slow(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                if reading and not any(started_in_read):
                    time.sleep(0.3)
                started_in_read.append(reading)

        ask = {"key": key_of(JOB), "params": SizingParams(), "policy": sizing_service.Policy()}
        threshold = gc.get_threshold()
        gc.callbacks.append(slow)
        gc.set_threshold(1)
        try:
            rec = reader.inline(**ask)
        finally:
            gc.set_threshold(*threshold)
            gc.callbacks.remove(slow)
            await reader.close()
        assert started_in_read  # collections ran ...
        assert not any(started_in_read)  # ... none inside the read
        assert rec is not None
        assert rec.answer.meta.clean_samples == 3
        assert (reader.inline_reads, reader.gave_way, reader.late_reads) == (1, 0, 0)


async def test_the_loop_s_connection_is_opened_at_startup_with_its_statements_compiled(make_client: Any) -> None:
    # as PostgreSQL's pool is opened with its statement planned: the first miss does not open the
    # connection nor compile the statements (a first read took 1.4-2.3 ms compiling, 0.25 ms after)
    async with make_client() as client:
        reads = client.app.state.sqlite_reads  # type: ignore[attr-defined]
        assert isinstance(reads, inline.Reader)
        assert reads._inline_db is not None
        assert reads.inline_reads == 0
        seen: list[str] = []
        db = sqlite3.connect(reads.path, isolation_level=None)
        try:
            db.set_trace_callback(seen.append)
            sqliteread.prepare(db)
        finally:
            db.close()
        # every statement a miss runs (overrides, summary, prior, window, all runs), in one transaction
        assert [s.split(" ", 1)[0] for s in seen] == ["BEGIN", *["SELECT"] * 5, "ROLLBACK"]
        assert len({s for s in seen if s.startswith("SELECT")}) == 5


async def test_a_locked_database_gives_way_to_a_thread_without_holding_the_loop(tmp_path: Any) -> None:
    # a database in rollback-journal mode (not the service's WAL) with a writer holding its lock: the
    # inline read gives way at once (busy_timeout 0: the event loop keeps turning), the thread waits
    # for the lock within busy_timeout and answers once the writer is done
    url = f"sqlite+aiosqlite:///{tmp_path / 'locked.db'}"
    migrations.upgrade(url)
    writer = sqlite3.connect(database_path(url), isolation_level=None)
    assert writer.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    reader = inline.Reader(database_path(url), busy_timeout=5)
    try:
        writer.execute("BEGIN EXCLUSIVE")
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, writer.execute, "COMMIT")
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        beat = asyncio.ensure_future(ticker())
        started = loop.time()
        rec = await reader.recommend(key=key_of(UNSEEN), params=SizingParams(), policy=sizing_service.Policy())
        took = loop.time() - started
        beat.cancel()
        assert rec.job_id is None
        assert rec.answer.meta.phase == "unknown"
        assert took >= 0.25  # it waited for the lock, on the thread
        assert ticks >= 10  # while the loop went on
        assert reader.gave_way == 1
        assert reader.inline_reads == 0
    finally:
        await reader.close()
        writer.close()


async def test_a_slow_read_answers_degraded_at_the_deadline(make_client: Any) -> None:
    # a read that gives way to the threads (its inline budget 0) while every reading thread is busy
    # with a slow statement: the miss waits behind them, and the deadline answers first, degraded; the
    # read left behind does not disturb what follows
    async with make_client(sizing_deadline_ms=300) as client:
        app, reads, reader = await three_runs_and_a_reader(client, inline_budget=0, inline_pause=0)
        loop = asyncio.get_running_loop()
        busy = keep_busy(reader)
        await asyncio.sleep(0.05)
        started = loop.time()
        r = await asyncio.wait_for(client.get(sizing_path(), params={"format": "dotenv"}), 20)
        took = loop.time() - started
        await asyncio.gather(*busy)
        assert r.status_code == 200
        assert r.headers["ci-sizer-degraded"] == "true"
        assert took < 1  # the deadline, not the slow statements
        assert reader.gave_way == 1
        fine = await client.get(sizing_path())
        assert fine.status_code == 200
        assert "ci-sizer-degraded" not in fine.headers
        assert fine.json()["meta"]["clean_samples"] == 3
        app.state.sqlite_reads = reads
        await reader.close()


async def test_an_exhausted_pool_answers_degraded_at_the_deadline(make_client: Any) -> None:
    # the engine's reads (an in-memory database's): every pooled connection held elsewhere, the miss
    # waits for one (up to the 5 s pool timeout), and the deadline answers first, degraded
    async with make_client(sizing_deadline_ms=300) as client:
        for n in range(1, 4):
            assert (await client.post("/api/v1/runs", json=run(n))).status_code == 201
        app: Any = client.app  # type: ignore[attr-defined]
        engine = app.state.engine
        app.state.sqlite_reads = inline.EngineReads(engine)
        pool = engine.pool
        held = [await engine.connect() for _ in range(pool.size() + max(0, pool._max_overflow))]
        try:
            started = asyncio.get_running_loop().time()
            r = await asyncio.wait_for(client.get(sizing_path(), params={"format": "dotenv"}), 20)
            took = asyncio.get_running_loop().time() - started
        finally:
            for conn in held:
                await conn.close()
        assert r.status_code == 200
        assert r.headers["ci-sizer-degraded"] == "true"
        assert took < 3
        fine = await client.get(sizing_path())
        assert fine.status_code == 200
        assert "ci-sizer-degraded" not in fine.headers
        assert fine.json()["meta"]["clean_samples"] == 3


async def test_reads_closed_under_a_request_answer_degraded(client: httpx.AsyncClient) -> None:
    # the app shutting down closes its reads: a miss still in flight is a fault (degraded), never a 500
    assert (await client.post("/api/v1/runs", json=run(1))).status_code == 201
    app: Any = client.app  # type: ignore[attr-defined]
    await app.state.sqlite_reads.close()
    r = await client.get(sizing_path())
    assert r.status_code == 200
    assert r.headers["ci-sizer-degraded"] == "true"


async def test_the_reads_open_a_database_file_and_never_create_one(tmp_path: Any, sqlite_only: str) -> None:
    engine = create_async_engine("sqlite+aiosqlite://")
    try:
        assert isinstance(inline.reads_for("sqlite+aiosqlite://", engine, busy_timeout=1), inline.EngineReads)
        assert isinstance(inline.reads_for(sqlite_only, engine, busy_timeout=1), inline.Reader)
        # an inline read never holds the loop past the sizing deadline, nor past its own budget
        short = inline.reads_for(sqlite_only, engine, busy_timeout=1, deadline=0.002)
        assert isinstance(short, inline.Reader)
        assert short.inline_budget == 0.002
        long = inline.reads_for(sqlite_only, engine, busy_timeout=1, deadline=2)
        assert isinstance(long, inline.Reader)
        assert long.inline_budget == inline.INLINE_BUDGET_SECONDS
        await short.close()
        await long.close()
        missing = tmp_path / "absent.db"
        reader = inline.reads_for(f"sqlite+aiosqlite:///{missing}", engine, busy_timeout=1)
        assert isinstance(reader, inline.Reader)
        with pytest.raises(sqlite3.OperationalError):
            await reader.recommend(key=key_of(JOB), params=SizingParams(), policy=sizing_service.Policy())
        await reader.close()
        assert not missing.exists()
    finally:
        await engine.dispose()
