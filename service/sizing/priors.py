"""What the ``efficient`` policy (rules E1-E13, issue 25) reads beyond the seed's history: which runs
were killed, and the org's first-run prior (E6) in ``fleet_priors``.

A container is **killed** when it reports ``oom_killed``, ``oom_kill_events > 0`` or a peak above its
limit (``OOM_KILLED``); a run is killed when one of its containers is. Only killed runs are left out
of the efficient policy's samples (E1); S1's 95 % clause alone leaves a run a sample.

The prior is the core's ``prior_update`` state per org, ``(sampled_jobs, peak_bytes)``, updated by one
upsert in the ingesting run's transaction (``update_statement``) and read with one primary-key read
(``read``) only when an efficient answer has no sample to size from. Both are order-free (a count of
jobs with a sample, and a maximum), so the state is the same whatever order runs are ingested in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import and_, bindparam, case, exists, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from service import core
from service.core._reference import EFFICIENT_MIN_WINDOW as EFFICIENT_MIN_WINDOW  # E2, as both cores
from service.tables import FleetPrior, Run, RunContainer
from service.wire import utcnow

_runs = Run.__table__  # type: ignore[attr-defined]
_containers = RunContainer.__table__  # type: ignore[attr-defined]
_priors = FleetPrior.__table__  # type: ignore[attr-defined]


def killed(row: Any) -> bool:
    """A container row (RunContainer's columns) that the kernel killed, or that ran past its limit."""
    limit = row.memory_limit_bytes
    return (
        bool(row.oom_killed) or (row.oom_kill_events or 0) > 0 or (limit is not None and row.memory_peak_bytes > limit)
    )


def oom_code(row: Any) -> int:
    """The core's ``oom`` column for one container: OOM_KILLED, OOM_NEAR_LIMIT (S1's clause alone) or OOM_NONE."""
    if killed(row):
        return core.OOM_KILLED
    return core.OOM_NEAR_LIMIT if row.oom_suspect else core.OOM_NONE


def run_code(clean: bool, rows: Iterable[Any]) -> int:
    """The core's ``clean`` column for one run: RUN_CLEAN (S2), RUN_KILLED, else RUN_NEAR_LIMIT."""
    if clean:
        return core.RUN_CLEAN
    return core.RUN_KILLED if any(killed(r) for r in rows) else core.RUN_NEAR_LIMIT


def has_sample(runs: Iterable[Any]) -> bool:
    """Whether any of a job's runs (``HistoryRun``) is a sample of the efficient policy (E1)."""
    return any(run_code(r.clean, r.containers.values()) != core.RUN_KILLED for r in runs)


# ----------------------------------------------------------------------------- the stored prior

_READ = select(_priors.c.sampled_jobs, _priors.c.peak_bytes).where(_priors.c.org == bindparam("org"))


async def read(*, conn: AsyncConnection, org: str) -> tuple[int, int]:
    """The org's prior state (``core.PRIOR_EMPTY`` when none of its runs was a sample yet)."""
    row = (await conn.execute(_READ, {"org": org})).first()
    return core.PRIOR_EMPTY if row is None else (int(row.sampled_jobs), int(row.peak_bytes))


def _killed_container() -> Any:
    c = _containers
    return or_(
        c.c.oom_killed.is_(True),
        c.c.oom_kill_events > 0,
        and_(c.c.memory_limit_bytes.is_not(None), c.c.memory_peak_bytes > c.c.memory_limit_bytes),
    )


#: another sample of the same job already stored: this run is not its job's first sample. The kill
#: test is a scalar subquery per run (an index probe of its containers): as an EXISTS under the OR,
#: PostgreSQL planned it as a hash of every killed container in the table, a sequential scan per ingest
_KILLED_RUN = (
    select(func.max(case((_killed_container(), 1), else_=0)))
    .where(_containers.c.run_pk == _runs.c.id)
    .scalar_subquery()
)
_OTHER_SAMPLE = exists(
    select(1)
    .select_from(_runs)
    .where(
        _runs.c.job_id == bindparam("job_id"),
        _runs.c.id != bindparam("run_pk"),
        or_(_runs.c.clean, func.coalesce(_KILLED_RUN, 0) == 0),
    )
)


def _update(dialect: str) -> Any:
    """INSERT the org's first sample, or ON CONFLICT (org) DO UPDATE with ``prior_update``'s arithmetic:
    one more sampled job unless the job had a sample already, the higher peak."""
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(_priors)
    stmt = insert.values(
        org=bindparam("org"), sampled_jobs=1, peak_bytes=bindparam("peak"), updated_at=bindparam("now")
    )
    higher = func.greatest if dialect == "postgresql" else func.max  # SQLite's two-argument max()
    return stmt.on_conflict_do_update(
        index_elements=["org"],
        set_={
            "sampled_jobs": _priors.c.sampled_jobs + case((_OTHER_SAMPLE, 0), else_=1),
            "peak_bytes": higher(_priors.c.peak_bytes, stmt.excluded.peak_bytes),
            "updated_at": stmt.excluded.updated_at,
        },
    )


UPDATE = {name: _update(name) for name in ("postgresql", "sqlite")}


def sample_peak(clean: bool, containers: Sequence[Any]) -> int:
    """What a stored run adds to the prior: its highest container peak, or -1 when it was killed (E1)."""
    if not containers or run_code(clean, containers) == core.RUN_KILLED:
        return -1
    return max(int(c.memory_peak_bytes) for c in containers)


def update_params(
    *, org: str, job_id: int, run_pk: int, clean: bool, containers: Sequence[Any], now: Any
) -> dict[str, Any] | None:
    """The parameters of ``UPDATE`` for one stored run, or None when the run was killed (E1: a killed
    run leaves the prior as it is). ``containers``: the rows stored with the run."""
    peak = sample_peak(clean, containers)
    if peak < 0:
        return None
    return {"org": org, "job_id": job_id, "run_pk": run_pk, "peak": peak, "now": now}


async def record(
    *, conn: AsyncConnection, org: str, job_id: int, run_pk: int, clean: bool, containers: Sequence[Any]
) -> None:
    """Rule E6's update for one newly stored run, in the caller's transaction: one upsert, none for a killed run."""
    params = update_params(org=org, job_id=job_id, run_pk=run_pk, clean=clean, containers=containers, now=utcnow())
    if params is not None:
        await conn.execute(UPDATE[conn.dialect.name], params)
