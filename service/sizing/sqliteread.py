"""One job's sizing answer read as one function with a raw ``sqlite3`` connection (SQLite only).

The route reads a miss with three or four statements through SQLAlchemy on aiosqlite, a dozen trips to
the connection's thread and back (docs/performance.md, "Cold GET on SQLite"). Here the whole read (the
overrides that bear on the job, its summary, its window, and for an efficient answer with no sample the
org's prior) is one function, ``read``, in one transaction as the route's (``BEGIN`` ... ``ROLLBACK``:
one snapshot): on the event loop (``Reader``), on a thread where that read gives way, or in one hop to
a pooled aiosqlite connection's thread for an in-memory database (``EngineReads``).

The statements are the route's own (``overrides.service._APPLICABLE``, ``history._SUMMARY``,
``history._WINDOW``/``_ALL_RUNS``, ``priors._READ``), compiled once for SQLite, and their columns go
through the same SQLAlchemy result processors (booleans, datetimes), so the rows read as the route's
rows do; the answer is computed by the same ``sizing.service.recommendation``. A parity test
(tests/test_fastpath_sqlite.py) checks both give the same answers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import threading
import time
from collections import namedtuple
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import Select

from service import core
from service.db import is_memory_sqlite
from service.keys import ScopeKey
from service.overrides.service import _APPLICABLE, PinRow, is_expired
from service.sizing import history as history_module
from service.sizing import priors
from service.sizing.history import _PHASE_SAMPLES, History, HistoryRun, run_seconds
from service.sizing.params import SizingParams
from service.sizing.service import Policy, Recommendation, choose, reads_samples, recommendation, window_runs
from service.wire import utcnow

_DIALECT = sqlite_dialect.dialect()
log = logging.getLogger("ci_sizer.sizing")


class _Statement:
    """A Core ``select`` compiled for SQLite: its SQL, how its parameters line up, and its rows' shape."""

    def __init__(self, stmt: Select[Any]) -> None:
        compiled = stmt.compile(dialect=_DIALECT)
        self.sql = compiled.string
        self.defaults = dict(compiled.params)  # the literal values' anonymous parameters
        self.order = tuple(compiled.positiontup or ())
        columns = list(stmt.selected_columns)
        self.row: Any = namedtuple("_Row", [c.key for c in columns])  # type: ignore[misc]
        self.processors: list[Callable[[Any], Any] | None] = [
            c.type._cached_result_processor(_DIALECT, None) for c in columns
        ]

    def raw(self, db: sqlite3.Connection, **values: Any) -> list[tuple[Any, ...]]:
        """The rows as the database gives them."""
        given = {**self.defaults, **values}
        return db.execute(self.sql, tuple(given[name] for name in self.order)).fetchall()

    def convert(self, raw: list[tuple[Any, ...]]) -> list[Any]:
        """Rows as SQLAlchemy would give them: each column through its type's result processor."""
        processors = self.processors
        make = self.row._make
        if not any(processors):
            return [make(r) for r in raw]
        return [make([v if p is None else p(v) for p, v in zip(processors, r, strict=True)]) for r in raw]

    def rows(self, db: sqlite3.Connection, **values: Any) -> list[Any]:
        return self.convert(self.raw(db, **values))


_APPLICABLE_SQL = _Statement(_APPLICABLE)
_SUMMARY_SQL = _Statement(history_module._SUMMARY)
_WINDOW_SQL = _Statement(history_module._WINDOW)
_ALL_RUNS_SQL = _Statement(history_module._ALL_RUNS)
_PRIOR_SQL = _Statement(priors._READ)


class Read:
    """What one miss read: the applicable pins, the job's summary and window (rows as the database gave
    them: ``history`` builds the job's history from them), the org's prior (or None)."""

    __slots__ = ("history", "pins", "prior", "summary", "window")

    def __init__(
        self,
        pins: dict[str, PinRow],
        summary: tuple[Any, ...] | None,
        window: list[tuple[Any, ...]],
        prior: tuple[int, int] | None,
        history: History | None = None,
    ) -> None:
        self.pins, self.summary, self.window, self.prior, self.history = pins, summary, window, prior, history


