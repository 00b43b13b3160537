"""Engines and sessions. Engines are built in the app's lifespan, never at import.

SQLite: the driver's own transaction handling is switched off and SQLAlchemy emits ``BEGIN``
itself (the documented pysqlite/aiosqlite recipe), so savepoints and transactional DDL work.
Writes go through a second engine whose transactions start with ``BEGIN IMMEDIATE``: a writer
takes the write lock up front and waits for it (``busy_timeout``) instead of failing when a
read-then-write transaction cannot upgrade its lock. On PostgreSQL both are the same engine.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

import asyncpg  # type: ignore[import-untyped]
from fastapi import Depends, Request
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session

T = TypeVar("T")

#: Exceptions that mean "the database did not answer" rather than "the code is wrong": every
#: failure to connect or to talk to it. ``OSError`` covers what the operating system says while
#: connecting before any driver wraps it: a refused port (``ConnectionRefusedError``), a Unix socket
#: path that does not exist (``FileNotFoundError``), a host name that does not resolve
#: (``socket.gaierror``), a connect or statement timeout (``TimeoutError``). asyncpg raises its own
#: errors unwrapped while connecting (a server still starting, too many connections, a database
#: that does not exist); SQLAlchemy wraps the rest in ``DBAPIError``.
DB_FAULTS: tuple[type[Exception], ...] = (
    sa_exc.DBAPIError,  # OperationalError, InterfaceError, ... from either driver
    sa_exc.TimeoutError,  # no pooled connection within the pool timeout
    sa_exc.DisconnectionError,
    OSError,  # ConnectionError, TimeoutError, FileNotFoundError, socket.gaierror, ...
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
)


def redacted(database_url: str) -> str:
    """The URL as logs and errors show it: the password hidden."""
    return make_url(database_url).render_as_string(hide_password=True)


def is_memory_sqlite(database_url: str) -> bool:
    if not database_url.startswith("sqlite"):
        return False
    database = make_url(database_url).database
    return database in (None, "", ":memory:") or "mode=memory" in database_url


def is_local_postgres(database_url: str) -> bool:
    """Whether the URL names a PostgreSQL server on this machine (a loopback host or a Unix socket)
    without saying anything about TLS itself (``ssl``/``sslmode`` in the URL win)."""
    url = make_url(database_url)
    if not url.drivername.startswith("postgresql") or "ssl" in url.query or "sslmode" in url.query:
        return False
    host = url.host or url.query.get("host")
    if isinstance(host, tuple):
        host = host[0] if host else None
    if not host or host.startswith("/"):
        return True  # a Unix socket
    return host == "localhost" or _is_loopback_address(host)


def _is_loopback_address(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: Session settings of every PostgreSQL connection the service opens (the engines and the build path's
#: pool). One generic plan per prepared statement (see ``build_engine``), and no JIT compilation: a
#: generic plan on tables that were never analyzed (a server with autovacuum off, a fresh restore) is
#: costed from their size alone, which soon passes ``jit_above_cost``, and was then compiled at every
#: execution: a job's build-path state rebuilt from 100,000 runs took 566 ms, 520 of them compiling,
#: and a batch of 20 runs 13 s. The statements are index lookups and short aggregates: compiling never
#: pays for itself.
SESSION_SETTINGS = {"plan_cache_mode": "force_generic_plan", "jit": "off"}

#: The array types the service's statements bind or read on PostgreSQL (the build path's POST binds a
#: run's containers as arrays, retention and the job states bind job ids as ``bigint[]``). asyncpg has
#: codecs of its own for none of them: the first statement that uses one on a connection first asks the
#: server's catalog (``WITH RECURSIVE typeinfo_tree``, a recursive query over ``pg_type``, 2-20 ms on a
#: new backend whose catalog caches are cold, and two more round trips), which the request or pass that
#: happens to run it waits for. ``learn_types`` asks once, for all of them, as the connection opens.
ARRAY_TYPES = "SELECT $1::bigint[], $2::integer[], $3::varchar[], $4::float8[], $5::boolean[], $6::text[]"


async def learn_types(conn: Any) -> None:
    """On a new asyncpg connection: have asyncpg learn ``ARRAY_TYPES`` (one catalog query), so that no
    later statement stops to."""
    await conn.prepare(ARRAY_TYPES)


#: Connections in an engine's pool (PostgreSQL; no overflow beyond it); the service's own engines take
#: ``Settings.database_pool_size`` instead.
POOL_SIZE = 8

#: How long to wait for access to the database (a connection, a pooled connection, SQLite's lock).
CONNECT_TIMEOUT_SECONDS = 5.0


def build_engine(
    database_url: str,
    *,
    immediate: bool = False,
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    statement_timeout: float | None = None,
    **kwargs: Any,
) -> AsyncEngine:
    """An async engine for SQLite (aiosqlite) or PostgreSQL (asyncpg).

    Nothing waits on the database without a bound: ``connect_timeout`` bounds opening a
    connection (asyncpg's ``timeout``) and waiting for one from a full pool (``pool_timeout``), and
    on SQLite waiting for a lock (``busy_timeout``); ``statement_timeout`` (seconds, ``None``: no
    bound, for migrations and the CLI's long reads) bounds each statement on PostgreSQL (asyncpg's
    ``command_timeout``), so a server that accepts connections and then never answers costs a
    request at most that long, never the 60 s of asyncpg's defaults or forever.
    """
    if "poolclass" not in kwargs and not is_memory_sqlite(database_url):  # a StaticPool has no timeout
        kwargs.setdefault("pool_timeout", connect_timeout)
    if database_url.startswith("sqlite"):
        engine = create_async_engine(database_url, connect_args={"timeout": connect_timeout}, **kwargs)
        busy_ms = max(1, round(connect_timeout * 1000))
        begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute(f"PRAGMA busy_timeout={busy_ms}")
            cur.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            conn.exec_driver_sql(begin)

        return engine
    if "poolclass" not in kwargs:
        # A fixed pool and no overflow: an overflow connection is opened for one checkout and closed
        # on its return, so under load every request past the pool paid a connect and a disconnect
        # (13.5 % of the build path's samples in a py-spy profile). Eight connections keep PostgreSQL
        # busy on two cores; waiting for one is bounded by ``pool_timeout``.
        kwargs.setdefault("pool_size", POOL_SIZE)
        kwargs.setdefault("max_overflow", 0)
    # No pre-ping: it costs a round trip on every checkout (about 15% of ingest throughput, see
    # bench/ingest.py). A connection that died with the server fails its first statement instead
    # (a 503 to retry, or a degraded sizing answer), and SQLAlchemy then renews the whole pool.
    kwargs.setdefault("pool_pre_ping", False)
    # Every statement is a parameterised index lookup, prepared once per connection (asyncpg's
    # statement cache). PostgreSQL's "auto" mode re-plans such statements on every execution when
    # the tables are large (custom plans look cheaper), which made the sizing read path 30% slower on
    # a 1,000,000-run database than on a small one (bench/history.py); one generic plan is right
    # for all of them. Needs PostgreSQL 12 or later.
    connect_args = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("timeout", connect_timeout)
    if is_local_postgres(database_url):
        # asyncpg's default (sslmode=prefer) first asks a server for TLS on every new connection,
        # a wasted round trip (and a TLS handshake where one is configured) on a loopback host
        connect_args.setdefault("ssl", False)
    if statement_timeout is not None:
        connect_args.setdefault("command_timeout", statement_timeout)
    connect_args.setdefault("server_settings", {}).update(SESSION_SETTINGS)
    engine = create_async_engine(database_url, connect_args=connect_args, **kwargs)

    @event.listens_for(engine.sync_engine, "connect")
    def _learn_types(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.run_async(learn_types)

    return engine


#: reads given up at their deadline, still cleaning up (kept so that they are not collected)
_abandoned: set[asyncio.Task[Any]] = set()


def _forget(task: asyncio.Task[Any]) -> None:
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: a fault after the deadline is not worth a warning


async def finished_within(task: asyncio.Future[Any], seconds: float) -> bool:
    """Whether ``task`` finished within ``seconds`` (never waiting for it past them); it is cancelled
    with the caller."""
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    return bool(done)


async def within(seconds: float, work: Coroutine[Any, Any, T]) -> T:
    """``await work``, or raise ``TimeoutError`` at ``seconds``, however long ``work`` then takes
    to give up. (``asyncio.wait_for`` waits for the cancelled work to finish: a read on a
    connection whose server hangs then rolls back on that connection, and the answer came seconds
    after its deadline.) The work is cancelled and finishes in the background."""
    task = asyncio.ensure_future(work)
    if not await finished_within(task, seconds):
        task.cancel()
        _abandoned.add(task)
        task.add_done_callback(_forget)
        raise TimeoutError
    return task.result()


#: ``Session.info`` key of the database connections a session's transactions used (``UnitOfWork.terminate``)
_CONNECTIONS = "ci_sizer.connections"


class _Session(Session):
    """The sessions' class: it remembers the connections its transactions begin on."""


@event.listens_for(_Session, "after_begin")
def _remember(session: Session, _transaction: Any, connection: Any) -> None:
    session.info.setdefault(_CONNECTIONS, []).append(connection)


def build_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False, autoflush=False, sync_session_class=_Session)


