"""A lean, fixed-size asyncpg connection pool for the request path.

asyncpg's own ``Pool`` resets every connection when it is released (``RESET ALL``, unlisten, close
portals, ...), one extra round trip per request; on the build path that cost about 40 % of the
throughput on this machine (/work/shared/notes/machine-facts.md). This pool hands a connection back
as it is, and instead discards (and later replaces) a connection that cannot be reused safely:

- it is closed (the server went away, or it was terminated);
- it is still inside a transaction (the caller left one open, or a statement failed in one);
- the block using it raised anything but a server-side error of one statement: a timeout, a
  cancellation or a network error may leave the protocol mid-message, and a FATAL error or one of
  SQLSTATE classes 08/53/57/58/XX (the backend was terminated, ...) ends the session.

The code using a connection must therefore never change session state (``SET``, ``LISTEN``, temporary
tables, prepared names of its own): nothing resets it.

The pool holds ``size`` slots. A slot is an open connection or empty; connections are opened lazily on
the first acquire of an empty slot, so the pool starts even when the database is down (fail-open).
``acquire`` waits at most ``acquire_timeout`` seconds for a slot and for opening a connection in it,
then raises :class:`PoolTimeout`.

    pool = Pool("postgresql://postgres@127.0.0.1/db", size=8)
    async with pool.acquire() as conn:
        row = await conn.fetchrow("SELECT ... WHERE id = $1", 7)
    row = await pool.fetchrow("SELECT ... WHERE id = $1", 7)
    await pool.close()
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import asyncpg  # type: ignore[import-untyped]

__all__ = ["Pool", "PoolClosed", "PoolTimeout", "asyncpg_dsn"]


class PoolTimeout(TimeoutError):
    """No connection could be had within the acquire timeout."""


class PoolClosed(RuntimeError):
    """The pool is closed."""


def asyncpg_dsn(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+asyncpg://...``) as asyncpg takes it (``postgresql://...``)."""
    scheme, sep, rest = url.partition("://")
    if sep and "+" in scheme:
        return scheme.split("+", 1)[0] + sep + rest
    return url


#: SQLSTATE classes after which a connection is not reused even though the server answered: connection
#: exceptions, operator intervention (``pg_terminate_backend``, shutdown), insufficient resources, internal
_FATAL_CLASSES = frozenset({"08", "53", "57", "58", "XX"})


def _statement_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an error of one statement that leaves its connection in step (a constraint,
    a division by zero, ...), as opposed to one that may have broken it."""
    if not isinstance(exc, asyncpg.PostgresError):
        return False
    sqlstate = getattr(exc, "sqlstate", None) or "XX"
    severity = getattr(exc, "severity_en", None) or getattr(exc, "severity", None) or "ERROR"
    return sqlstate[:2] not in _FATAL_CLASSES and severity not in ("FATAL", "PANIC")


class _Acquire:
    """``async with pool.acquire() as conn``: a plain class, not a generator, since it runs on every
    request."""

    __slots__ = ("_conn", "_pool", "_timeout")

    def __init__(self, pool: Pool, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._conn: Any = None

    async def __aenter__(self) -> Any:
        self._conn = await self._pool._get(self._timeout)
        return self._conn

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        conn, self._conn = self._conn, None
        self._pool._put(conn, exc)


class _Slots:
    """The pool's free slots: taken last in first out (the connection just released is used next, so a
    light load opens few), and handed to waiting acquires first in first out. A slot released while
    acquires wait goes to the one that has waited longest, never to one that came after it: with
    asyncio's queues a newcomer's ``get_nowait`` took it, and the woken waiter queued again at the back;
    at saturation some POSTs waited 50-235 ms for a connection where a fair turn is about 45 ms
    (docs/performance.md, "The pool's queue")."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, size: int) -> None:
        self._free: list[Any] = [None] * size  # None: an empty slot, opened on acquire
        self._waiters: collections.deque[asyncio.Future[Any]] = collections.deque()

    def qsize(self) -> int:
        return len(self._free)

    def get_nowait(self) -> Any:
        while self._waiters and self._waiters[0].done():  # given up (a timeout, a cancellation)
            self._waiters.popleft()
        if self._waiters or not self._free:
            raise asyncio.QueueEmpty
        return self._free.pop()

    async def get(self) -> Any:
        try:
            return self.get_nowait()
        except asyncio.QueueEmpty:
            pass
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # handed a slot as its wait ended: the next one's
                self.put_nowait(waiter.result())
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def put_nowait(self, slot: Any) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._free.append(slot)