def read(db: sqlite3.Connection, key: ScopeKey, params: SizingParams, policy: Policy) -> Read:
    """``sizing.service.recommend``'s reads, on a raw connection: in one transaction, as the route's
    connection reads them. Only the few override rows are converted here; the window's rows are left
    as they come (``history`` converts them: on the event loop when this runs on a thread, which then
    holds the GIL as little as it can), except for an efficient answer, which needs its history to
    know whether to read the prior (E6)."""
    db.execute("BEGIN")
    try:
        return _read(db, key, params, policy)
    finally:
        if db.in_transaction:  # a statement that failed (busy, interrupted) may have ended it already
            db.execute("ROLLBACK")


def _read(db: sqlite3.Connection, key: ScopeKey, params: SizingParams, policy: Policy) -> Read:
    now = utcnow()
    names = {"org": key.org, "repo": key.repo, "workflow": key.workflow, "job": key.job}
    pins = {row.scope: row for row in _APPLICABLE_SQL.rows(db, **names) if not is_expired(row, now)}
    efficient = reads_samples(choose(pins, policy))
    found = _SUMMARY_SQL.raw(db, **names)
    summary = found[0] if found else None
    window: list[tuple[Any, ...]] = []
    if summary is not None:  # a job never seen has no window (and, efficient, reads the prior below)
        runs = window_runs(params, efficient)
        clean_samples = summary[1]
        short = clean_samples == 0 or (efficient and clean_samples < runs)
        statement = _ALL_RUNS_SQL if short else _WINDOW_SQL
        window = statement.raw(db, job_id=summary[0], runs=max(runs, _PHASE_SAMPLES))
    if not efficient:
        return Read(pins, summary, window, None)
    history = history_of(summary, window, need_node_memory=policy.max_memory is None)
    prior: tuple[int, int] | None = None
    if not priors.has_sample(history.window):  # E6
        got = _PRIOR_SQL.rows(db, org=key.org)
        prior = core.PRIOR_EMPTY if not got else (int(got[0].sampled_jobs), int(got[0].peak_bytes))
    return Read(pins, summary, window, prior, history)


def history_of(summary: tuple[Any, ...] | None, window: list[tuple[Any, ...]], *, need_node_memory: bool) -> History:
    """``history.load_history``'s result from the summary and window rows as the database gave them."""
    history = History()
    if summary is None:
        return history
    _, history.clean_samples, node_memory = summary
    if need_node_memory:
        history.newest_node_memory_bytes = node_memory
    current: HistoryRun | None = None
    for row in _WINDOW_SQL.convert(window):
        if current is None or current.id != row.id:
            current = HistoryRun(
                id=row.id,
                clean=row.clean,
                pod_memory_peak_bytes=row.pod_memory_peak_bytes,
                seconds=run_seconds(row.started_at, row.finished_at),
            )
            history.window.append(current)
        current.containers[row.name] = row
    return history


def finish(found: Read, *, key: ScopeKey, params: SizingParams, policy: Policy) -> Recommendation:
    """The recommendation from what ``read`` read, as ``sizing.service.recommend`` computes it."""
    history = found.history
    if history is None:
        history = history_of(found.summary, found.window, need_node_memory=policy.max_memory is None)
    return recommendation(
        key=key,
        job_id=None if found.summary is None else found.summary[0],
        history=history,
        pins=found.pins,
        params=params,
        policy=policy,
        prior=found.prior,
    )


async def recommend(*, engine: AsyncEngine, key: ScopeKey, params: SizingParams, policy: Policy) -> Recommendation:
    """``sizing.service.recommend`` with its reads in one hop to a pooled aiosqlite connection's thread
    (an in-memory database, whose connections cannot be opened twice). Faults are the route's: the
    engine's (connecting, the pool) and ``sqlite3.Error`` (a locked or broken database), which the
    caller treats as the route treats the engine's."""
    async with engine.connect() as conn:
        raw = await conn.get_raw_connection()
        aio = raw.driver_connection  # the aiosqlite.Connection
        found: Read = await aio._execute(_on_thread, aio, key, params, policy)  # type: ignore[union-attr]
    return finish(found, key=key, params=params, policy=policy)