class UnitOfWork:
    """One transaction of a request or of a background task, and the one place that commits.

    Work that must follow the commit (this worker's cache invalidated so it reads its own writes,
    the job noted for retention) is registered with ``after_commit`` and runs only once the commit
    succeeded; a rollback drops it."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session
        self._after: list[Callable[[], None]] = []
        #: work given up at its deadline and still winding down: the session is left to it
        self.winding_down: asyncio.Task[Any] | None = None

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._after.append(callback)

    async def commit(self) -> None:
        await self.session.commit()
        callbacks, self._after = self._after, []
        for callback in callbacks:
            callback()

    async def rollback(self) -> None:
        self._after.clear()
        if self.winding_down is None:
            await self.session.rollback()

    def terminate(self) -> None:
        """Close the connections this unit's transactions use at once, with no rollback and no goodbye
        (PostgreSQL rolls back what did not commit when a connection drops): a statement waiting on a
        server that does not answer fails now instead of at its statement timeout, and so does the
        rollback after it. SQLite's connections have nothing to wait on but a lock, and are left."""
        for connection in self.session.sync_session.info.get(_CONNECTIONS, ()):
            try:
                driver = connection.connection.driver_connection
            except Exception:  # already closed or invalidated
                continue
            kill = getattr(driver, "terminate", None)  # asyncpg's Connection.terminate(): no round trip
            if kill is not None and not driver.is_closed():
                kill()


