"""What the database's sessions are waiting on, logged when a background write times out (issue 38):
the next failure says which lock or wait held it, where "TimeoutError" alone said nothing."""

from __future__ import annotations

import asyncio
import logging

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a statement that ran out of time: asyncpg's own bound (``command_timeout``,
    raised as ``TimeoutError``) or the server's ``statement_timeout`` (SQLSTATE 57014, ``query_canceled``),
    as asyncpg raises it or as SQLAlchemy wraps it."""
    if isinstance(exc, TimeoutError | asyncpg.QueryCanceledError):
        return True
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "57014"


#: what the server's sessions are doing (``log_waits``): every one not idle, on this database or another
#: (the notification lock is the whole cluster's), with what it waits on and for whom. A statement's text
#: only for this database's sessions, its quoted literals and numbers replaced by ``?``
WAITS_SQL = text(r"""
SELECT a.pid, a.datname, a.backend_type, a.state,
    coalesce(a.wait_event_type || ':' || a.wait_event, '-') AS waiting,
    round(extract(epoch FROM clock_timestamp() - a.xact_start)::numeric, 1) AS xact_seconds,
    pg_blocking_pids(a.pid) AS blocked_by,
    (SELECT string_agg(DISTINCT l.locktype || ' ' || l.mode, ', ') FROM pg_locks l
        WHERE l.pid = a.pid AND NOT l.granted) AS lock_wanted,
    EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.granted AND l.locktype = 'object'
        AND l.database = 0 AND l.classid = 'pg_database'::regclass AND l.objid = 0) AS holds_notify_lock,
    CASE WHEN a.datname = current_database() THEN left(regexp_replace(regexp_replace(regexp_replace(
        a.query, '''[^'']*''', '?', 'g'), '\m\d+\M', '?', 'g'), '\s+', ' ', 'g'), 80) END AS query
FROM pg_stat_activity a
WHERE a.pid <> pg_backend_pid() AND a.state IS DISTINCT FROM 'idle'
    AND (a.backend_type = 'client backend' OR a.wait_event_type IS NOT NULL)
ORDER BY a.xact_start NULLS LAST
LIMIT :limit
""")


async def log_waits(
    maker: async_sessionmaker[AsyncSession], logger: logging.Logger, what: str, *, limit: int = 20
) -> None:
    """Log, after ``what`` (a write that timed out), what the server's sessions were doing just then:
    state, wait event, transaction age, blocking pids, locks wanted, who holds the notification lock
    (PostgreSQL; nothing on SQLite). Bounded (5 s); its own failure is logged, never raised."""
    try:
        async with asyncio.timeout(5), maker() as session:
            if session.get_bind().dialect.name != "postgresql":
                return
            rows = (await session.execute(WAITS_SQL, {"limit": limit})).all()
    except Exception as exc:
        logger.warning("%s; the database's sessions could not be sampled (%s)", what, type(exc).__name__)
        return
    shown = [
        f"pid {r.pid} {r.datname or '-'} {r.backend_type} {r.state or '-'} {r.waiting} xact {r.xact_seconds}s"
        + (f" blocked by {list(r.blocked_by)}" if r.blocked_by else "")
        + (f" wants {r.lock_wanted}" if r.lock_wanted else "")
        + (" holds the notification lock" if r.holds_notify_lock else "")
        + (f" [{r.query}]" if r.query else "")
        for r in rows
    ]
    logger.warning("%s; the database's sessions not idle: %s", what, "; ".join(shown) or "none")