def _on_thread(aio: Any, key: ScopeKey, params: SizingParams, policy: Policy) -> Read:
    return read(aio._conn, key, params, policy)


class ReadsClosed(sqlite3.OperationalError):
    """A miss asked for after the reads were closed (the app shutting down): a fault, answered degraded."""


#: the longest an inline read may hold the event loop: past it, SQLite interrupts the read and it is read
#: again on a thread (a miss reads in 0.1-0.5 ms; ten times the slowest leaves room for a busy machine)
INLINE_BUDGET_SECONDS = 0.005
#: after an inline read that ran past its budget, every miss is read on a thread for this long
INLINE_PAUSE_SECONDS = 10.0
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
    up to ``busy_timeout`` within the sizing deadline; after a read past the budget, misses go to the
    threads for ``inline_pause``. A read blocked in the kernel (a disk that stops answering) holds the
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
        #: misses read inline, and those that gave way to a thread (for tests and diagnosis)
        self.inline_reads = 0
        self.gave_way = 0

    def _connect(self, *, busy_timeout: float, check_same_thread: bool) -> sqlite3.Connection:
        # ``mode=rw``: a reader never creates the file (the engine's migrations make it)
        uri = Path(self.path).absolute().as_uri() + "?mode=rw"
        db = sqlite3.connect(
            uri, uri=True, timeout=busy_timeout, isolation_level=None, check_same_thread=check_same_thread
        )
        try:
            db.execute(f"PRAGMA busy_timeout={round(busy_timeout * 1000)}")
            db.execute("PRAGMA query_only=ON")
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # the schema read now, not in a miss
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

    def _over_budget(self) -> bool:
        return time.perf_counter() > self._inline_ends

    def _inline(self, key: ScopeKey, params: SizingParams, policy: Policy) -> Read | None:
        """The read on the event loop, or None when it gives way to a thread (a lock, the budget)."""
        if time.monotonic() < self._inline_paused_until:
            return None
        db = self._inline_db
        if db is None:
            try:
                db = self._connect(busy_timeout=0, check_same_thread=True)
            except sqlite3.Error as exc:
                if not _gives_way(exc):  # (busy: the schema's read found the file locked)
                    raise
                self.gave_way += 1
                return None
            db.set_progress_handler(self._over_budget, _PROGRESS_STEPS)
            self._inline_db = db
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
            if took > self.inline_budget:
                self._inline_paused_until = time.monotonic() + self.inline_pause
                log.warning(
                    "a SQLite sizing read held the event loop %.1f ms: misses are read on threads for %.0f s",
                    took * 1000,
                    self.inline_pause,
                )
        self.inline_reads += 1
        return found

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

    async def recommend(self, *, key: ScopeKey, params: SizingParams, policy: Policy) -> Recommendation:
        """``sizing.service.recommend``: inline, else on a thread; faults are ``sqlite3.Error`` (a
        database that cannot be opened, a lock past ``busy_timeout``, the reads closed under a request
        at shutdown)."""
        rec = self.inline(key=key, params=params, policy=policy)
        return rec if rec is not None else await self.on_thread(key=key, params=params, policy=policy)

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

    def inline(self, *, key: ScopeKey, params: SizingParams, policy: Policy) -> Recommendation | None:
        """None: the engine's connections are read on their threads (``recommend``)."""
        return None

    async def recommend(self, *, key: ScopeKey, params: SizingParams, policy: Policy) -> Recommendation:
        return await recommend(engine=self.engine, key=key, params=params, policy=policy)

    on_thread = recommend

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


__all__: Sequence[str] = ("EngineReads", "Read", "Reader", "ReadsClosed", "read", "reads_for", "recommend")
