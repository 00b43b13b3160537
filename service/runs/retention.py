"""Retention: keep at most N newest runs per job (rule S3 order), pruned off the ingest path.

Ingest only notes which jobs got a new run; a background task prunes those jobs every few
seconds, so storage stays bounded however long the service runs and ingest never waits for it.
The notes live in memory, so a process that starts (after a crash, a deploy, or a pass that never
ran) first finds every job holding more than N runs from the database and notes it.
"""

from __future__ import annotations

import logging
import math
import time

from sqlalchemy import delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service import changes
from service.cache import AnswerCache
from service.db import unit_of_work
from service.dbwaits import is_timeout, log_waits
from service.keys import ScopeKey
from service.observability.metrics import DATABASE_ERRORS, RETENTION_BACKLOG, RETENTION_PRUNED
from service.sizing import state as job_state
from service.tables import Job, Run

log = logging.getLogger("ci_sizer.retention")
#: Runs deleted per statement and transaction: a bounded transaction (SQLite's write lock is held
#: briefly) and a fixed number of parameters, never a list of ids (asyncpg takes at most 32,767).
BATCH = 5000

_runs = Run.__table__  # type: ignore[attr-defined]
_jobs = Job.__table__  # type: ignore[attr-defined]


async def prune_job(*, session: AsyncSession, job_id: int, keep: int, limit: int = BATCH) -> int:
    """Delete up to ``limit`` runs of one job beyond its ``keep`` newest; returns how many went."""
    doomed = (
        select(_runs.c.id)
        .where(_runs.c.job_id == job_id)
        .order_by(_runs.c.finished_at.desc(), _runs.c.id.desc())
        .offset(keep)
        .limit(limit)
    )
    result = await session.execute(delete(_runs).where(_runs.c.id.in_(doomed)))
    gone = int(result.rowcount)  # type: ignore[attr-defined]
    if gone:  # the job's build-path state (PostgreSQL) no longer holds the pruned runs
        await job_state.rebuild(conn=await session.connection(), job_ids=[job_id])
    return gone


async def over_limit(*, session: AsyncSession, keep: int) -> dict[int, ScopeKey]:
    """Every job that holds more than ``keep`` runs."""
    counts = select(_runs.c.job_id).group_by(_runs.c.job_id).having(func.count() > keep).subquery()
    rows = await session.execute(
        select(_jobs.c.id, _jobs.c.org, _jobs.c.repo, _jobs.c.workflow, _jobs.c.job).join(
            counts, counts.c.job_id == _jobs.c.id
        )
    )
    return {row.id: ScopeKey(row.org, row.repo, row.workflow, row.job) for row in rows}


#: seconds between two counts of every job's runs (``over_limit``), which find the jobs over the limit
#: that no ingest noted: runs written outside the service, and at start the notes of a process that stopped
RESCAN_SECONDS = 300.0

# jobs whose build-path state (PostgreSQL) counts no more than ``keep`` runs, though more are stored
_UNDERSTATED = text(
    "SELECT job_id FROM job_state WHERE job_id = ANY(CAST(:ids AS bigint[])) AND clean_runs IS NOT NULL "
    "AND runs <= :keep"
)


