"""Retention: keep at most N newest runs per job (rule S3 order), pruned off the ingest path.

Ingest only notes which jobs got a new run; a background task prunes those jobs every few
seconds, so storage stays bounded however long the service runs and ingest never waits for it.
"""

from __future__ import annotations

import logging

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlmodel import col

from ..models import Run
from ..observability.metrics import DATABASE_ERRORS, RETENTION_BACKLOG, RETENTION_PRUNED
from . import changes
from .cache import AnswerCache
from .overrides import ScopeKey

log = logging.getLogger("ci_sizer.retention")


async def prune_job(*, session: AsyncSession, job_id: int, keep: int) -> int:
    """Delete the runs of one job beyond its ``keep`` newest; returns how many went."""
    doomed = (
        select(col(Run.id))
        .where(col(Run.job_id) == job_id)
        .order_by(col(Run.finished_at).desc(), col(Run.id).desc())
        .offset(keep)
    )
    ids = list((await session.execute(doomed)).scalars())
    if ids:
        await session.execute(delete(Run).where(col(Run.id).in_(ids)))
    return len(ids)


class Pruner:
    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.pending: dict[int, ScopeKey] = {}

    def note(self, job_id: int, key: ScopeKey) -> None:
        self.pending[job_id] = key

    async def run_once(self, maker: async_sessionmaker[AsyncSession], cache: AnswerCache) -> int:
        """Prune every noted job; a job that fails stays noted for the next pass. Pruning can
        change a job's answer (its clean-run count, its window), so the job's cached answers
        are invalidated, here and, through the change feed, in other workers."""
        removed = failed = 0
        jobs, self.pending = self.pending, {}
        for job_id, key in sorted(jobs.items()):
            try:
                async with maker() as session:
                    gone = await prune_job(session=session, job_id=job_id, keep=self.keep)
                    if gone:
                        await changes.publish(session, key, cache.origin)
                    await session.commit()
                removed += gone
                RETENTION_PRUNED.inc(gone)
                if gone:
                    cache.invalidate(key)
            except Exception as exc:
                DATABASE_ERRORS.inc()
                log.warning("retention pass failed for a job: %s", type(exc).__name__)
                self.pending[job_id] = key
                failed += 1
        RETENTION_BACKLOG.set(failed)
        if removed:
            log.info("retention removed %d run(s)", removed)
        return removed
