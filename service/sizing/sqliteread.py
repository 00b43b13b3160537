"""One job's sizing answer read in ONE hop to the SQLite connection's thread (SQLite only).

The route reads a miss with three or four statements through SQLAlchemy on aiosqlite, and aiosqlite
runs every step of each (``BEGIN``, execute, fetch, close, ``ROLLBACK``) as a separate trip to the
connection's thread and back to the event loop: about a dozen trips and 2.5-3.5 ms of a worker per miss,
which 32 queued connections turned into a cold p99 above 200 ms (docs/performance.md, "Cold GET on
SQLite"). Here the whole read (the overrides that bear on the job, its summary, its window, and for an
efficient answer with no sample the org's prior) runs as one function on that thread, with the raw
``sqlite3`` connection, in one transaction as the route's (``BEGIN`` ... ``ROLLBACK``: one snapshot).

The statements are the route's own (``overrides.service._APPLICABLE``, ``history._SUMMARY``,
``history._WINDOW``/``_ALL_RUNS``, ``priors._READ``), compiled once for SQLite, and their columns go
through the same SQLAlchemy result processors (booleans, datetimes), so the rows read as the route's
rows do; the answer is computed by the same ``sizing.service.recommendation``. A parity test
(tests/sizing/test_sqliteread.py) checks both give the same answers.
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
from service.sizing.history import _PHASE_SAMPLES, History, HistoryRun
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

    def rows(self, db: sqlite3.Connection, **values: Any) -> list[Any]:
        given = {**self.defaults, **values}
        raw = db.execute(self.sql, tuple(given[name] for name in self.order)).fetchall()
        processors = self.processors
        make = self.row._make
        if not any(processors):
            return [make(r) for r in raw]
        return [make([v if p is None else p(v) for p, v in zip(processors, r, strict=True)]) for r in raw]


_APPLICABLE_SQL = _Statement(_APPLICABLE)
_SUMMARY_SQL = _Statement(history_module._SUMMARY)
_WINDOW_SQL = _Statement(history_module._WINDOW)
_ALL_RUNS_SQL = _Statement(history_module._ALL_RUNS)
_PRIOR_SQL = _Statement(priors._READ)


class Read:
    """What one miss read: the applicable pins, the job's id and history, the org's prior (or None)."""

    __slots__ = ("history", "job_id", "pins", "prior")

    def __init__(
        self, pins: dict[str, PinRow], job_id: int | None, history: History, prior: tuple[int, int] | None
    ) -> None:
        self.pins, self.job_id, self.history, self.prior = pins, job_id, history, prior


def read(db: sqlite3.Connection, key: ScopeKey, params: SizingParams, policy: Policy) -> Read:
    """``sizing.service.recommend``'s reads, on the raw connection (run on its thread): in one
    transaction, as the route's connection reads them."""
    db.execute("BEGIN")
    try:
        return _read(db, key, params, policy)
    finally:
        db.execute("ROLLBACK")


def _read(db: sqlite3.Connection, key: ScopeKey, params: SizingParams, policy: Policy) -> Read:
    now = utcnow()
    pins = {
        row.scope: row
        for row in _APPLICABLE_SQL.rows(db, org=key.org, repo=key.repo, workflow=key.workflow, job=key.job)
        if not is_expired(row, now)
    }
    efficient = reads_samples(choose(pins, policy))
    history = History()
    summary = _SUMMARY_SQL.rows(db, org=key.org, repo=key.repo, workflow=key.workflow, job=key.job)
    if not summary:
        job_id = None
    else:  # ``history.load_history``, step by step
        job_id, history.clean_samples, node_memory = summary[0]
        if policy.max_memory is None:
            history.newest_node_memory_bytes = node_memory
        runs = window_runs(params, efficient)
        short = history.clean_samples == 0 or (efficient and history.clean_samples < runs)
        window = _ALL_RUNS_SQL if short else _WINDOW_SQL
        current: HistoryRun | None = None
        for row in window.rows(db, job_id=job_id, runs=max(runs, _PHASE_SAMPLES)):
            if current is None or current.id != row.id:
                current = HistoryRun(id=row.id, clean=row.clean, pod_memory_peak_bytes=row.pod_memory_peak_bytes)
                history.window.append(current)
            current.containers[row.name] = row
    prior: tuple[int, int] | None = None
    if efficient and not priors.has_sample(history.window):  # E6
        found = _PRIOR_SQL.rows(db, org=key.org)
        prior = core.PRIOR_EMPTY if not found else (int(found[0].sampled_jobs), int(found[0].peak_bytes))
    return Read(pins, job_id, history, prior)


async def recommend(*, engine: AsyncEngine, key: ScopeKey, params: SizingParams, policy: Policy) -> Recommendation:
    """``sizing.service.recommend`` with its reads in one hop to a pooled aiosqlite connection's thread.
    Faults are the route's: the engine's (connecting, the pool) and ``sqlite3.Error`` (a locked or broken
    database), which the caller treats as the route treats the engine's."""
    async with engine.connect() as conn:
        raw = await conn.get_raw_connection()
        aio = raw.driver_connection  # the aiosqlite.Connection
        found: Read = await aio._execute(_on_thread, aio, key, params, policy)  # type: ignore[union-attr]
    return recommendation(
        key=key,
        job_id=found.job_id,
        history=found.history,
        pins=found.pins,
        params=params,
        policy=policy,
        prior=found.prior,
    )


def _on_thread(aio: Any, key: ScopeKey, params: SizingParams, policy: Policy) -> Read:
    return read(aio._conn, key, params, policy)


__all__: Sequence[str] = ("Read", "read", "recommend")