#: how long a write given up at its deadline may take to wind down before it is left to finish alone
GIVE_UP_SECONDS = 0.5


async def bounded_write(uow: UnitOfWork, seconds: float, work: Coroutine[Any, Any, T]) -> T:
    """``await work`` (which writes through ``uow``), or raise ``TimeoutError`` at ``seconds``: then its
    connections are terminated (``UnitOfWork.terminate``) and the work cancelled, which makes it give up
    at once, whether it waits on a statement, on the commit, on a new connection or on the pool. (The
    ``asyncio.wait_for`` it replaces waited for the cancelled work's rollback, on a connection whose
    server does not answer: the answer came after the statement timeout.)"""
    task = asyncio.ensure_future(work)
    if await finished_within(task, seconds):
        return task.result()
    uow.terminate()
    task.cancel()
    await asyncio.wait({task}, timeout=GIVE_UP_SECONDS)
    if task.done():
        _forget(task)
    else:  # still winding down (SQLite waiting on its lock): it finishes in the background
        uow.winding_down = task
        _abandoned.add(task)
        task.add_done_callback(_forget)
    raise TimeoutError


def in_background(work: Coroutine[Any, Any, Any] | asyncio.Future[Any]) -> None:
    """Let ``work`` finish on its own, kept from the garbage collector, its outcome not worth a warning."""
    task = asyncio.ensure_future(work)
    _abandoned.add(task)
    task.add_done_callback(_forget)


@asynccontextmanager
async def unit_of_work(maker: async_sessionmaker[AsyncSession]) -> AsyncIterator[UnitOfWork]:
    """Commit when the block ends (a no-op when the work already committed), roll back when it raises.
    A unit whose work was abandoned at its deadline is closed once that work has wound down."""
    session = maker()
    uow = UnitOfWork(session)
    try:
        yield uow
        await uow.commit()
    except BaseException:
        await uow.rollback()
        raise
    finally:
        if uow.winding_down is None:
            await session.close()
        else:
            uow.winding_down.add_done_callback(lambda _: in_background(session.close()))


async def get_unit_of_work(request: Request) -> AsyncIterator[UnitOfWork]:
    """Unit of work per request: commit when the route returns, roll back when it raises.

    Declared with ``scope="function"``: the commit happens before the response is sent, so a
    201 is only ever answered for what is committed.
    """
    async with unit_of_work(request.app.state.sessionmaker) as uow:
        yield uow


#: ``scope`` key of the list where a write request's units of work are registered, so that the front
#: can terminate their connections at the write timeout (``main.Gate``)
WRITES = "ci_sizer.writes"


async def get_write_unit_of_work(request: Request) -> AsyncIterator[UnitOfWork]:
    """The same unit of work on the write engine (``BEGIN IMMEDIATE`` on SQLite)."""
    async with unit_of_work(request.app.state.write_sessionmaker) as uow:
        registered = request.scope.get(WRITES)
        if registered is not None:
            registered.append(uow)
        yield uow


UnitOfWorkDep = Annotated[UnitOfWork, Depends(get_unit_of_work, scope="function")]
WriteUnitOfWorkDep = Annotated[UnitOfWork, Depends(get_write_unit_of_work, scope="function")]
