"""Telling every worker (and every replica) that sizing answers went stale.

A write that changes what an answer is computed from calls ``publish`` inside its transaction.
On PostgreSQL that is ``pg_notify``, which is delivered when, and only if, the transaction
commits; ``ChangeFeed`` holds one listening connection per worker and invalidates the in-process
``AnswerCache``. While that connection is down, the cache trusts nothing (every request reads the
database) and it is rebuilt empty once the feed is back. On SQLite there is no feed: the writer's
own process invalidates after its commit, and with several workers a short TTL bounds how long
another worker can serve an answer from before a write (``CI_SIZER_SIZING_CACHE_TTL_SECONDS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

from service.cache import AnswerCache
from service.keys import ScopeKey
from service.observability.metrics import CHANGE_FEED_UP

CHANNEL = "ci_sizer_changes"
ALL = "*"
log = logging.getLogger("ci_sizer.changes")


async def publish(session: AsyncSession, key: ScopeKey | None, origin: str) -> None:
    """Within the writing transaction: the answers of job ``key`` (``None``: of every job) change.
    ``origin`` names the writing process's cache, which invalidates itself after the commit."""
    if session.get_bind().dialect.name != "postgresql":
        return
    changed: object = ALL if key is None else [key.org, key.repo, key.workflow, key.job]
    payload = orjson.dumps({"origin": origin, "changed": changed}).decode()
    await session.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": payload})


def apply(cache: AnswerCache, payload: str) -> None:
    """Invalidate what a notification names; the writer's own notifications are skipped (it
    invalidated after its commit, and a second invalidation would only cost a recomputation)."""
    try:
        message = orjson.loads(payload)
        if message["origin"] == cache.origin:
            return
        changed = message["changed"]
        if changed == ALL:
            cache.invalidate_all()
            return
        org, repo, workflow, job = changed
        cache.invalidate(ScopeKey(org, repo, workflow, job))
    except (orjson.JSONDecodeError, ValueError, TypeError, KeyError):
        cache.invalidate_all()  # not ours to understand: be safe


class ChangeFeed:
    """Listens on PostgreSQL for changes committed anywhere and applies them to ``cache``."""

    def __init__(
        self,
        cache: AnswerCache,
        database_url: str,
        *,
        heartbeat_seconds: float = 5.0,
        retry_seconds: float = 1.0,
        connect: Callable[[str], Awaitable[Any]] = asyncpg.connect,
    ) -> None:
        self.cache = cache
        self.dsn = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.connect = connect  #: opens the listening connection (asyncpg's ``connect``)
        self.heartbeat_seconds = heartbeat_seconds
        self.retry_seconds = retry_seconds
        self.listening = asyncio.Event()
        self.up = CHANGE_FEED_UP.labels(channel=CHANNEL)
        self.up.set(0)
        cache.trusted = False  # until the first LISTEN is in place

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        apply(self.cache, payload)

    async def run(self) -> None:
        """Until cancelled: connect, LISTEN, check the connection every heartbeat; on any failure
        distrust the cache, wait, and start over."""
        delay = self.retry_seconds
        while True:
            conn = None
            lost = asyncio.Event()

            def on_lost(_conn: Any, lost: asyncio.Event = lost) -> None:
                self.cache.trusted = False  # at once: notifications may be missed from here on
                self.up.set(0)
                lost.set()

            # asyncio.timeout, never asyncio.wait_for: on Python 3.11 wait_for drops a cancellation
            # that lands as the awaited call completes (it returns its result instead), and this
            # loop then went on heartbeating after its cancellation, holding the shutdown (issue 39)
            try:
                async with asyncio.timeout(5):
                    conn = await self.connect(self.dsn)
                conn.add_termination_listener(on_lost)
                await conn.add_listener(CHANNEL, self._on_notify)
                # changes committed while nobody listened are unknown: start from nothing
                self.cache.invalidate_all()
                self.cache.trusted = True
                self.listening.set()
                self.up.set(1)
                delay = self.retry_seconds
                log.info("listening for sizing changes")
                while True:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.heartbeat_seconds):
                            await lost.wait()
                    if lost.is_set():
                        raise ConnectionError("the listening connection closed")
                    async with asyncio.timeout(self.heartbeat_seconds):
                        await conn.fetchval("SELECT 1")
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                # nobody cancelled this task: on 3.11 a timeout that expires as its call completes
                # leaves a stray cancellation behind; the feed starts over rather than ending
                log.warning("sizing change feed down (stray cancellation); answers are read from the database")
            except Exception as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # a cancellation that a library turned into its own error: the task was still told to stop
                    raise asyncio.CancelledError from exc
                log.warning("sizing change feed down (%s); answers are read from the database", type(exc).__name__)
            finally:
                self.cache.trusted = False
                self.listening.clear()
                self.up.set(0)
                if conn is not None:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(2):
                            await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
