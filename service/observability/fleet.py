"""Fleet totals: the latest recommendation of each job, summed for the headroom gauges.

Serving a recommendation only notes the job's totals in memory (no write on the build's start
path); a background task writes the notes to the ``jobs`` table every few seconds, then sums that
table (and counts the overrides) into the gauges, so the totals are right with any number of
workers. ``/metrics`` only renders: a scrape never reads or writes the database.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlmodel import col

from service.db import unit_of_work
from service.jobs.money import Prices
from service.observability.metrics import (
    DATABASE_ERRORS,
    FLEET_CPU,
    FLEET_JOBS,
    FLEET_MEMORY,
    FLEET_SAVING,
    OVERRIDES,
)
from service.tables import Job, JobSummary, Override
from service.wire import utcnow

log = logging.getLogger("ci_sizer.fleet")


@dataclass(frozen=True)
class JobTotals:
    cpu_request_millicores: int
    cpu_observed_millicores: float
    memory_request_bytes: int
    memory_observed_bytes: int


class FleetTracker:
    def __init__(self, prices: Prices | None = None) -> None:
        self.pending: dict[int, JobTotals] = {}
        #: turn the job summaries' savings into money for ``ci_sizer_fleet_saving_per_day``
        self.prices = prices or Prices()

    def note(self, job_id: int, totals: JobTotals) -> None:
        self.pending[job_id] = totals

    async def flush(self, maker: async_sessionmaker[AsyncSession]) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, {}
        now = utcnow()
        rows = [
            {
                "id": job_id,
                "fleet_cpu_request_millicores": t.cpu_request_millicores,
                "fleet_cpu_observed_millicores": t.cpu_observed_millicores,
                "fleet_memory_request_bytes": t.memory_request_bytes,
                "fleet_memory_observed_bytes": t.memory_observed_bytes,
                "fleet_updated_at": now,
            }
            for job_id, t in batch.items()
        ]
        try:
            async with unit_of_work(maker) as uow:
                await uow.session.execute(update(Job), rows)
        except Exception as exc:  # keep the notes for the next try; newer notes win
            DATABASE_ERRORS.inc()
            log.warning("fleet totals not written: %s", type(exc).__name__)
            self.pending = {**batch, **self.pending}


async def refresh_gauges(session: AsyncSession) -> None:
    """Set the gauges read from the database: overrides per scope and the fleet totals."""
    from service.keys import SCOPES

    counts = dict(
        (await session.execute(select(col(Override.scope), func.count()).group_by(col(Override.scope)))).all()
    )
    for scope in SCOPES:
        OVERRIDES.labels(scope=scope).set(counts.get(scope, 0))
    row = (
        await session.execute(
            select(
                func.count(col(Job.fleet_cpu_request_millicores)),
                func.coalesce(func.sum(col(Job.fleet_cpu_request_millicores)), 0),
                func.coalesce(func.sum(col(Job.fleet_cpu_observed_millicores)), 0),
                func.coalesce(func.sum(col(Job.fleet_memory_request_bytes)), 0),
                func.coalesce(func.sum(col(Job.fleet_memory_observed_bytes)), 0),
            )
        )
    ).one()
    jobs, cpu_req, cpu_obs, mem_req, mem_obs = (v or 0 for v in row)
    FLEET_JOBS.set(jobs)
    FLEET_CPU.labels(kind="recommended").set(float(cpu_req) / 1000)
    FLEET_CPU.labels(kind="observed").set(float(cpu_obs) / 1000)
    FLEET_MEMORY.labels(kind="recommended").set(float(mem_req))
    FLEET_MEMORY.labels(kind="observed").set(float(mem_obs))


async def refresh_saving(session: AsyncSession, prices: Prices) -> None:
    """Set ``ci_sizer_fleet_saving_per_day`` from the job summaries (the jobs list's totals)."""
    mem, cpu = (
        await session.execute(
            select(
                func.coalesce(func.sum(col(JobSummary.saved_memory_gib_hours_per_day)), 0.0),
                func.coalesce(func.sum(col(JobSummary.saved_cpu_core_hours_per_day)), 0.0),
            )
        )
    ).one()
    FLEET_SAVING.labels(resource="memory", currency=prices.currency).set(float(mem or 0) * prices.per_gib_hour)
    FLEET_SAVING.labels(resource="cpu", currency=prices.currency).set(float(cpu or 0) * prices.per_core_hour)


async def flush_and_refresh(
    tracker: FleetTracker, write_maker: async_sessionmaker[AsyncSession], maker: async_sessionmaker[AsyncSession]
) -> None:
    """The background task's pass: write the notes, then read the gauges back. A database that
    fails leaves the gauges as they were and counts an error (the pool's timeouts bound the wait)."""
    await tracker.flush(write_maker)
    try:
        async with maker() as session:
            await refresh_gauges(session)
            await refresh_saving(session, tracker.prices)
    except Exception as exc:
        DATABASE_ERRORS.inc()
        log.warning("gauges not refreshed: %s", type(exc).__name__)
