"""One job's sizing answer read as one function with a raw ``sqlite3`` connection (SQLite only).

The route reads a miss with three or four statements through SQLAlchemy on aiosqlite, a dozen trips to
the connection's thread and back (docs/performance.md, "Cold GET on SQLite"). Here the whole read (the
overrides that bear on the job, its summary, its window, and for an efficient answer with no sample the
org's prior) is one function, ``read``, in one transaction as the route's (``BEGIN`` ... ``ROLLBACK``:
one snapshot): on the event loop or on a thread where that read gives way (``sizing/inline.py``), or
in one hop to a pooled aiosqlite connection's thread for an in-memory database (``recommend``).

The statements are the route's own (``overrides.service._APPLICABLE``, ``history._SUMMARY``,
``history._WINDOW``/``_ALL_RUNS``, ``priors._READ``), compiled once for SQLite, and their columns go
through the same SQLAlchemy result processors (booleans, datetimes), so the rows read as the route's
rows do; the answer is computed by the same ``sizing.service.recommendation``. A parity test
(tests/test_fastpath_sqlite.py) checks both give the same answers.
"""

from __future__ import annotations

import sqlite3
from collections import namedtuple
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import Select

from service import core
from service.keys import ScopeKey
from service.overrides.service import _APPLICABLE, PinRow, is_expired
from service.sizing import history as history_module
from service.sizing import priors
from service.sizing.history import _PHASE_SAMPLES, History, HistoryRun, run_seconds
from service.sizing.params import SizingParams
from service.sizing.service import Policy, Recommendation, choose, reads_samples, recommendation, window_runs
from service.wire import utcnow

_DIALECT = sqlite_dialect.dialect()


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


def prepare(db: sqlite3.Connection) -> None:
    """Each statement run once where no row matches: the schema read and the statements compiled into the
    connection's statement cache now, not in a miss (a first miss read in 1.4-2.3 ms compiling, 0.25 after)."""
    nothing = {"org": "", "repo": "", "workflow": "", "job": ""}
    db.execute("BEGIN")
    try:
        for statement, values in ((_APPLICABLE_SQL, nothing), (_SUMMARY_SQL, nothing), (_PRIOR_SQL, {"org": ""})):
            statement.raw(db, **values)
        for statement in (_WINDOW_SQL, _ALL_RUNS_SQL):
            statement.raw(db, job_id=-1, runs=1)
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")


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


__all__: Sequence[str] = ("Read", "finish", "history_of", "prepare", "read", "recommend")