class Pool:
    def __init__(
        self,
        dsn: str,
        *,
        size: int = 8,
        acquire_timeout: float = 5.0,
        close_timeout: float = 5.0,
        init: Callable[[Any], Awaitable[object]] | None = None,
        **connect_kwargs: Any,
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.dsn = asyncpg_dsn(dsn)
        self.size = size
        self.acquire_timeout = acquire_timeout
        self.close_timeout = close_timeout
        self._connect_kwargs = connect_kwargs
        #: run on each connection as it opens, before its first use (within the acquire's bound)
        self._init = init
        # a slot is an open connection or None (to be opened on acquire)
        self._free = _Slots(size)
        self._open: set[Any] = set()  # every connection this pool opened and has not discarded
        self._closed = False
        #: connections discarded (closed, left in a transaction, or after an error), for tests and metrics
        self.discarded = 0

    # ------------------------------------------------------------------ acquire / release

    def acquire(self, *, timeout: float | None = None) -> _Acquire:
        return _Acquire(self, self.acquire_timeout if timeout is None else timeout)

    async def _get(self, timeout: float | None) -> Any:
        if self._closed:
            raise PoolClosed("the connection pool is closed")
        budget = self.acquire_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        try:
            slot = self._free.get_nowait()
        except asyncio.QueueEmpty:
            try:
                async with asyncio.timeout(budget):  # (not wait_for: on 3.11 it can drop a slot it got)
                    slot = await self._free.get()
            except TimeoutError:
                raise PoolTimeout(
                    f"no database connection free within {budget:g}s (pool of {self.size}, all in use)"
                ) from None
        if self._closed:  # closed while waiting
            self._free.put_nowait(slot)
            raise PoolClosed("the connection pool is closed")
        if slot is not None and not slot.is_closed():
            return slot
        if slot is not None:
            self._forget(slot)
        try:
            conn = await self._connect(deadline)
        except BaseException as exc:
            self._free.put_nowait(None)  # the slot stays, empty
            if isinstance(exc, TimeoutError):
                raise PoolTimeout(f"could not open a database connection within {budget:g}s") from None
            raise
        self._open.add(conn)
        return conn

    async def _connect(self, deadline: float) -> Any:
        """A new connection with ``init`` run on it, both by ``deadline``; closed again if ``init`` fails."""
        remaining = max(0.001, deadline - time.monotonic())
        conn = await asyncpg.connect(self.dsn, timeout=remaining, **self._connect_kwargs)
        if self._init is not None:
            try:
                async with asyncio.timeout(max(0.001, deadline - time.monotonic())):
                    await self._init(conn)
            except BaseException:
                conn.terminate()
                raise
        return conn

    def _put(self, conn: Any, exc: BaseException | None) -> None:
        """Hand ``conn`` back as it is, or discard it when it cannot be reused (see the module doc)."""
        if conn is None:
            return
        reusable = (
            not self._closed
            and not conn.is_closed()
            and not conn.is_in_transaction()
            and (exc is None or _statement_error(exc))
        )
        if reusable:
            self._free.put_nowait(conn)
            return
        self._discard(conn)
        self._free.put_nowait(None)

    def _discard(self, conn: Any) -> None:
        self.discarded += 1
        self._forget(conn)
        if not conn.is_closed():
            conn.terminate()  # no round trip; the server rolls back an open transaction

    def _forget(self, conn: Any) -> None:
        self._open.discard(conn)

    # ------------------------------------------------------------------ helpers

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchrow(query, *args, timeout=timeout)

    async def fetchval(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchval(query, *args, timeout=timeout)

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]:
        async with self.acquire() as conn:
            rows: list[Any] = await conn.fetch(query, *args, timeout=timeout)
            return rows

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        async with self.acquire() as conn:
            status: str = await conn.execute(query, *args, timeout=timeout)
            return status

    async def warm(self, prime: Callable[[Any], Awaitable[object]] | None = None) -> int:
        """Open every connection now and run ``prime`` on each (to plan what the first requests would
        plan), so that the first requests after a start pay for neither; how many opened. A connection
        that cannot be opened leaves its slot empty, opened later as usual."""

        async def one() -> bool:
            try:
                async with self.acquire() as conn:
                    if prime is not None:
                        await prime(conn)
                return True
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, PoolTimeout, PoolClosed):
                return False

        # every slot at once: each acquire takes a free slot, so the pool's connections all open
        return sum(await asyncio.gather(*(one() for _ in range(self.size))))

    # ------------------------------------------------------------------ state

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def free(self) -> int:
        """Slots not in use (open or empty)."""
        return self._free.qsize()

    @property
    def opened(self) -> int:
        """Connections open now (free or in use)."""
        return len(self._open)

    async def close(self) -> None:
        """Refuse new acquires, wait up to ``close_timeout`` for connections in use to come back,
        close them all (gracefully when idle, by terminating those still in use after the wait)."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self.close_timeout
        returned = 0
        while returned < self.size:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    slot = await self._free.get()
            except TimeoutError:
                break
            returned += 1
            if slot is not None and not slot.is_closed():
                self._forget(slot)
                try:
                    await asyncio.wait_for(slot.close(), max(0.001, deadline - time.monotonic()))
                except (TimeoutError, OSError, asyncpg.PostgresError):
                    slot.terminate()
        for conn in list(self._open):  # still in use after the wait
            self._forget(conn)
            conn.terminate()

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
