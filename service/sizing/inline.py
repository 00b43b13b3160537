"""Where a SQLite file's sizing miss is read (``sqliteread.read``): on the event loop, else on a thread.

``Reader`` reads a miss **inline** with a connection of its own, bounded by a budget and never waiting for
a lock, and gives way to a small executor's threads where that read would wait or runs long
(docs/performance.md, "The hop to a thread removed"); ``EngineReads`` reads an in-memory database on the
engine's pooled connections. ``reads_for`` picks one for the app.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from service.db import is_memory_sqlite, within
from service.keys import ScopeKey
from service.sizing.params import SizingParams
from service.sizing.service import Policy, Recommendation
from service.sizing.sqliteread import Read, finish, prepare, read, recommend

log = logging.getLogger("ci_sizer.sizing")


class ReadsClosed(sqlite3.OperationalError):
    """A miss asked for after the reads were closed (the app shutting down): a fault, answered degraded."""


#: the longest an inline read may hold the event loop: past it, SQLite interrupts the read and it is read
#: again on a thread (a miss reads in 0.1-0.5 ms; ten times the slowest leaves room for a busy machine)
INLINE_BUDGET_SECONDS = 0.005
#: after a second inline read past its budget, every miss is read on a thread for this long
INLINE_PAUSE_SECONDS = 10.0
#: a read past its budget pauses inline reads only when another was, at most this many misses before
#: it: one alone is the machine's (the process descheduled, the GIL held by a thread), not the database's
LATE_AGAIN_WITHIN = 16
#: SQLite virtual-machine steps between two looks at the inline read's clock (a miss takes about 700)
_PROGRESS_STEPS = 100
#: the primary result codes of an inline read that gives way to a thread: busy, locked, interrupted
_GIVE_WAY = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_INTERRUPT})


def _gives_way(exc: sqlite3.Error) -> bool:
    """Whether a failed inline read is read again on a thread: it would have waited, or ran too long."""
    return isinstance(exc, sqlite3.OperationalError) and exc.sqlite_errorcode & 0xFF in _GIVE_WAY


class Reader:
    """The build path's own read connections to a SQLite file: plain ``sqlite3`` connections, read-only
    (``query_only``), never created by a reader (``mode=rw``).

    A miss is read **inline**, on the event loop, with a connection of its own that never waits for a
    lock (``busy_timeout`` 0) and is interrupted past ``INLINE_BUDGET_SECONDS``: the hop to a thread
    cost a worker more than the read (docs/performance.md, "The hop to a thread removed"). A read that
    would wait or runs past the budget gives way to a thread of a small executor, whose connection waits
    up to ``busy_timeout`` within the sizing deadline; after a second read past the budget within
    ``LATE_AGAIN_WITHIN`` misses, misses go to the threads for ``inline_pause``. A read blocked in the kernel (a disk that stops answering) holds the
    loop until the disk answers: no budget bounds it."""

    def __init__(
        self,
        path: str,
        *,
        threads: int = 2,
        busy_timeout: float = 5.0,
        inline_budget: float = INLINE_BUDGET_SECONDS,
        inline_pause: float = INLINE_PAUSE_SECONDS,
    ) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.inline_budget = inline_budget
        self.inline_pause = inline_pause
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ci-sizer-sqlite-read")
        self._local = threading.local()
        self._opened: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._inline_db: sqlite3.Connection | None = None
        self._inline_ends = 0.0  # perf_counter() past which the inline read in progress is interrupted
        self._inline_paused_until = 0.0  # monotonic()
        self._attempts = 0  # inline reads begun
        self._late_at = -LATE_AGAIN_WITHIN - 1  # the attempt of the last read past the budget
        #: misses read inline, those that gave way to a thread, inline reads past the budget (for tests and diagnosis)
        self.inline_reads = 0
        self.gave_way = 0
        self.late_reads = 0

    def _connect(self, *, busy_timeout: float, check_same_thread: bool) -> sqlite3.Connection:
        # ``mode=rw``: a reader never creates the file (the engine's migrations make it)
        uri = Path(self.path).absolute().as_uri() + "?mode=rw"
        db = sqlite3.connect(
            uri, uri=True, timeout=busy_timeout, isolation_level=None, check_same_thread=check_same_thread
        )
        try:
            db.execute(f"PRAGMA busy_timeout={round(busy_timeout * 1000)}")
            db.execute("PRAGMA query_only=ON")
            prepare(db)
        except BaseException:
            db.close()
            raise
        with self._lock:
            self._opened.append(db)
        return db

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect(busy_timeout=max(0.001, self.busy_timeout), check_same_thread=False)
        return db

    def _call(self, key: ScopeKey, params: SizingParams, policy: Policy) -> Read:
        return read(self._db(), key, params, policy)

    def prime(self) -> None:
        """The loop's connection opened at startup, not by the first miss (a file locked now: by that miss)."""
        self._inline_connection()

    def _over_budget(self) -> bool:
        return time.perf_counter() > self._inline_ends

    def _inline(self, key: ScopeKey, params: SizingParams, policy: Policy) -> Read | None:
        """The read on the event loop, or None when it gives way to a thread (a lock, the budget)."""
        if time.monotonic() < self._inline_paused_until:
            return None
        db = self._inline_connection()
        if db is None:
            self.gave_way += 1
            return None
        # no collection of the heap inside the read: one due (a young generation took 2-5 ms here) runs
        # after it, so the budget, and the pause, time the read and not the collector's work
        collecting = gc.isenabled()
        gc.disable()
        self._attempts += 1
        started = time.perf_counter()
        self._inline_ends = started + self.inline_budget
        try:
            found = read(db, key, params, policy)
        except sqlite3.Error as exc:
            if db.in_transaction:  # its ROLLBACK interrupted too: the loop's connection is never reused mid-read
                self._inline_ends = math.inf
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    self._drop_inline()
            if not _gives_way(exc):
                raise
            self.gave_way += 1
            return None
        finally:
            took = time.perf_counter() - started
            if collecting:
                gc.enable()
            if took > self.inline_budget:
                self._late(took)
        self.inline_reads += 1
        return found

    def _late(self, took: float) -> None:
        again, self._late_at = self._attempts - self._late_at <= LATE_AGAIN_WITHIN, self._attempts
        self.late_reads += 1
        if not again:
            log.info("a SQLite sizing read held the event loop %.1f ms (once: misses still read inline)", took * 1000)
            return
        self._inline_paused_until = time.monotonic() + self.inline_pause
        self._late_at = -LATE_AGAIN_WITHIN - 1  # the pair is spent: after the pause, one late read alone again
        log.warning(
            "SQLite sizing reads held the event loop past %.1f ms twice (%.1f ms): misses are read on threads for %.0f s",
            self.inline_budget * 1000,
            took * 1000,
            self.inline_pause,
        )

    def _inline_connection(self) -> sqlite3.Connection | None:
        """The loop's own connection, opened on first use; None while the file is locked."""
        if self._inline_db is None:
            try:
                db = self._connect(busy_timeout=0, check_same_thread=True)
            except sqlite3.Error as exc:
                if not _gives_way(exc):  # (busy: the statements' first run found the file locked)
                    raise
                return None
            db.set_progress_handler(self._over_budget, _PROGRESS_STEPS)
            self._inline_db = db
        return self._inline_db

    def _drop_inline(self) -> None:  # the loop's own connection, closed on the loop
        db, self._inline_db = self._inline_db, None
        if db is not None:
            with self._lock:
                self._opened.remove(db)
            db.close()

    def inline(self, *, key: ScopeKey, params: SizingParams, policy: Policy) -> Recommendation | None:
        """The answer read on the event loop, or None where the read gives way to a thread."""
        if self._closed:
            raise ReadsClosed("the build path's SQLite reads are closed")
        found = self._inline(key, params, policy)
        return None if found is None else finish(found, key=key, params=params, policy=policy)

    async def recommend(
        self, *, key: ScopeKey, params: SizingParams, policy: Policy, deadline: float | None = None
    ) -> Recommendation:
        """``sizing.service.recommend``: inline, else on a thread within what the inline attempt left of
        ``deadline`` seconds (``db.within``: a read on a thread cannot be interrupted, a lock waits up to
        ``busy_timeout``, so it is left to finish in the background; None: no bound). Faults are
        ``sqlite3.Error`` (a database that cannot be opened, a lock past ``busy_timeout``, the reads
        closed under a request at shutdown) and ``TimeoutError`` past the deadline."""
        # one turn of the loop first, as when every read went to a thread: without it the cold start's
        # tail doubled (docs/performance.md, "Cold GET on SQLite")
        await asyncio.sleep(0)
        started = time.perf_counter()
        rec = self.inline(key=key, params=params, policy=policy)
        if rec is not None:
            return rec
        on_thread = self.on_thread(key=key, params=params, policy=policy)
        if deadline is None:
            return await on_thread
        return await within(deadline - (time.perf_counter() - started), on_thread)

    async def on_thread(self, *, key: ScopeKey, params: SizingParams, policy: Policy) -> Recommendation:
        """The answer read on a thread (where an inline read gave way)."""
        if self._closed:
            raise ReadsClosed("the build path's SQLite reads are closed")
        found = await asyncio.get_running_loop().run_in_executor(self._executor, self._call, key, params, policy)
        return finish(found, key=key, params=params, policy=policy)

    def _close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for db in self._opened:
                db.close()
            self._opened.clear()

    async def close(self) -> None:
        """Stop the threads (a read still running finishes first: bound this) and close the connections."""
        self._closed = True
        self._drop_inline()
        await asyncio.to_thread(self._close)


