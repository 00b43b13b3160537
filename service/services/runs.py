"""Ingest of finished runs (rules I1-I5a, S1-S2)."""

from __future__ import annotations

import hashlib
import time
from array import array
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from .. import core
from ..errors import Conflict
from ..models import (
    STAT_NAMES,
    ContainerCreate,
    CpuStatsPublic,
    Job,
    Run,
    RunContainer,
    RunContainerPublic,
    RunCreate,
    RunPublic,
    to_rfc3339,
)
from ..observability.metrics import CORE_DURATION

Result = Literal["created", "duplicate"]


def is_oom_suspect(
    *,
    memory_peak_bytes: int,
    memory_limit_bytes: int | None,
    oom_killed: bool | None,
    oom_kill_events: int | None,
) -> bool:
    """Rule S1 (the 95% test in integers: peak >= 0.95 * limit  <=>  20 * peak >= 19 * limit)."""
    if oom_killed:
        return True
    if oom_kill_events is not None and oom_kill_events > 0:
        return True
    return memory_limit_bytes is not None and 20 * memory_peak_bytes >= 19 * memory_limit_bytes


def reduce_cpu(
    container: ContainerCreate,
) -> tuple[float, float, float, float, float, float]:
    """Rule I2: the six stats, computed by the core from samples, or as given."""
    if container.cpu_samples_millicores is not None:
        started = time.perf_counter()
        stats = core.six_stats(array("d", container.cpu_samples_millicores))
        CORE_DURATION.labels(operation="six_stats").observe(time.perf_counter() - started)
        return stats
    s = container.cpu_stats_millicores
    assert s is not None  # guaranteed by ContainerCreate's validator (rule I1)
    return s.peak, s.p99, s.p95, s.p75, s.p50, s.avg


@dataclass(frozen=True)
class PreparedRun:
    """A validated run reduced to what is stored, with its content hash (rule I4)."""

    body: RunCreate
    containers: list[dict[str, Any]]  # RunContainer columns, without run_pk
    clean: bool
    content_hash: str


def prepare(body: RunCreate) -> PreparedRun:
    containers: list[dict[str, Any]] = []
    canonical: list[dict[str, Any]] = []
    for position, c in enumerate(body.containers):
        stats = reduce_cpu(c)
        suspect = is_oom_suspect(
            memory_peak_bytes=c.memory_peak_bytes,
            memory_limit_bytes=c.memory_limit_bytes,
            oom_killed=c.oom_killed,
            oom_kill_events=c.oom_kill_events,
        )
        containers.append(
            {
                "position": position,
                "name": c.name,
                **{f"cpu_{k}": v for k, v in zip(STAT_NAMES, stats, strict=True)},
                "memory_peak_bytes": c.memory_peak_bytes,
                "memory_limit_bytes": c.memory_limit_bytes,
                "oom_killed": c.oom_killed,
                "oom_kill_events": c.oom_kill_events,
                "oom_suspect": suspect,
            }
        )
        canonical.append(
            {
                "name": c.name,
                "cpu": list(stats),
                "memory_peak_bytes": c.memory_peak_bytes,
                "memory_limit_bytes": c.memory_limit_bytes,
                "oom_killed": c.oom_killed,
                "oom_kill_events": c.oom_kill_events,
            }
        )
    document = {
        "started_at": to_rfc3339(body.started_at),
        "finished_at": to_rfc3339(body.finished_at),
        "node_memory_bytes": body.node_memory_bytes,
        "pod_memory_peak_bytes": body.pod_memory_peak_bytes,
        "containers": canonical,
    }
    digest = hashlib.sha256(orjson.dumps(document, option=orjson.OPT_SORT_KEYS)).hexdigest()
    clean = not any(c["oom_suspect"] for c in containers)  # rule S2
    return PreparedRun(body=body, containers=containers, clean=clean, content_hash=digest)


def run_public(body: RunCreate, run: Run, containers: list[RunContainer], result: Result) -> RunPublic:
    return RunPublic(
        org=body.org,
        repo=body.repo,
        workflow=body.workflow,
        job=body.job,
        run_id=run.run_id,
        finished_at=to_rfc3339(run.finished_at) or "",
        result=result,
        clean=run.clean,
        oom_suspect_containers=[c.name for c in containers if c.oom_suspect],
        containers=[
            RunContainerPublic(
                name=c.name,
                cpu_stats_millicores=CpuStatsPublic(**{k: getattr(c, f"cpu_{k}") for k in STAT_NAMES}),
                memory_peak_bytes=c.memory_peak_bytes,
                oom_suspect=c.oom_suspect,
            )
            for c in containers
        ],
    )


async def get_or_create_job(*, session: AsyncSession, org: str, repo: str, workflow: str, job: str) -> Job:
    """The job row; created on first sight. Raises IntegrityError when a concurrent insert won."""
    found = (
        await session.execute(
            select(Job).where(
                col(Job.org) == org,
                col(Job.repo) == repo,
                col(Job.workflow) == workflow,
                col(Job.job) == job,
            )
        )
    ).scalar_one_or_none()
    if found is not None:
        return found
    created = Job(org=org, repo=repo, workflow=workflow, job=job)
    session.add(created)
    await session.flush()
    return created


@dataclass(frozen=True)
class Ingested:
    run: RunPublic
    job_id: int


async def _ingest_once(session: AsyncSession, prepared: PreparedRun) -> Ingested:
    body = prepared.body
    job = await get_or_create_job(
        session=session,
        org=body.org,
        repo=body.repo,
        workflow=body.workflow,
        job=body.job,
    )
    assert job.id is not None
    existing = (
        await session.execute(select(Run).where(col(Run.job_id) == job.id, col(Run.run_id) == body.run_id))
    ).scalar_one_or_none()
    if existing is not None:  # rule I4
        if existing.content_hash != prepared.content_hash:
            raise Conflict(
                f"run {body.run_id!r} of this job was already stored with different content; nothing was changed"
            )
        stored = list(
            (
                await session.execute(
                    select(RunContainer)
                    .where(col(RunContainer.run_pk) == existing.id)
                    .order_by(col(RunContainer.position))
                )
            ).scalars()
        )
        return Ingested(run_public(body, existing, stored, "duplicate"), job.id)
    run = Run(
        job_id=job.id,
        run_id=body.run_id,
        started_at=body.started_at,
        finished_at=body.finished_at,
        node_memory_bytes=body.node_memory_bytes,
        pod_memory_peak_bytes=body.pod_memory_peak_bytes,
        clean=prepared.clean,
        content_hash=prepared.content_hash,
    )
    session.add(run)
    await session.flush()
    assert run.id is not None
    containers = [RunContainer(run_pk=run.id, **row) for row in prepared.containers]
    session.add_all(containers)
    await session.flush()
    return Ingested(run_public(body, run, containers, "created"), job.id)


async def ingest(*, session: AsyncSession, body: RunCreate, prepared: PreparedRun | None = None) -> Ingested:
    """Store one run unless it is already there (rule I4).

    Returns the run with ``result`` "created" or "duplicate"; raises ``Conflict`` for the same
    key with other content. A concurrent insert of the same job or run loses on the unique
    constraint; the transaction is then rolled back and the lookup repeated, so exactly one run
    is stored and the loser answers "duplicate" (or "conflict").
    """
    prepared = prepared or prepare(body)
    for _ in range(3):
        try:
            return await _ingest_once(session, prepared)
        except IntegrityError:
            await session.rollback()
    return await _ingest_once(session, prepared)
