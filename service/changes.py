"""Telling every worker (and every replica) that sizing answers went stale.

A write that changes what an answer is computed from calls ``publish`` inside its transaction.
On PostgreSQL that is ``pg_notify``, which is delivered when, and only if, the transaction
commits; ``ChangeFeed`` holds one listening connection per worker and invalidates the in-process
``AnswerCache``.

The build path's POST of a run (``runs/fastpath.py``) does not notify in its own transaction: every
transaction that notifies takes one lock for the whole database at its commit and holds it until the
commit is flushed to disk, so concurrent runs' commits queued behind each other, a disk flush each,
instead of sharing one (issue 38). It commits first and hands its job to the worker's ``Notifier``,
which sends one notification for every job committed meanwhile, in a transaction of its own that does
not wait for the disk (a notification is never durable anyway: it is delivered at the commit, and a
server that crashes drops every listening connection, which distrusts the caches). The POST answers
once its run is committed, without waiting for that notification (a round trip or two, and the
POST's slowest answers: docs/performance.md); a worker killed in the millisecond between a commit
and its batch leaves that run unannounced, as it did before the POST stopped waiting, and now after
its 201 too. While that connection is down, the cache trusts nothing (every request reads the
database) and it is rebuilt empty once the feed is back. On SQLite there is no feed: the writer's
own process invalidates after its commit, and with several workers a short TTL bounds how long
another worker can serve an answer from before a write (``CI_SIZER_SIZING_CACHE_TTL_SECONDS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
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
#: the most a notification's payload holds here (PostgreSQL refuses 8000 bytes and over)
PAYLOAD_BYTES = 7000
log = logging.getLogger("ci_sizer.changes")


async def publish(session: AsyncSession, key: ScopeKey | None, origin: str) -> None:
    """Within the writing transaction: the answers of job ``key`` (``None``: of every job) change.
    ``origin`` names the writing process's cache, which invalidates itself after the commit."""
    if session.get_bind().dialect.name != "postgresql":
        return
    changed: object = ALL if key is None else [key.org, key.repo, key.workflow, key.job]
    payload = orjson.dumps({"origin": origin, "changed": changed}).decode()
    await session.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": payload})


def payloads(origin: str, keys: Iterable[ScopeKey], limit: int = PAYLOAD_BYTES) -> list[str]:
    """Notifications naming ``keys`` (``{"origin", "jobs": [[org, repo, workflow, job], ...]}``),
    each within ``limit`` bytes (PostgreSQL's bound is 8000)."""
    head = len(orjson.dumps({"origin": origin, "jobs": []}))
    out: list[str] = []
    batch: list[list[str]] = []
    size = head
    for key in keys:
        item = [key.org, key.repo, key.workflow, key.job]
        grown = len(orjson.dumps(item)) + 1
        if batch and size + grown > limit:
            out.append(orjson.dumps({"origin": origin, "jobs": batch}).decode())
            batch, size = [], head
        batch.append(item)
        size += grown
    if batch:
        out.append(orjson.dumps({"origin": origin, "jobs": batch}).decode())
    return out


def apply(cache: AnswerCache, payload: str) -> None:
    """Invalidate what a notification names; the writer's own notifications are skipped (it
    invalidated after its commit, and a second invalidation would only cost a recomputation).
    A notification names one job or all (``changed``, from ``publish``) or several (``jobs``, from
    a ``Notifier``); a worker of a release before ``jobs`` finds no ``changed`` in it and
    invalidates everything, which is safe."""
    try:
        message = orjson.loads(payload)
        if message["origin"] == cache.origin:
            return
        if "jobs" in message:
            keys = [ScopeKey(org, repo, workflow, job) for org, repo, workflow, job in message["jobs"]]
            for key in keys:
                cache.invalidate(key)
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


#: one statement, its own transaction: the notifications, and a commit that does not wait for the disk
#: (``set_config`` local to the statement's transaction, so nothing is left on the pooled connection)
NOTIFY_STATEMENT = (
    "SELECT set_config('synchronous_commit', 'off', true), count(pg_notify($1::text, p)) FROM unnest($2::text[]) AS p"
)


class Notifier:
    """One per worker on PostgreSQL: announces the jobs whose runs the build path committed, in
    batches (see the module's doc). ``note`` returns a future done once the job's notification is
    committed (or its sending failed: the job then stays pending for the next try)."""

    def __init__(self, pool: Any, origin: str, *, retry_seconds: float = 0.5) -> None:
        self.pool = pool  #: the lean asyncpg pool (``service.pgpool.Pool``)
        self.origin = origin
        self.retry_seconds = retry_seconds
        self._pending: dict[ScopeKey, None] = {}
        self._done: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()
        #: notifications sent, and statements that sent them (a batch), for tests and the bench
        self.sent = 0
        self.batches = 0

    def note(self, key: ScopeKey) -> asyncio.Future[None]:
        """``key``'s answers changed (its run is committed): announce it in the next batch."""
        self._pending[key] = None
        if self._done is None or self._done.done():
            self._done = asyncio.get_running_loop().create_future()
        self._wake.set()
        return self._done

    async def run(self) -> None:
        """Until cancelled: send what is pending, one statement at a time; what is noted while one
        is in flight goes in the next."""
        while True:
            await self._wake.wait()
            if not await self.flush():
                await asyncio.sleep(self.retry_seconds)

    async def flush(self) -> bool:
        """Send what is pending now; False when that failed (it stays pending)."""
        self._wake.clear()
        keys, self._pending = self._pending, {}
        done, self._done = self._done, None
        if not keys:
            if done is not None and not done.done():
                done.set_result(None)
            return True
        sent = False
        try:
            messages = payloads(self.origin, keys)
            async with self.pool.acquire() as conn:
                await conn.fetchrow(NOTIFY_STATEMENT, CHANNEL, messages)
            sent = True
            self.sent += len(messages)
            self.batches += 1
            return True
        except Exception as exc:  # the runs are stored: try again, and let their answers go
            log.warning("sizing changes not announced (%s); retrying", type(exc).__name__)
            return False
        finally:
            if not sent:  # failed or cancelled: pending again, for the next try or the last flush
                for key in keys:
                    self._pending.setdefault(key, None)
                self._wake.set()
            if done is not None and not done.done():
                done.set_result(None)
