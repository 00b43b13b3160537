"""Fixtures: databases (SQLite and PostgreSQL, both migrated with Alembic), the app and its client.

Every DB-touching test runs on both databases through the ``db_url`` fixture. Each test gets
empty tables: rows are deleted after it, rather than rolled back, because the app commits its
own unit of work and several tests need real concurrent transactions.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.engine import make_url

from service import migrations
from service.main import create_app
from service.settings import Settings

from .pg import PostgresServer, acquire

TABLES = ("fleet_priors", "job_state", "run_containers", "runs", "jobs", "overrides")
REQUIRE_POSTGRES = os.environ.get("CI_SIZER_REQUIRE_POSTGRES", "") not in ("", "0")
#: set by the controlling process for its xdist workers: the one server they share, or why there is none
SHARED_URL = "CI_SIZER_TEST_SHARED_POSTGRES_URL"
SHARED_FAILURE = "CI_SIZER_TEST_SHARED_POSTGRES_FAILURE"


#: tools whose absence fails a test instead of skipping it (.ci/run lists what CI installs)
REQUIRED_TOOLS = frozenset(t for t in os.environ.get("CI_SIZER_REQUIRE_TOOLS", "").split(",") if t)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that skips because "<tool> is not installed" fails instead when CI_SIZER_REQUIRE_TOOLS names
    that tool: in CI a missing runner tool (go, jq, kubectl) must not pass unnoticed as a skip."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if REQUIRED_TOOLS and report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        tool, _, rest = reason.partition(" ")
        if tool in REQUIRED_TOOLS and rest.startswith("is not installed"):
            report.outcome = "failed"
            report.longrepr = f"{reason}\n(required: CI_SIZER_REQUIRE_TOOLS={','.join(sorted(REQUIRED_TOOLS))})"


def pytest_configure(config: pytest.Config) -> None:
    """With xdist, the controlling process finds or starts PostgreSQL once, before the workers start,
    and hands them its URL (each worker then makes its own databases on it): one throwaway cluster per
    run, not one per worker.

    Bytecode is written, even where ``PYTHONDONTWRITEBYTECODE`` is set (as it is on this machine):
    a run starts hundreds of Python processes on the same sources (xdist workers, live servers, the CLI),
    and each compiled the service and pytest rewrote every test module again: 19 s of CPU to collect the
    suite without the bytecode, 11 s with it, in each worker (issue 36). The workers and every process the
    tests start inherit this process's environment."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    if not _xdist_controller(config):
        return
    try:
        server: PostgresServer | None = acquire()
    except RuntimeError as exc:
        server = None
        os.environ[SHARED_FAILURE] = str(exc)
    else:
        os.environ[SHARED_URL] = server.url
    config.stash[_SHARED_SERVER] = server


def pytest_unconfigure(config: pytest.Config) -> None:
    server = config.stash.get(_SHARED_SERVER, None)
    if server is not None:
        server.close()


_SHARED_SERVER = pytest.StashKey[PostgresServer | None]()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (``addopts``): two workers per core the process may run on. A worker waits about half
    its time (on the database, on servers and commands it started, on deadlines the tests wait out):
    on 2 busy cores the README's command took 4:48 with 4 workers, 7:30 with 2 and 4:55 with 6, run one
    after the other (issue 36)."""
    return 2 * len(os.sched_getaffinity(0))


#: test modules whose every test is in the CI tier (a module-level ``pytestmark = pytest.mark.ci``) and whose
#: collection alone costs seconds: schemathesis builds its cases as it collects (8 s, in every xdist worker)
CI_ONLY_MODULES = frozenset({"test_schemathesis.py"})


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Not collected at all when ``-m`` leaves the CI tier out (the README's command, ``addopts``), rather
    than collected, built, then deselected (issue 36)."""
    if collection_path.name not in CI_ONLY_MODULES or not config.option.markexpr:
        return None
    try:  # pytest's own parser of -m (private: if it moves, the module is collected and deselected as before)
        from _pytest.mark.expression import Expression

        selects_ci = Expression.compile(config.option.markexpr).evaluate(lambda name, **_: name == "ci")
    except Exception:
        return None
    return True if not selects_ci else None