class Pruner:
    def __init__(self, keep: int, *, rescan_seconds: float = RESCAN_SECONDS) -> None:
        self.keep = keep
        self.rescan_seconds = rescan_seconds
        #: jobs noted by ingest: they may be over the limit (their state says)
        self.pending: dict[int, ScopeKey] = {}
        #: jobs counted over the limit in the database: pruned whatever their state says
        self.found: dict[int, ScopeKey] = {}
        #: whether the jobs left over limit by an earlier process have been noted
        self.recovered = False
        self._scanned_at = -math.inf

    def note(self, job_id: int, key: ScopeKey) -> None:
        self.pending[job_id] = key

    async def recover(self, maker: async_sessionmaker[AsyncSession]) -> None:
        """Count every job's runs and note each over the limit (the notes of a process that stopped are
        lost with it, and runs written outside the service are noted by no ingest); say which ones
        nothing had noted, and which ones their build-path state undercounts."""
        async with maker() as session:
            found = await over_limit(session=session, keep=self.keep)
            understated: list[int] = []
            if found and (await session.connection()).dialect.name == "postgresql":
                rows = await session.execute(_UNDERSTATED, {"ids": list(found), "keep": self.keep})
                understated = [row[0] for row in rows]
        self._scanned_at = time.monotonic()
        unnoted = [job_id for job_id in found if job_id not in self.pending and job_id not in self.found]
        self.found.update(found)
        if unnoted and self.recovered:
            log.warning(
                "retention: %d job(s) over the limit of %d runs that no ingest noted (runs written outside the "
                "service?), e.g. %s; pruning them",
                len(unnoted),
                self.keep,
                _shown(found[unnoted[0]]),
            )
        elif found and not self.recovered:
            log.info("retention: %d job(s) over the limit found at start", len(found))
        if understated:
            log.warning(
                "retention: %d job(s) hold more runs than their build-path state counts (runs written outside the "
                "service), e.g. %s; their states are rebuilt as they are pruned",
                len(understated),
                _shown(found[understated[0]]),
            )
        self.recovered = True
        RETENTION_BACKLOG.set(len(self.found) + len(self.pending))

    async def _over_limit(
        self, maker: async_sessionmaker[AsyncSession], jobs: dict[int, ScopeKey]
    ) -> dict[int, ScopeKey]:
        """The noted jobs that may hold more than ``keep`` runs (on PostgreSQL their build-path state
        counts them, so a job under the bound costs no statement of its own); all of them on SQLite."""
        async with maker() as session:
            over = await job_state.over(conn=await session.connection(), job_ids=list(jobs), keep=self.keep)
        return jobs if over is None else {job_id: jobs[job_id] for job_id in over}

    async def run_once(
        self,
        maker: async_sessionmaker[AsyncSession],
        cache: AnswerCache,
        *,
        recover: bool = True,
        notifier: changes.Notifier | None = None,
    ) -> int:
        """Prune every noted job (the first pass with ``recover``, and one every ``rescan_seconds``, also
        the jobs counted over the limit); a job that fails stays noted for the next pass. Pruning can
        change a job's answer (its clean-run count, its window), so the job's cached answers are
        invalidated, here and, through the change feed, in other workers. ``ci_sizer_retention_backlog_jobs``
        is left at the number of jobs still known over the limit (failed, or found and not yet pruned).

        With a ``notifier`` (PostgreSQL) a pruned job is announced after its transaction commits, in the
        worker's batched notifications, as the build path's runs are (``changes.Notifier``): a ``pg_notify``
        inside the transaction would take the cluster's one notification lock at its commit and hold it
        through the commit's flush, behind every other notifying commit of the cluster and ahead of them
        (issue 38). A pass that fails on a timeout logs what the database's sessions were waiting on."""
        if recover and time.monotonic() - self._scanned_at >= (self.rescan_seconds if self.recovered else 0):
            try:
                await self.recover(maker)
            except Exception as exc:  # tried again at the next pass
                DATABASE_ERRORS.inc()
                log.warning("retention could not look for jobs over the limit: %s", type(exc).__name__)
        removed = failed = 0
        jobs, self.pending = self.pending, {}
        if jobs:
            try:
                jobs = await self._over_limit(maker, jobs)
            except Exception as exc:  # then each job is looked at, as without the check
                DATABASE_ERRORS.inc()
                log.warning("retention could not count the noted jobs' runs: %s", type(exc).__name__)
        found, self.found = self.found, {}
        jobs = {**jobs, **found}
        sampled = False  # the database's sessions, logged at the pass's first timeout
        for job_id, key in sorted(jobs.items()):
            try:
                while True:
                    async with unit_of_work(maker) as uow:
                        gone = await prune_job(session=uow.session, job_id=job_id, keep=self.keep)
                        if gone and notifier is None:  # (SQLite: nobody to tell; a no-op there)
                            await changes.publish(uow.session, key, cache.origin)
                    removed += gone
                    if gone:  # committed
                        cache.invalidate(key)
                        if notifier is not None:
                            notifier.note(key)
                    RETENTION_PRUNED.inc(gone)
                    if gone < BATCH:
                        break
            except Exception as exc:
                DATABASE_ERRORS.inc()
                log.warning("retention pass failed for a job: %s", type(exc).__name__)
                if is_timeout(exc) and not sampled:
                    sampled = True
                    await log_waits(maker, log, "retention pass timed out")
                (self.found if job_id in found else self.pending)[job_id] = key
                failed += 1
        RETENTION_BACKLOG.set(failed)
        if removed:
            log.info("retention removed %d run(s)", removed)
        return removed


def _shown(key: ScopeKey) -> str:
    return "/".join(p for p in (key.org, key.repo, key.workflow, key.job) if p)
