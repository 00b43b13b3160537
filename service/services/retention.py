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
from ..observability.metrics import DATABASE_ERRORS

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
        self.pending: set[int] = set()

    def note(self, job_id: int) -> None:
        self.pending.add(job_id)

    async def run_once(self, maker: async_sessionmaker[AsyncSession]) -> int:
        """Prune every noted job; a job that fails stays noted for the next pass."""
        removed = 0
        jobs, self.pending = self.pending, set()
        for job_id in sorted(jobs):
            try:
                async with maker() as session:
                    removed += await prune_job(session=session, job_id=job_id, keep=self.keep)
                    await session.commit()
            except Exception as exc:
                DATABASE_ERRORS.inc()
                log.warning("retention pass failed for a job: %s", type(exc).__name__)
                self.pending.add(job_id)
        if removed:
            log.info("retention removed %d run(s)", removed)
        return removed
