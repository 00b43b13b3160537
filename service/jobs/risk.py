"""What each job uses against what it is given: its risk in the jobs list, and which jobs a pin would
put below what they use (issue 34).

A pinned value replaces the computed one as is, with no OOM backoff (rule O2), so a memory limit
pinned below what a job uses gets it killed on every run, and a CPU limit pinned below what it uses
throttles it. What a job uses is read from its newest ``PEAK_RUNS`` stored runs (clean or not, the
runs the job view plots): per container the highest memory peak and the highest CPU p95.

Risk flags of a job (``job_summaries.risk``, sorted on, highest first):

- ``BELOW_PEAK`` (4): a container's memory limit comes from a pin and is below its peak;
- ``OOM_BACKOFF`` (2): a container's newest runs were OOM-suspect (rule S13);
- ``THROTTLED`` (1): a container's CPU limit is enforced (rule S17) and below its CPU p95.

A saving the job would make only by running below what it uses is no saving: the summary leaves the
memory saving unknown when a pinned memory limit is below the peak, and the CPU saving when a pinned
CPU limit is below the p95.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import orjson
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from service.keys import ScopeKey
from service.overrides import service as overrides_service
from service.sizing.answer import Answer
from service.sizing.service import pins8
from service.tables import Job, Run, RunContainer

#: the newest runs per job its use is read from (the job view plots the same runs)
PEAK_RUNS = 60
BELOW_PEAK, OOM_BACKOFF, THROTTLED = 4, 2, 1
LEVELS = ((BELOW_PEAK, "critical"), (OOM_BACKOFF, "high"), (THROTTLED, "warn"))
_RANK = {"org": 1, "repo": 2, "workflow": 3, "job": 4}

_jobs = Job.__table__  # type: ignore[attr-defined]
_runs = Run.__table__  # type: ignore[attr-defined]
_containers = RunContainer.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Usage:
    """One container's use over its job's newest runs."""

    memory_peak_bytes: int
    cpu_p95_millicores: float
    runs: int


def scope_where(key: ScopeKey) -> list[ColumnElement[bool]]:
    """The jobs under a scope: its org, and each lower level it names."""
    where = [_jobs.c.org == key.org]
    for column, value in ((_jobs.c.repo, key.repo), (_jobs.c.workflow, key.workflow), (_jobs.c.job, key.job)):
        if value:
            where.append(column == value)
    return where


async def usage(
    *, conn: AsyncConnection, job_ids: Sequence[int] | None = None, scope: ScopeKey | None = None
) -> dict[int, dict[str, Usage]]:
    """Per job (of ``job_ids``, or under ``scope``) and container: the highest memory peak and CPU
    p95 of the job's newest ``PEAK_RUNS`` runs, and in how many of them the container ran."""
    if job_ids is not None:
        jobs: Any = _runs.c.job_id.in_(list(job_ids))
    else:
        assert scope is not None
        jobs = _runs.c.job_id.in_(select(_jobs.c.id).where(*scope_where(scope)))
    ranked = (
        select(
            _runs.c.id,
            _runs.c.job_id,
            func.row_number()
            .over(partition_by=_runs.c.job_id, order_by=(_runs.c.finished_at.desc(), _runs.c.id.desc()))
            .label("n"),
        )
        .where(jobs)
        .subquery()
    )
    stmt = (
        select(
            ranked.c.job_id,
            _containers.c.name,
            func.max(_containers.c.memory_peak_bytes),
            func.max(_containers.c.cpu_p95),
            func.count(),
        )
        .join_from(ranked, _containers, _containers.c.run_pk == ranked.c.id)
        .where(ranked.c.n <= PEAK_RUNS)
        .group_by(ranked.c.job_id, _containers.c.name)
    )
    out: dict[int, dict[str, Usage]] = {}
    for job_id, name, peak, p95, runs in await conn.execute(stmt):
        out.setdefault(job_id, {})[name] = Usage(int(peak), float(p95), int(runs))
    return out


# --------------------------------------------------------------------------- a job's risk


@dataclass(frozen=True)
class ContainerRisk:
    """One container of a job's summary: its answer, what its newest run ran with, what it uses."""

    name: str
    memory_limit_bytes: int
    memory_limit_source: str
    cpu_request_millicores: int
    cpu_limit_millicores: int
    cpu_limit_source: str
    cpu_enforced: bool
    ran_with_memory_limit_bytes: int | None
    ran_with_cpu_request_millicores: float | None
    peak_memory_bytes: int | None
    cpu_p95_millicores: float | None
    oom_consecutive: int
    below_peak: bool
    throttled: bool

    @property
    def flags(self) -> int:
        return BELOW_PEAK * self.below_peak | OOM_BACKOFF * (self.oom_consecutive > 0) | THROTTLED * self.throttled


