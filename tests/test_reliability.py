"""Reliability: fail-open sizing, ingest under faults, retention, hardening, and real-process
tests against PostgreSQL (crash with kill -9, database outage, concurrency)."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from service.db import build_engine
from service.errors import loggable
from service.observability.logs import JsonFormatter

from .conftest import _admin
from .helpers import JOB, MIB, container, post_runs, run, sizing, sizing_path
from .live import LiveServer
from .pg import PostgresServer, ThrowawayCluster, find_pg_bin

DEAD_PG = "postgresql+asyncpg://nobody@127.0.0.1:9/nothing"  # nothing listens on port 9


# --------------------------------------------------------------------------- fail-open (in process)


async def test_sizing_fails_open_when_the_database_is_unreachable(make_client: Any) -> None:
    # never a 5xx for a database fault: unknown-phase defaults, marked degraded
    from service.main import create_app
    from service.settings import Settings

    app = create_app(Settings(database_url=DEAD_PG, sizing_deadline_ms=2000))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            r = await client.get(sizing_path())
            assert r.status_code == 200
            body = r.json()
            assert body["meta"]["degraded"] is True
            assert body["meta"]["phase"] == "unknown"
            assert body["containers"][0]["memory"]["limit"] == "4Gi"
            # ingest cannot be acknowledged: 503 with Retry-After, as problem+json
            r = await client.post("/api/v1/runs", json=run(1))
            assert r.status_code == 503
            assert r.headers["Retry-After"].isdigit()
            assert r.headers["content-type"] == "application/problem+json"
            assert (await client.get("/readyz")).status_code == 503
            assert (await client.get("/healthz")).status_code == 200
            metrics = (await client.get("/metrics")).text
            assert "ci_sizer_degraded_answers_total" in metrics


@pytest.fixture
def lock_runs(db_url: str) -> Any:
    """Hold exclusive locks on ``jobs`` and ``runs`` from another connection (PostgreSQL), so reads block."""
    if not db_url.startswith("postgresql"):
        pytest.skip("table locks that block readers are a PostgreSQL feature")
    u = make_url(db_url)
    held: dict[str, Any] = {}

    async def take() -> None:
        conn = await asyncpg.connect(host=u.host, port=u.port, user=u.username, database=u.database)
        tx = conn.transaction()
        await tx.start()
        await conn.execute("LOCK TABLE jobs, runs IN ACCESS EXCLUSIVE MODE")
        held["conn"], held["tx"] = conn, tx

    async def release() -> None:
        await held["tx"].rollback()
        await held["conn"].close()

    return take, release


async def test_slow_database_answers_the_last_recommendation_degraded(make_client: Any, lock_runs: Any) -> None:
    take, release = lock_runs
    async with make_client(sizing_deadline_ms=250) as client:
        await post_runs(client, run(1, container(cpu=300, mem=100 * MIB)))
        fresh = await sizing(client)
        assert fresh["meta"]["degraded"] is False
        await take()
        try:
            # a fresh cached answer does not need the database at all
            started = time.monotonic()
            cached = await client.get(sizing_path())
            cached_elapsed = time.monotonic() - started
            # other parameters are not cached: the database is read, and is too slow
            started = time.monotonic()
            r = await client.get(sizing_path(), params={"runs": 3})
            elapsed = time.monotonic() - started
            other = await client.get(sizing_path({**JOB, "job": "never-served"}))
        finally:
            await release()
        assert cached.status_code == 200
        assert cached.json() == fresh
        assert cached_elapsed < 0.25
        assert r.status_code == 200
        slow = r.json()
        assert slow["meta"]["degraded"] is True
        assert slow["containers"] == fresh["containers"]  # the last answer served for that job
        assert elapsed < 5  # answered at the deadline, not when the lock went away
        assert other.json()["meta"]["degraded"] is True
        assert other.json()["containers"][0]["name"] == "*"  # nothing cached: the defaults
        # and once the database answers again, so does the service, without a restart
        assert (await sizing(client, runs=3))["meta"]["degraded"] is False


# --------------------------------------------------------------------------- retention


async def count_rows(url: str, table: str) -> int:
    engine = build_engine(url)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one())
    finally:
        await engine.dispose()


async def test_retention_keeps_the_newest_runs(make_client: Any, db_url: str) -> None:
    async with make_client(retention_runs=5, retention_interval_seconds=0.05) as client:
        order = [7, 1, 12, 3, 9, 5, 11, 2, 8, 10, 4, 6]  # posted out of finished_at order
        await post_runs(client, *(run(n, container(mem=n * MIB), container("side")) for n in order))
        deadline = time.monotonic() + 20
        while await count_rows(db_url, "runs") > 5:
            assert time.monotonic() < deadline, "retention did not prune"
            await asyncio.sleep(0.05)
        answer = await sizing(client, runs=100)
        assert answer["meta"]["clean_samples"] == 5
        assert answer["containers"][0]["observed"]["memory_bytes"] == 12 * MIB
        assert await count_rows(db_url, "run_containers") == 10  # containers went with their runs
        # ingest still works and the bound holds
        await post_runs(client, run(13))
        deadline = time.monotonic() + 20
        while await count_rows(db_url, "runs") > 5:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)


async def wait_for_rows(url: str, table: str, expected: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while (count := await count_rows(url, table)) != expected:
        assert time.monotonic() < deadline, f"{table}: {count} rows, expected {expected}"
        await asyncio.sleep(0.1)


async def _sql(url: str, sql: str, **params: Any) -> list[Any]:
    engine = build_engine(url)
    try:
        async with engine.begin() as conn:
            result = await conn.execute(text(sql), params)
            return list(result.all()) if result.returns_rows else []
    finally:
        await engine.dispose()


BULK = 40_002  # runs of one job to delete: more than asyncpg's 32,767 parameters in one statement


@pytest.mark.ci  # the CI tier (README): 40,002 runs pruned
async def test_retention_deletes_more_runs_than_one_statement_can_name(make_client: Any, db_url: str) -> None:
    # issue 18, item 6: one IN (...) of 40,000 ids failed on PostgreSQL every pass, and nothing went
    async with make_client(retention_runs=5, retention_interval_seconds=0.05) as client:
        await post_runs(client, run(1))
        [(job_id,)] = await _sql(db_url, "SELECT id FROM jobs")
        # the start-up pass (which looks for jobs over the limit) and the pass for run-1 go first:
        # either could otherwise meet the bulk rows below and prune before they are counted
        pruner = client.app.state.pruner  # type: ignore[attr-defined]
        for _ in range(200):
            if pruner.recovered and not pruner.pending:
                break
            await asyncio.sleep(0.05)
        assert pruner.recovered
        assert not pruner.pending
        await asyncio.sleep(0.2)  # a pass that took run-1's note has finished
        if db_url.startswith("postgresql"):
            await _sql(
                db_url,
                "INSERT INTO runs (job_id, run_id, finished_at, ingested_at, clean, content_hash) "
                "SELECT :job, 'bulk-' || n, timestamp '2026-01-01' + n * interval '1 second', now(), true, 'x' "
                "FROM generate_series(1, :bulk) AS n",
                job=job_id,
                bulk=BULK,
            )
        else:
            await _sql(
                db_url,
                "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < :bulk) "
                "INSERT INTO runs (job_id, run_id, finished_at, ingested_at, clean, content_hash) "
                "SELECT :job, 'bulk-' || n, printf('2026-01-01 %02d:%02d:%02d.000000', n / 3600, n / 60 % 60, n % 60), "
                "'2026-01-01 00:00:00.000000', 1, 'x' FROM s",
                job=job_id,
                bulk=BULK,
            )
        assert await count_rows(db_url, "runs") == BULK + 1
        # runs written by hand bypass the job's build-path state (PostgreSQL): marked as the docs say
        # (docs/performance.md), its runs are counted again before pruning and the row is rebuilt
        await _sql(db_url, "UPDATE job_state SET clean_runs = NULL")
        await post_runs(client, run(2))  # ingest notes the job for pruning
        # up to 180 s: in two CI runs of the whole suite (stop 42, stop 43), with other xdist workers' tests
        # on the same PostgreSQL cluster, a prune attempt waited out its whole 30 s statement timeout
        # (one "retention pass failed for a job: TimeoutError" per 30 s) and the next one was still waiting at
        # 60 s; alone it prunes in about 2 s. The cause is not found (the closing note of stop 43): the test
        # still asserts that every run over the limit goes, and that the next pass after a failure prunes
        await wait_for_rows(db_url, "runs", 5, seconds=180)
        kept = sorted(r[0] for r in await _sql(db_url, "SELECT run_id FROM runs"))
        # the newest five: the two posted runs (finished in November) and the last three bulk runs
        assert kept == sorted(["run-1", "run-2", *(f"bulk-{n}" for n in range(BULK - 2, BULK + 1))])
        assert (await sizing(client, runs=100))["meta"]["clean_samples"] == 5


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # the change feed is PostgreSQL's LISTEN/NOTIFY
async def test_a_pruned_job_is_announced_after_the_commit_not_in_its_transaction(make_client: Any, db_url: str) -> None:
    # issue 38: a pg_notify in the pruning transaction took the cluster's one notification lock at its
    # commit, behind (and ahead of) every other notifying commit on the cluster; the worker's Notifier
    # announces the pruned job after the commit instead, as it does the build path's runs ("jobs", never
    # the in-transaction "changed")
    heard: list[str] = []
    listener = await asyncpg.connect(make_url(db_url).set(drivername="postgresql").render_as_string(False))
    await listener.add_listener("ci_sizer_changes", lambda *args: heard.append(args[3]))
    try:
        # the app's own passes (the wiring of service/main.py)
        async with make_client(retention_runs=2, retention_interval_seconds=0.05) as client:
            await post_runs(client, *(run(n) for n in range(1, 5)))
            await wait_for_rows(db_url, "runs", 2, seconds=30)
        assert heard
        assert all("changed" not in orjson.loads(p) for p in heard)
        # one pass: the pruned job is announced, in a notification of its own
        async with make_client(retention_runs=2, retention_interval_seconds=3600) as client:
            app = client.app  # type: ignore[attr-defined]
            await post_runs(client, *(run(n) for n in range(5, 7)))
            posted = len(heard)
            before = app.state.notifier.batches
            removed = await app.state.pruner.run_once(
                app.state.write_sessionmaker, app.state.answers, notifier=app.state.notifier
            )
            assert removed == 2
            assert await count_rows(db_url, "runs") == 2
            deadline = time.monotonic() + 10
            while len(heard) == posted:
                assert time.monotonic() < deadline, "the pruned job was not announced"
                await asyncio.sleep(0.02)
            assert app.state.notifier.batches > before
            pruned = [orjson.loads(p) for p in heard[posted:]]
            key = [JOB["org"], JOB["repo"], JOB["workflow"], JOB["job"]]
            assert any(key in message["jobs"] for message in pruned)
            assert all("changed" not in orjson.loads(p) for p in heard)
    finally:
        await listener.close()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # PostgreSQL's statement timeout, pg_stat_activity
async def test_a_retention_pass_that_times_out_logs_what_the_database_waited_on(
    make_client: Any, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # the 40,002-run test above saw a pass wait out its statement timeout in whole-suite runs, and the
    # log said only "TimeoutError": now it says what the sessions were doing (a lock holder here)
    async with make_client(
        retention_runs=1, retention_interval_seconds=3600, database_statement_timeout_seconds=1
    ) as client:
        app = client.app  # type: ignore[attr-defined]
        await post_runs(client, *(run(n) for n in range(1, 4)))
        holder = await asyncpg.connect(make_url(db_url).set(drivername="postgresql").render_as_string(False))
        try:
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT id FROM runs WHERE run_id <> 'run-0' FOR UPDATE")
            with caplog.at_level(logging.WARNING, logger="ci_sizer.retention"):
                removed = await app.state.pruner.run_once(app.state.write_sessionmaker, app.state.answers)
            assert removed == 0
            [sampled] = [r.getMessage() for r in caplog.records if "timed out" in r.getMessage()]
            assert "idle in transaction" in sampled
            assert "FOR UPDATE" in sampled  # the holder's statement (this database's: its text is shown)
            assert "'run-0'" not in sampled  # literals are not logged
            await tx.rollback()
        finally:
            await holder.close()
        # the job stayed noted: the next pass prunes it
        removed = await app.state.pruner.run_once(app.state.write_sessionmaker, app.state.answers)
        assert removed == 2


async def test_pruning_resumes_after_a_restart(make_client: Any, db_url: str) -> None:
    # issue 18, item 8: the jobs waiting for pruning lived only in the memory of the process; one
    # that stopped before its pass (a crash, a deploy) left them over the limit for good
    async with make_client(retention_runs=1000, retention_interval_seconds=3600) as client:
        await post_runs(client, *(run(n) for n in range(1, 9)))
        await post_runs(client, *(run(n, job={**JOB, "job": "other"}) for n in range(1, 3)))
    assert await count_rows(db_url, "runs") == 10
    async with make_client(retention_runs=3, retention_interval_seconds=0.05) as client:
        # no new run is posted: the new process finds the job over the limit by itself
        await wait_for_rows(db_url, "runs", 5)
        assert (await sizing(client, runs=100))["meta"]["clean_samples"] == 3
        other = await sizing(client, {**JOB, "job": "other"}, runs=100)
        assert other["meta"]["clean_samples"] == 2


# --------------------------------------------------------------------------- hardening


@pytest.mark.parametrize("depth", [100, 100_000])
async def test_deep_nesting_is_a_clean_4xx(client: httpx.AsyncClient, depth: int) -> None:
    raw = '{"org":' + "[" * depth + "]" * depth + "}"
    r = await client.post("/api/v1/runs", content=raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500
    assert r.headers["content-type"] == "application/problem+json"


async def test_overlong_and_unknown_query_values(client: httpx.AsyncClient) -> None:
    r = await client.get(sizing_path() + "?runs=" + "9" * 5000)
    assert r.status_code == 422
    r = await client.get("/api/v1/sizing/" + "%2F".join(["a"] * 300) + "/r/w/j")
    assert r.status_code == 422  # a segment over 200 characters once decoded


# --------------------------------------------------------------------------- client input is never a database fault


def _cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(value)).decode().rstrip("=")


#: issue 33, minor 2: inputs that used to reach the database, answered 503 there (PostgreSQL, counted
#: as database errors) or 500 (SQLite), with the field each must be refused by
CLIENT_INPUTS = {
    "/api/v1/simulations/%00": "path/analysis_id",
    "/api/v1/backtests/%FF": "path/analysis_id",
    "/api/v1/backtests/%ED%A0%80": "path/analysis_id",  # a UTF-8-encoded surrogate
    "/api/v1/sizing/overrides?org=a%00b": "query/org",
    "/api/v1/jobs?sort=last_run&cursor=" + _cursor(["last_run", "2026-01-01T00:00:00+05:00", 1]): "query/cursor",
    "/api/v1/jobs?sort=name&cursor=" + _cursor(["name", ["a\x00", "b", "c", "d"], 1]): "query/cursor",
    "/api/v1/jobs?org=ac%00me": "query/org",
    "/api/v1/sizing/acme/web/ci/b%00uild": "path/job",
}


def _database_errors(metrics: str) -> float:
    return sum(
        float(line.split()[1]) for line in metrics.splitlines() if line.startswith("ci_sizer_database_errors_total ")
    )


async def test_client_input_is_never_a_database_fault(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    before = _database_errors((await client.get("/metrics")).text)
    with caplog.at_level(logging.INFO):
        for path, field in CLIENT_INPUTS.items():
            r = await client.get(path)
            assert r.status_code == 422, (path, r.status_code, r.text)
            assert r.headers["content-type"] == "application/problem+json"
            assert [e["field"] for e in r.json()["errors"]] == [field], path
    assert _database_errors((await client.get("/metrics")).text) == before
    formatter = JsonFormatter()
    for record in caplog.records:
        assert "database error" not in record.getMessage()
        json.loads(formatter.format(record))  # every line it wrote is a JSON line (no lone surrogate)


def test_a_database_warning_with_a_surrogate_in_its_path_is_a_json_line() -> None:
    # a path that reaches a real database fault may hold undecodable bytes: the warning still logs
    record = logging.LogRecord("ci_sizer.errors", logging.WARNING, "", 0, "database error on %s: %s", ("", ""), None)
    record.args = (loggable("/api/v1/backtests/\udcff"), "OSError")
    assert (
        json.loads(JsonFormatter().format(record))["message"] == "database error on /api/v1/backtests/\\udcff: OSError"
    )


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/jsonx", 415),
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        ("application/json", 201),
        ("application/json; charset=utf-8", 201),
        ("Application/JSON", 201),
        ("application/vnd.ci-sizer+json", 201),
        (None, 415),  # a body without a media type
    ],
)
async def test_a_body_that_is_not_json_is_415_on_both_databases(
    client: httpx.AsyncClient, content_type: str | None, status: int
) -> None:
    # issue 33, minor 5: application/jsonx was stored (201) on PostgreSQL and 422 on SQLite; a body
    # with any media type but JSON's, or none, is 415 on both
    headers = {} if content_type is None else {"content-type": content_type}
    r = await client.post("/api/v1/runs", content=orjson.dumps(run(1)), headers=headers)
    assert r.status_code == status, r.text
    if status == 415:
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["errors"] == [{"field": "header/content-type", "message": "must be application/json"}]
        assert (await client.get("/api/v1/jobs")).json()["items"] == []
        r = await client.put("/api/v1/sizing/overrides/acme", content=b'{"cpu_limit": "1"}', headers=headers)
        assert r.status_code == 415


#: issue 33, minor 5: invisible characters, with which "build" and a look-alike were two jobs
INVISIBLE = {
    "zero-width-joiner": "bu\u200dild",
    "zero-width-space": "bu\u200bild",
    "bom": "\ufeffbuild",
    "line-separator": "bu\u2028ild",
    "paragraph-separator": "bu\u2029ild",
    "tag": "build\U000e0041",
    "soft-hyphen": "bu\u00adild",
}


@pytest.mark.parametrize("name", list(INVISIBLE.values()), ids=list(INVISIBLE))
async def test_invisible_characters_in_names_are_422(client: httpx.AsyncClient, name: str) -> None:
    for body, field in (
        ({**run(1), "job": name}, "body/job"),
        (run(1, container(name)), "body/containers/0/name"),
    ):
        r = await client.post("/api/v1/runs", json=body)
        assert r.status_code == 422, r.text
        assert [e["field"] for e in r.json()["errors"]] == [field]
    r = await client.get(sizing_path({**JOB, "job": name}))
    assert r.status_code == 422
    assert [e["field"] for e in r.json()["errors"]] == ["path/job"]
    assert (await client.get("/api/v1/jobs")).json()["items"] == []


async def test_dotenv_gives_each_container_its_own_variables(client: httpx.AsyncClient) -> None:
    # issue 33, minor 5: "a-b" and "a_b" both became CI_SIZER_A_B_*, and one took the other's sizes
    await post_runs(client, run(1, container("a-b", mem=100 * MIB), container("a_b", mem=900 * MIB), container("db")))
    text_ = (await client.get(sizing_path(), params={"format": "dotenv"})).text
    variables = dict(line.split("=", 1) for line in text_.splitlines())
    assert len(variables) == 12  # three containers, four variables each: no name given twice
    limits = {k.removesuffix("_MEMORY_LIMIT"): v for k, v in variables.items() if k.endswith("_MEMORY_LIMIT")}
    answer = await sizing(client)
    by_name = {c["name"]: c["memory"]["limit"] for c in answer["containers"]}
    for name in ("a-b", "a_b"):
        suffix = hashlib.sha256(name.encode()).hexdigest()[:8].upper()
        assert limits[f"CI_SIZER_A_B_{suffix}"] == by_name[name]
    assert limits["CI_SIZER_DB"] == by_name["db"]
    assert by_name["a-b"] != by_name["a_b"]


async def test_retention_prunes_runs_written_outside_the_service(
    make_client: Any, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # issue 33, minor 5: on PostgreSQL the job's build-path state, which counts the runs the service
    # stored, said the job was under the limit: never pruned, and nothing said
    async with make_client(retention_runs=5, retention_interval_seconds=3600) as client:
        await post_runs(client, *(run(n) for n in range(1, 4)))
    [(job_id,)] = await _sql(db_url, "SELECT id FROM jobs")
    await _insert_runs(db_url, job_id, "outside", 10)
    with caplog.at_level(logging.INFO, logger="ci_sizer.retention"):
        async with make_client(retention_runs=5, retention_interval_seconds=3600) as client:
            app = client.app  # type: ignore[attr-defined]
            pruner = app.state.pruner
            await pruner.recover(app.state.write_sessionmaker)
            assert "ci_sizer_retention_backlog_jobs 1.0" in (await client.get("/metrics")).text
            await pruner.run_once(app.state.write_sessionmaker, app.state.answers)
            assert await count_rows(db_url, "runs") == 5
            assert "ci_sizer_retention_backlog_jobs 0.0" in (await client.get("/metrics")).text
            assert (await sizing(client, runs=100))["meta"]["clean_samples"] == 5
            # written outside while the service runs: found by the next count of every job's runs
            await _insert_runs(db_url, job_id, "later", 4)
            pruner.rescan_seconds = 0
            await pruner.run_once(app.state.write_sessionmaker, app.state.answers)
            assert await count_rows(db_url, "runs") == 5
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if db_url.startswith("postgresql"):
        assert any("more runs than their build-path state counts" in m for m in said), said
    assert any("that no ingest noted" in m for m in said), said


async def _insert_runs(url: str, job_id: int, prefix: str, count: int) -> None:
    """Runs of one job written straight into the database, as a restore or a script would."""
    for n in range(count):
        at = datetime(2026, 10, 1) + timedelta(minutes=n)
        await _sql(
            url,
            "INSERT INTO runs (job_id, run_id, finished_at, ingested_at, clean, content_hash) "
            "VALUES (:job, :run_id, :at, :at, :clean, 'x')",
            job=job_id,
            run_id=f"{prefix}-{n}",
            at=at if url.startswith("postgresql") else at.strftime("%Y-%m-%d %H:%M:%S.%f"),
            clean=True,
        )


# --------------------------------------------------------------------------- PostgreSQL JIT


def _jit_in(plan: Any) -> bool:
    """Whether an ``EXPLAIN (ANALYZE, FORMAT JSON)`` result (text or parsed) shows JIT compilation."""
    parsed = orjson.loads(plan) if isinstance(plan, str | bytes) else plan
    return "JIT" in parsed[0]


async def test_postgresql_never_jit_compiles_the_service_statements(make_client: Any, db_url: str) -> None:
    # issue 33, minor 4: with generic plans on tables never analyzed, the route's rebuild of a job's
    # build-path state was JIT-compiled at every execution (250-440 ms a run). Compiling is forced here
    # (jit_above_cost 0, this connection only) to show that the service's sessions never compile.
    if not db_url.startswith("postgresql"):
        pytest.skip("JIT is PostgreSQL's")
    from service.sizing.state import _REBUILD

    async with make_client() as client:
        await post_runs(client, run(1))
        app = client.app  # type: ignore[attr-defined]
        explain = text("EXPLAIN (ANALYZE, FORMAT JSON) " + str(_REBUILD))
        async with app.state.engine.connect() as conn:
            assert (await conn.execute(text("SHOW jit"))).scalar_one() == "off"
            await conn.execute(text("SET jit_above_cost = 0"))
            plan = (await conn.execute(explain, {"ids": [1]})).scalar_one()
            assert not _jit_in(plan)
            await conn.rollback()
        async with app.state.pgpool.acquire() as raw:  # the build path's own connections
            assert await raw.fetchval("SHOW jit") == "off"
        # the same statement on a connection with the server's defaults is compiled: the check can fail
        u = make_url(db_url)
        plain = await asyncpg.connect(host=u.host, port=u.port, user=u.username, database=u.database)
        try:
            await plain.execute("SET jit_above_cost = 0")
            if await plain.fetchval("SHOW jit") == "on":
                sql = str(_REBUILD).replace(":ids", "$1")
                assert _jit_in(await plain.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, [1]))
        finally:
            await plain.close()


# --------------------------------------------------------------------------- real processes, PostgreSQL


@pytest.fixture
def pg_database(postgres_server: PostgresServer) -> Iterator[str]:
    name = f"ci_sizer_live_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(postgres_server.url, f'CREATE DATABASE "{name}"'))
    yield make_url(postgres_server.url).set(database=name).render_as_string(hide_password=False)
    asyncio.run(_admin(postgres_server.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _stored_run_ids(url: str) -> list[str]:
    async def go() -> list[str]:
        engine = build_engine(url)
        try:
            async with engine.connect() as conn:
                return [r[0] for r in (await conn.execute(text("SELECT run_id FROM runs"))).all()]
        finally:
            await engine.dispose()

    return asyncio.run(go())


def test_crash_loses_nothing_acknowledged(pg_database: str, tmp_path: Path) -> None:
    server = LiveServer(pg_database, log=tmp_path / "serve.log").start()
    acknowledged: list[str] = []
    stop = threading.Event()

    def ingest_loop() -> None:
        with httpx.Client(base_url=server.url, timeout=5) as c:
            n = 0
            while not stop.is_set() and n < 5000:
                n += 1
                body = run(n)
                try:
                    r = c.post("/api/v1/runs", json=body)
                except httpx.HTTPError:
                    continue  # the server died mid-request: not acknowledged
                if r.status_code == 201:
                    acknowledged.append(body["run_id"])

    worker = threading.Thread(target=ingest_loop)
    worker.start()
    try:
        while len(acknowledged) < 40:
            time.sleep(0.01)
        server.kill()  # kill -9 mid-stream
        time.sleep(0.3)
    finally:
        stop.set()
        worker.join(timeout=30)
    with LiveServer(pg_database, log=tmp_path / "serve.log") as again:
        stored = _stored_run_ids(pg_database)
        assert set(acknowledged) <= set(stored), set(acknowledged) - set(stored)
        assert len(stored) == len(set(stored))  # nothing doubled
        # re-posting every acknowledged run is a 200 duplicate, not a second copy
        with httpx.Client(base_url=again.url, timeout=10) as c:
            for run_id in acknowledged[-5:]:
                n = int(run_id.removeprefix("run-"))
                assert c.post("/api/v1/runs", json=run(n)).status_code == 200
        assert len(_stored_run_ids(pg_database)) == len(stored)


def test_database_outage_fails_open_and_recovers(tmp_path: Path) -> None:
    if not (find_pg_bin("initdb") and find_pg_bin("pg_ctl")):
        pytest.skip("needs initdb/pg_ctl to stop and start its own PostgreSQL")
    cluster = ThrowawayCluster().start()
    try:
        with (
            LiveServer(cluster.url, "--log-level", "warning", log=tmp_path / "serve.log") as server,
            httpx.Client(base_url=server.url, timeout=10) as c,
        ):
            for n in (1, 2, 3):
                assert c.post("/api/v1/runs", json=run(n, container(cpu=400, mem=700 * MIB))).status_code == 201
            before = c.get(sizing_path()).json()
            assert before["meta"]["degraded"] is False
            cluster.pg_stop()  # the database goes away during traffic
            for _ in range(10):
                started = time.monotonic()
                r = c.get(sizing_path())
                assert time.monotonic() - started < 3  # the build start path does not wait
                assert r.status_code == 200
                assert r.json()["meta"]["degraded"] is True
                assert r.json()["containers"] == before["containers"]
            r = c.post("/api/v1/runs", json=run(4))
            assert r.status_code == 503
            assert "Retry-After" in r.headers
            cluster.pg_start()  # it comes back; no restart of the service
            deadline = time.monotonic() + 30
            while True:
                r = c.post("/api/v1/runs", json=run(4))
                if r.status_code == 201:
                    break
                assert r.status_code == 503, r.text
                assert time.monotonic() < deadline, "ingest did not recover"
                time.sleep(0.2)
            after = c.get(sizing_path()).json()
            assert after["meta"]["degraded"] is False
            assert after["meta"]["clean_samples"] == 4
    finally:
        cluster.stop()


def test_live_concurrency_one_run_and_one_override(pg_database: str, tmp_path: Path) -> None:
    with LiveServer(pg_database, log=tmp_path / "serve.log") as server:

        def post(_: int) -> int:
            return httpx.post(f"{server.url}/api/v1/runs", json=run(1), timeout=30).status_code

        def put(n: int) -> int:
            url = f"{server.url}/api/v1/sizing/overrides/acme/web"
            return httpx.put(url, json={"cpu_limit": f"{n + 1}"}, timeout=30).status_code

        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            runs = sorted(pool.map(post, range(32)))
            puts = sorted(pool.map(put, range(32)))
        assert runs.count(201) == 1, runs
        assert runs.count(200) == 31, runs
        assert puts.count(201) == 1, puts
        assert puts.count(200) == 31, puts
        assert _stored_run_ids(pg_database) == ["run-1"]
        listed = httpx.get(f"{server.url}/api/v1/sizing/overrides").json()["items"]
        assert len(listed) == 1