#: the call time of each test that took 2 s or more (tests/tools/durations.py writes it from a timed run)
DURATIONS = Path(__file__).resolve().parent / "durations.json"


@pytest.hookimpl(trylast=True)  # after ``-m`` and ``-k`` have deselected what does not run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long tests first, spread over the xdist workers (issue 36). ``--dist worksteal`` first hands each
    of the N workers a run of consecutive tests (N runs of about equal length, in collection order), and
    a worker that runs dry later takes half of the longest queue left. A long test that comes last in a
    worker's run (as the live replays and the plain install did in file order) starts when the others
    are nearly done, and they wait for it. Here each worker's run starts with its share of the modules
    that hold long tests (``long_first``). Every worker reorders alike (xdist checks that they collected
    the same list)."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 0))
    if workers < 2 or not DURATIONS.exists():
        return
    order = long_first([it.nodeid for it in items], json.loads(DURATIONS.read_text()), workers)
    items[:] = [items[i] for i in order]


def long_first(nodeids: list[str], known: dict[str, float], workers: int) -> list[int]:
    """The order (indexes into ``nodeids``) in which ``workers`` worksteal workers start on the long
    tests (``known``: seconds) at once. A module holding long tests moves whole, in its own order (its
    module-scoped fixtures, a browser or five live servers, are then set up once, not once per worker
    it is spread over): each worker's first run opens with its share of such modules, the longest going
    to the run with the least so far. The other tests keep their order after them."""
    modules: dict[str, list[int]] = {}
    for i, n in enumerate(nodeids):
        modules.setdefault(n.split("::", 1)[0], []).append(i)
    weight = {m: sum(known.get(nodeids[i], 0.0) for i in idx) for m, idx in modules.items()}
    units = sorted((m for m in modules if weight[m] > 0), key=lambda m: -weight[m])
    sizes: list[int] = []  # what worksteal sends each worker first (its ``check_schedule``)
    left = len(nodeids)
    for w in range(workers):
        sizes.append(left // (workers - w))
        left -= sizes[-1]
    heads: list[list[int]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for m in units:
        # the run with the least so far among those the module fits in whole (else it stays in its place:
        # a module cut at the end of a run is set up by two workers)
        fits = [w for w in range(workers) if len(heads[w]) + len(modules[m]) <= sizes[w]]
        if fits:
            w = min(fits, key=lambda w: load[w])
            heads[w] += modules[m]
            load[w] += weight[m]
    moved = {i for head in heads for i in head}
    rest = [i for i in range(len(nodeids)) if i not in moved]
    order: list[int] = []
    for w in range(workers):
        take = sizes[w] - len(heads[w])
        order += heads[w] + rest[:take]
        del rest[:take]
    return order + rest


def _xdist_controller(config: pytest.Config) -> bool:
    """True in the process that starts xdist workers (``-n N`` with N > 0), not in a worker."""
    if hasattr(config, "workerinput"):
        return False
    numprocesses = getattr(config.option, "numprocesses", None)
    return bool(numprocesses) and getattr(config.option, "dist", "no") != "no"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    shared, failure = os.environ.get(SHARED_URL), os.environ.get(SHARED_FAILURE)
    if shared:  # an xdist worker: the controller's server, closed by the controller
        yield PostgresServer(url=shared, origin="shared by the xdist controller")
        return
    try:
        if failure is not None:
            raise RuntimeError(failure)
        server = acquire()
    except RuntimeError as exc:
        if REQUIRE_POSTGRES:
            pytest.fail(f"PostgreSQL is required (CI_SIZER_REQUIRE_POSTGRES=1) but none could be had: {exc}")
        pytest.skip(f"no PostgreSQL: {exc}")
    yield server
    server.close()


async def _admin(url: str, sql: str, *, database: str | None = None) -> None:
    u = make_url(url)
    conn = await asyncpg.connect(
        host=u.host,
        port=u.port or 5432,
        user=u.username,
        password=u.password,
        database=database or u.database or "postgres",
    )
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def postgresql_database(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database on the server, migrated to head, dropped at the end."""
    name = f"ci_sizer_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres_server.url, f'CREATE DATABASE "{name}"'))
    url = make_url(postgres_server.url).set(database=name).render_as_string(hide_password=False)
    migrations.upgrade(url)
    yield url
    asyncio.run(_admin(postgres_server.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def sqlite_database(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("sqlite") / "ci-sizer-test.db"
    url = f"sqlite+aiosqlite:///{path}"
    migrations.upgrade(url)
    return url


def _clean_sync(url: str) -> None:
    """Empty the tables after a test: one plain connection, no engine (this runs after every test)."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        conn = sqlite3.connect(u.database or "", timeout=30)
        try:
            conn.execute("PRAGMA foreign_keys=ON")  # as the app's connections: deleting a job deletes its summary
            with conn:
                for table in TABLES:
                    conn.execute(f"DELETE FROM {table}")
        finally:
            conn.close()
        return
    asyncio.run(_admin(url, "; ".join(f"DELETE FROM {table}" for table in TABLES), database=u.database))


async def _clean(url: str) -> None:
    await asyncio.to_thread(_clean_sync, url)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated database URL; the test runs once on SQLite and once on PostgreSQL."""
    url: str = request.getfixturevalue(f"{request.param}_database")
    yield url
    _clean_sync(url)


@pytest.fixture
def postgresql_only(postgresql_database: str) -> Iterator[str]:
    """For a module whose tests run on PostgreSQL only: its ``db_url`` fixture returns this one."""
    yield postgresql_database
    _clean_sync(postgresql_database)


@pytest.fixture
def sqlite_only(sqlite_database: str) -> Iterator[str]:
    """For a module whose tests run on SQLite only: its ``db_url`` fixture returns this one."""
    yield sqlite_database
    _clean_sync(sqlite_database)


@pytest.fixture
async def pg(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain asyncpg connection to this test's PostgreSQL database, to look at what the app stored."""
    u = make_url(db_url)
    conn = await asyncpg.connect(host=u.host, port=u.port, user=u.username, database=u.database)
    yield conn
    await conn.close()


ClientFactory = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def make_client(db_url: str) -> ClientFactory:
    """``async with make_client(memory_qos="burstable") as client:`` an app on this test's database.

    The fail-open deadline and the write timeout are generous by default: tests of sizing and storage
    must not turn into degraded answers or 503s because the shared machine is busy (a PUT took more than
    the default 2.5 s under load); reliability tests set their own. PostgreSQL's pools hold
    three connections, not eight (below).
    """

    @asynccontextmanager
    async def factory(**settings: Any) -> AsyncIterator[httpx.AsyncClient]:
        settings.setdefault("sizing_deadline_ms", 30_000)
        settings.setdefault("write_timeout_seconds", 30)
        # PostgreSQL: three connections per pool, not eight; each app opens its build path's pool at
        # start and closes it at the end, about 0.1 s a test for the five more (tests that need more
        # set their own; tests/test_fastpath_pg.py checks the default of 8)
        settings.setdefault("database_pool_size", 3)
        app = create_app(Settings(database_url=db_url, **settings))
        async with app.router.lifespan_context(app):
            feed = getattr(app.state, "change_feed", None)
            if feed is not None:  # PostgreSQL: answers are cached only once the change feed listens
                await asyncio.wait_for(feed.listening.wait(), 30)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
                client.app = app  # type: ignore[attr-defined]
                yield client

    return factory


@pytest.fixture
async def client(make_client: ClientFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client() as c:
        yield c


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