def assess(
    answer: Answer, used: Mapping[str, Usage], ran_with: Mapping[str, tuple[int | None, float | None]]
) -> list[ContainerRisk]:
    """Each container of ``answer`` against what it uses (``used``) and what its newest run ran with
    (``ran_with``: name -> (memory limit, CPU request))."""
    out = []
    for c in answer.containers:
        u = used.get(c.name)
        mem_pinned = c.memory.source.limit != "algorithm"
        cpu_pinned = c.cpu.source.limit != "algorithm"
        memory_limit, cpu_request = ran_with.get(c.name, (None, None))
        out.append(
            ContainerRisk(
                name=c.name,
                memory_limit_bytes=c.memory.limit_bytes,
                memory_limit_source=c.memory.source.limit,
                cpu_request_millicores=c.cpu.request_millicores,
                cpu_limit_millicores=c.cpu.limit_millicores,
                cpu_limit_source=c.cpu.source.limit,
                cpu_enforced=c.cpu.enforced,
                ran_with_memory_limit_bytes=memory_limit,
                ran_with_cpu_request_millicores=cpu_request,
                peak_memory_bytes=None if u is None else u.memory_peak_bytes,
                cpu_p95_millicores=None if u is None else u.cpu_p95_millicores,
                oom_consecutive=c.oom.consecutive,
                below_peak=u is not None and mem_pinned and c.memory.limit_bytes < u.memory_peak_bytes,
                throttled=u is not None
                and (c.cpu.enforced or cpu_pinned)
                and c.cpu.limit_millicores < u.cpu_p95_millicores,
            )
        )
    return out


def flags_of(containers: Iterable[ContainerRisk]) -> int:
    flags = 0
    for c in containers:
        flags |= c.flags
    return flags


def level(flags: int | None) -> str | None:
    """The highest level a job's flags reach: ``critical``, ``high``, ``warn``, or None."""
    return next((name for bit, name in LEVELS if (flags or 0) & bit), None)


def reasons(flags: int | None) -> list[str]:
    """The flags as words, highest first."""
    names = {BELOW_PEAK: "pinned below peak", OOM_BACKOFF: "OOM backoff", THROTTLED: "throttled"}
    return [names[bit] for bit, _ in LEVELS if (flags or 0) & bit]


def dump(containers: Sequence[ContainerRisk]) -> str:
    return orjson.dumps([asdict(c) for c in containers]).decode()


def load(text: str | None) -> list[dict[str, Any]]:
    """The stored containers of a summary (``dump``'s JSON), as dicts; [] when not stored yet."""
    if not text:
        return []
    got: list[dict[str, Any]] = orjson.loads(text)
    return got


# --------------------------------------------------------------------------- a pin before it is written


@dataclass(frozen=True)
class PinRisk:
    """A container a pin would put below what it uses."""

    key: ScopeKey
    container: str
    field: Literal["memory_limit", "cpu_limit"]
    pinned: int  #: bytes or millicores
    used: float  #: the highest memory peak (bytes) or CPU p95 (millicores) of the newest runs
    runs: int


class _Pin:
    """An override row as the resolution reads it (``sizing.pins8``), for the pin being checked."""

    def __init__(self, key: ScopeKey, pins: overrides_service.Pins) -> None:
        self.scope, self.org, self.repo, self.workflow, self.job = key.scope, key.org, key.repo, key.workflow, key.job
        for column in overrides_service.FIELDS:
            setattr(self, column, getattr(pins, column))


async def pin_check(*, conn: AsyncConnection, key: ScopeKey, pins: overrides_service.Pins) -> tuple[int, list[PinRisk]]:
    """How many jobs the override at ``key`` would cover, and each container it would put below
    what it uses: a memory limit below the peak, a CPU limit below the CPU p95. Per job each field
    resolves as the answer resolves it (rules O2-O3), with ``pins`` in place of whatever is stored at
    ``key`` now: a more specific pin of the same field, or a more specific request above the
    limit, keeps the new pin from applying."""
    rows = list(
        await conn.execute(
            select(_jobs.c.id, _jobs.c.org, _jobs.c.repo, _jobs.c.workflow, _jobs.c.job).where(*scope_where(key))
        )
    )
    if not rows or (pins.memory_limit_bytes is None and pins.cpu_limit_millicores is None):
        return len(rows), []
    stored = [
        o
        for o in await overrides_service.of_org(conn=conn, org=key.org)
        if (o.org, o.repo, o.workflow, o.job) != (key.org, key.repo, key.workflow, key.job)
    ]
    candidate = _Pin(key, pins)
    rank = _RANK[key.scope]
    used = await usage(conn=conn, scope=key)
    found: list[PinRisk] = []
    for row in rows:
        job = ScopeKey(row.org, row.repo, row.workflow, row.job)
        values, ranks = _resolve([*stored, candidate], job)
        for field, request, limit in (("memory_limit", 2, 3), ("cpu_limit", 0, 1)):
            if ranks[limit] != rank or values[limit] < 0:
                continue  # a more specific pin of the limit wins, or the new pin does not set it
            if ranks[request] > rank and values[request] > values[limit]:
                continue  # rule O3: a more specific request above it lifts the limit
            for name, u in sorted(used.get(row.id, {}).items()):
                observed = u.memory_peak_bytes if field == "memory_limit" else u.cpu_p95_millicores
                if values[limit] < observed:
                    found.append(PinRisk(job, name, field, values[limit], observed, u.runs))  # type: ignore[arg-type]
    found.sort(key=lambda r: (-r.used / max(r.pinned, 1), r.key.org, r.key.repo, r.key.workflow, r.key.job))
    return len(rows), found


def _resolve(overrides: Sequence[Any], key: ScopeKey) -> tuple[list[int], list[int]]:
    """Rule O2 for one job: per field (``overrides_service.FIELDS`` order) the most specific pin's
    value (-1: none) and its scope's rank (0: none)."""
    pinned = pins8(overrides_service.applicable_of(overrides, key))
    return list(pinned[:4]), list(pinned[4:])