class EngineReads:
    """The same reads on the engine's pooled aiosqlite connections, for an in-memory database (whose
    connections cannot be opened a second time) or a URL with options the plain connections would not read."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def prime(self) -> None:
        """Nothing: the engine's connections are opened by the app's warm-up."""

    async def recommend(
        self, *, key: ScopeKey, params: SizingParams, policy: Policy, deadline: float | None = None
    ) -> Recommendation:
        """The answer read on an engine connection's thread, within ``deadline`` seconds as ``Reader``'s."""
        work = recommend(engine=self.engine, key=key, params=params, policy=policy)
        return await (work if deadline is None else within(deadline, work))

    async def close(self) -> None:
        """Nothing of its own: the engine is closed with the app."""


def reads_for(
    database_url: str, engine: AsyncEngine, *, busy_timeout: float, deadline: float = INLINE_BUDGET_SECONDS
) -> Reader | EngineReads:
    """The build path's SQLite reads: its own connections to a database file (an inline read's budget
    never past the sizing ``deadline``), else the engine's."""
    url = make_url(database_url)
    if is_memory_sqlite(database_url) or url.query or not url.database:
        return EngineReads(engine)
    return Reader(url.database, busy_timeout=busy_timeout, inline_budget=min(INLINE_BUDGET_SECONDS, deadline))


__all__: Sequence[str] = ("EngineReads", "Reader", "ReadsClosed", "reads_for")
