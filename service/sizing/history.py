"""What one job's answer is computed from (rules S3, S4, S11, S15): the window of runs and the
newest node memory, read with a few index range scans on a bare connection."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from service.keys import ScopeKey
from service.tables import Job, Run, RunContainer

#: the clean runs a window must reach back to, at least, for the core to tell the phase (rule S4)
_PHASE_SAMPLES = 3


@dataclass
class HistoryRun:
    id: int
    clean: bool
    pod_memory_peak_bytes: int | None
    #: rows with RunContainer's stats columns, by container name
    containers: dict[str, Any] = field(default_factory=dict)
    #: how long the run took, in seconds (rule E11), or -1 when it was posted without ``started_at``
    seconds: float = -1.0

    def pod_memory(self) -> int:
        """Rule S11: the reported pod peak, else the sum of the containers' peaks."""
        if self.pod_memory_peak_bytes is not None:
            return self.pod_memory_peak_bytes
        return sum(c.memory_peak_bytes for c in self.containers.values())


def run_seconds(started_at: datetime | None, finished_at: datetime) -> float:
    """A run's duration as the efficient policy reads it (rule E11): -1 when it reported no start."""
    return -1.0 if started_at is None else max(0.0, (finished_at - started_at).total_seconds())


@dataclass
class History:
    clean_samples: int = 0
    #: newest first (rule S3): every run from the oldest of the newest max(runs, 3) clean runs on
    #: (enough clean runs for the core to tell the phase, S4), or all runs when none is clean
    window: list[HistoryRun] = field(default_factory=list)
    newest_node_memory_bytes: int | None = None


# The read path of one sizing answer: three statements, built once, run on a bare connection
# (no ORM identity map, no per-request statement construction). Each is an index range scan:
# jobs by uq_jobs_key, runs by ix_runs_job_clean_history / ix_runs_job_history, containers by
# uq_run_containers_run_name (overrides: overrides.applicable, by uq_overrides_scope), whatever the
# size of the history.
_runs = Run.__table__  # type: ignore[attr-defined]
_containers = RunContainer.__table__  # type: ignore[attr-defined]
_jobs = Job.__table__  # type: ignore[attr-defined]
_NEWEST_FIRST = (_runs.c.finished_at.desc(), _runs.c.id.desc())

_SUMMARY = select(
    _jobs.c.id,
    select(func.count())
    .select_from(_runs)
    .where(_runs.c.job_id == _jobs.c.id, _runs.c.clean)
    .scalar_subquery()
    .label("clean_samples"),
    select(_runs.c.node_memory_bytes)
    .where(_runs.c.job_id == _jobs.c.id, _runs.c.node_memory_bytes.is_not(None))
    .order_by(*_NEWEST_FIRST)
    .limit(1)
    .scalar_subquery()
    .label("node_memory_bytes"),
).where(
    _jobs.c.org == bindparam("org"),
    _jobs.c.repo == bindparam("repo"),
    _jobs.c.workflow == bindparam("workflow"),
    _jobs.c.job == bindparam("job"),
)

_newest_clean = (
    select(_runs.c.finished_at, _runs.c.id)
    .where(_runs.c.job_id == bindparam("job_id"), _runs.c.clean)
    .order_by(*_NEWEST_FIRST)
    .limit(bindparam("runs"))
    .subquery("newest_clean")
)
#: the oldest of the newest ``runs`` clean runs: the window starts there (rule S3)
_BOUNDARY = (
    select(_newest_clean.c.finished_at, _newest_clean.c.id)
    .order_by(_newest_clean.c.finished_at, _newest_clean.c.id)
    .limit(1)
    .subquery("boundary")
)
_WINDOW_COLUMNS = (
    _runs.c.id,
    _runs.c.clean,
    _runs.c.pod_memory_peak_bytes,
    _runs.c.started_at,  # rule E11: the run's duration
    _runs.c.finished_at,
    _containers.c.name,
    _containers.c.cpu_peak,
    _containers.c.cpu_p99,
    _containers.c.cpu_p95,
    _containers.c.cpu_p75,
    _containers.c.cpu_p50,
    _containers.c.cpu_avg,
    _containers.c.memory_peak_bytes,
    _containers.c.memory_limit_bytes,
    _containers.c.oom_suspect,
    _containers.c.oom_killed,  # the efficient policy's kills (service.sizing.priors)
    _containers.c.oom_kill_events,
)
_ALL_RUNS = (
    select(*_WINDOW_COLUMNS)
    .join_from(_runs, _containers, _containers.c.run_pk == _runs.c.id)
    .where(_runs.c.job_id == bindparam("job_id"))
    .order_by(*_NEWEST_FIRST, _containers.c.position)
)
_WINDOW = (
    select(*_WINDOW_COLUMNS)
    .join_from(_runs, _containers, _containers.c.run_pk == _runs.c.id)
    # a row comparison, not an OR: one index range on (job_id, finished_at, id)
    .join(_BOUNDARY, tuple_(_runs.c.finished_at, _runs.c.id) >= tuple_(_BOUNDARY.c.finished_at, _BOUNDARY.c.id))
    .where(_runs.c.job_id == bindparam("job_id"))
    .order_by(*_NEWEST_FIRST, _containers.c.position)
)


async def load_history(
    *, conn: AsyncConnection, key: ScopeKey, runs: int, need_node_memory: bool, every_run_when_short: bool = False
) -> tuple[int | None, History]:
    """The job's id (None for a job never seen) and what its answer is computed from. With
    ``every_run_when_short`` (the efficient policy, whose samples include runs S2 calls unclean, E1)
    a job with fewer than ``runs`` clean runs is read whole."""
    history = History()
    summary = (
        await conn.execute(_SUMMARY, {"org": key.org, "repo": key.repo, "workflow": key.workflow, "job": key.job})
    ).first()
    if summary is None:
        return None, history
    job_id, history.clean_samples, node_memory = summary
    if need_node_memory:
        history.newest_node_memory_bytes = node_memory
    short = history.clean_samples == 0 or (every_run_when_short and history.clean_samples < runs)
    window = _ALL_RUNS if short else _WINDOW
    rows = await conn.execute(window, {"job_id": job_id, "runs": max(runs, _PHASE_SAMPLES)})
    current: HistoryRun | None = None
    for row in rows:
        if current is None or current.id != row.id:
            current = HistoryRun(
                id=row.id,
                clean=row.clean,
                pod_memory_peak_bytes=row.pod_memory_peak_bytes,
                seconds=run_seconds(row.started_at, row.finished_at),
            )
            history.window.append(current)
        current.containers[row.name] = row
    return job_id, history
