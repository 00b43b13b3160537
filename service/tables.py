"""SQLModel tables: ``jobs`` (one row per org/repo/workflow/job), ``runs`` (one finished CI run of a
job), ``run_containers`` (the six CPU stats, memory peak/limit and OOM fields per container),
``overrides``, ``job_summaries`` and ``analyses``. Datetimes are stored as naive UTC on every
database, so ordering and comparison behave the same on SQLite and PostgreSQL; the API speaks
RFC 3339 with ``Z``."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlmodel import Field as SQLField
from sqlmodel import SQLModel

from service.wire import NAME_MAX, utcnow

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
SQLModel.metadata = MetaData(naming_convention=NAMING_CONVENTION)

#: An autoincrementing 64-bit key that stays SQLite's rowid alias.
PK = BigInteger().with_variant(Integer(), "sqlite")

#: An autoincrementing 64-bit key that stays SQLite's rowid alias.

# --------------------------------------------------------------------------- tables


class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("org", "repo", "workflow", "job", name="uq_jobs_key"),)

    id: int | None = SQLField(default=None, sa_column=Column(PK, primary_key=True, autoincrement=True))
    org: str = SQLField(sa_column=Column(String(NAME_MAX), nullable=False))
    repo: str = SQLField(sa_column=Column(String(NAME_MAX), nullable=False))
    workflow: str = SQLField(sa_column=Column(String(NAME_MAX), nullable=False))
    job: str = SQLField(sa_column=Column(String(NAME_MAX), nullable=False))
    created_at: datetime = SQLField(default_factory=utcnow, sa_column=Column(DateTime(), nullable=False))
    # The latest recommendation's totals over its containers, for the fleet headroom gauges.
    fleet_cpu_request_millicores: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    fleet_cpu_observed_millicores: float | None = SQLField(default=None, sa_column=Column(Float(), nullable=True))
    fleet_memory_request_bytes: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    fleet_memory_observed_bytes: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    fleet_updated_at: datetime | None = SQLField(default=None, sa_column=Column(DateTime(), nullable=True))


class Run(SQLModel, table=True):
    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("job_id", "run_id", name="uq_runs_job_run_id"),
        # "newest N runs of one job" (rule S3) and "newest N clean runs" (S5) are range scans:
        Index("ix_runs_job_history", "job_id", "finished_at", "id"),
        Index("ix_runs_job_clean_history", "job_id", "clean", "finished_at", "id"),
    )

    id: int | None = SQLField(default=None, sa_column=Column(PK, primary_key=True, autoincrement=True))
    job_id: int = SQLField(sa_column=Column(PK, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False))
    run_id: str = SQLField(sa_column=Column(String(NAME_MAX), nullable=False))
    started_at: datetime | None = SQLField(default=None, sa_column=Column(DateTime(), nullable=True))
    finished_at: datetime = SQLField(sa_column=Column(DateTime(), nullable=False))
    ingested_at: datetime = SQLField(default_factory=utcnow, sa_column=Column(DateTime(), nullable=False))
    node_memory_bytes: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    pod_memory_peak_bytes: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    clean: bool = SQLField(sa_column=Column(Boolean(), nullable=False))
    content_hash: str = SQLField(sa_column=Column(String(64), nullable=False))


class RunContainer(SQLModel, table=True):
    __tablename__ = "run_containers"
    __table_args__ = (UniqueConstraint("run_pk", "name", name="uq_run_containers_run_name"),)

    id: int | None = SQLField(default=None, sa_column=Column(PK, primary_key=True, autoincrement=True))
    run_pk: int = SQLField(sa_column=Column(PK, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False))
    position: int = SQLField(sa_column=Column(Integer(), nullable=False))
    name: str = SQLField(sa_column=Column(String(NAME_MAX), nullable=False))
    cpu_peak: float = SQLField(sa_column=Column(Float(), nullable=False))
    cpu_p99: float = SQLField(sa_column=Column(Float(), nullable=False))
    cpu_p95: float = SQLField(sa_column=Column(Float(), nullable=False))
    cpu_p75: float = SQLField(sa_column=Column(Float(), nullable=False))
    cpu_p50: float = SQLField(sa_column=Column(Float(), nullable=False))
    cpu_avg: float = SQLField(sa_column=Column(Float(), nullable=False))
    memory_peak_bytes: int = SQLField(sa_column=Column(BigInteger(), nullable=False))
    memory_limit_bytes: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    cpu_request_millicores: float | None = SQLField(default=None, sa_column=Column(Float(), nullable=True))
    oom_killed: bool | None = SQLField(default=None, sa_column=Column(Boolean(), nullable=True))
    oom_kill_events: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    oom_suspect: bool = SQLField(sa_column=Column(Boolean(), nullable=False))


class RunGrowth(SQLModel, table=True):
    """One growth event of one container of a run (issue 40): the growth guard's attempt to raise the
    container's memory limit in place, and its outcome. Stored with its run (and deleted with it)."""

    __tablename__ = "run_growths"
    # (run_pk, position, seq): one event once, and the index a run's events (and cascades) read by
    __table_args__ = (UniqueConstraint("run_pk", "position", "seq", name="uq_run_growths_run_pk"),)

    id: int | None = SQLField(default=None, sa_column=Column(PK, primary_key=True, autoincrement=True))
    run_pk: int = SQLField(sa_column=Column(PK, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False))
    #: the container's position in its run (``run_containers.position``)
    position: int = SQLField(sa_column=Column(Integer(), nullable=False))
    #: the event's place among the container's events, oldest first
    seq: int = SQLField(sa_column=Column(Integer(), nullable=False))
    at: datetime = SQLField(sa_column=Column(DateTime(), nullable=False))
    from_bytes: int = SQLField(sa_column=Column(BigInteger(), nullable=False))
    to_bytes: int = SQLField(sa_column=Column(BigInteger(), nullable=False))
    #: grown, deferred, infeasible, too_late or error
    result: str = SQLField(sa_column=Column(String(16), nullable=False))


class Override(SQLModel, table=True):
    """A pin at one scope; levels below the scope are stored as '' (names are never empty, I3)."""

    __tablename__ = "overrides"
    __table_args__ = (UniqueConstraint("org", "repo", "workflow", "job", name="uq_overrides_scope"),)

    id: int | None = SQLField(default=None, sa_column=Column(PK, primary_key=True, autoincrement=True))
    scope: str = SQLField(sa_column=Column(String(16), nullable=False))
    org: str = SQLField(sa_column=Column(String(NAME_MAX), nullable=False))
    repo: str = SQLField(default="", sa_column=Column(String(NAME_MAX), nullable=False))
    workflow: str = SQLField(default="", sa_column=Column(String(NAME_MAX), nullable=False))
    job: str = SQLField(default="", sa_column=Column(String(NAME_MAX), nullable=False))
    cpu_request_millicores: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    cpu_limit_millicores: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    memory_request_bytes: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    memory_limit_bytes: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    #: "seed" or "efficient" at this scope; NULL inherits from the scope above, at last the setting
    sizing_policy: str | None = SQLField(default=None, sa_column=Column(String(16), nullable=True))
    reason: str | None = SQLField(default=None, sa_column=Column(Text(), nullable=True))
    expires_at: datetime | None = SQLField(default=None, sa_column=Column(DateTime(), nullable=True))
    created_at: datetime = SQLField(default_factory=utcnow, sa_column=Column(DateTime(), nullable=False))
    updated_at: datetime = SQLField(default_factory=utcnow, sa_column=Column(DateTime(), nullable=False))
    updated_by: str = SQLField(sa_column=Column(String(NAME_MAX), nullable=False))
    version: int = SQLField(default=1, sa_column=Column(Integer(), nullable=False))


class FleetPrior(SQLModel, table=True):
    """Rule E6's state for one org (the core's ``prior_update``): how many of the org's jobs have a
    sample (a run without a kill, E1) and the highest container memory peak among those samples
    (-1: none yet). Updated by every ingested sample in the run's transaction (``runs.service``)."""

    __tablename__ = "fleet_priors"

    org: str = SQLField(sa_column=Column(String(NAME_MAX), primary_key=True))
    sampled_jobs: int = SQLField(sa_column=Column(BigInteger(), nullable=False))
    peak_bytes: int = SQLField(sa_column=Column(BigInteger(), nullable=False))
    updated_at: datetime = SQLField(default_factory=utcnow, sa_column=Column(DateTime(), nullable=False))


class JobState(SQLModel, table=True):
    """One job's build-path state (PostgreSQL; ``sizing/state.py``): counts over its stored runs, kept
    by every write of them so that the build path never scans a job's runs. ``clean_runs`` NULL marks
    a row to rebuild from the runs."""

    __tablename__ = "job_state"

    job_id: int = SQLField(sa_column=Column(PK, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True))
    #: one more with every write of the row
    version: int = SQLField(sa_column=Column(BigInteger(), nullable=False))
    #: the stored runs (retention prunes only jobs over its bound)
    runs: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    #: the stored clean runs (rule S4)
    clean_runs: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    #: the stored runs that are samples of the efficient policy (rule E1)
    samples: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    #: the newest run that reported its node's memory (rule S15), by (finished_at, id)
    node_memory_bytes: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    node_memory_at: datetime | None = SQLField(default=None, sa_column=Column(DateTime(), nullable=True))
    node_memory_run: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))


class JobSummary(SQLModel, table=True):
    """What the jobs list shows of one job, kept by ``services.jobs`` off the request path: its
    answer (the sizing service's, default parameters), what its newest run ran with, its runs and
    OOM kills in the window and the capacity it would save per day. Sorting 10,000 jobs by waste
    reads these rows; it never computes an answer per job per request."""

    __tablename__ = "job_summaries"
    __table_args__ = (Index("ix_job_summaries_stale", "refreshed_at"),)

    job_id: int = SQLField(sa_column=Column(PK, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True))
    phase: str = SQLField(sa_column=Column(String(16), nullable=False))
    override_scope: str = SQLField(sa_column=Column(String(16), nullable=False))
    oom_backoff: bool = SQLField(sa_column=Column(Boolean(), nullable=False))
    last_run_at: datetime | None = SQLField(default=None, sa_column=Column(DateTime(), nullable=True))
    window_runs: int = SQLField(sa_column=Column(Integer(), nullable=False))
    window_oom_kills: int = SQLField(sa_column=Column(Integer(), nullable=False))
    run_hours_per_day: float | None = SQLField(default=None, sa_column=Column(Float(), nullable=True))
    answer_cpu_request_millicores: int = SQLField(sa_column=Column(BigInteger(), nullable=False))
    answer_memory_limit_bytes: int = SQLField(sa_column=Column(BigInteger(), nullable=False))
    in_force_cpu_request_millicores: float | None = SQLField(default=None, sa_column=Column(Float(), nullable=True))
    in_force_memory_limit_bytes: int | None = SQLField(default=None, sa_column=Column(BigInteger(), nullable=True))
    saved_memory_gib_hours_per_day: float | None = SQLField(default=None, sa_column=Column(Float(), nullable=True))
    saved_cpu_core_hours_per_day: float | None = SQLField(default=None, sa_column=Column(Float(), nullable=True))
    refreshed_at: datetime = SQLField(sa_column=Column(DateTime(), nullable=False))
    #: when an override the answer applied expires (the summary is stale from then on)
    fresh_until: datetime | None = SQLField(default=None, sa_column=Column(DateTime(), nullable=True))
    #: bit flags (``jobs.risk``): 4 pinned memory limit below the peak, 2 OOM backoff, 1 throttled; NULL: 0
    risk: int | None = SQLField(default=None, sa_column=Column(Integer(), nullable=True))
    #: JSON, one entry per container: what it uses, ran with and is given (``jobs.risk.ContainerRisk``)
    containers: str | None = SQLField(default=None, sa_column=Column(Text(), nullable=True))


class Analysis(SQLModel, table=True):
    """A long computation run in the background (a fleet simulation, a backtest), polled by id."""

    __tablename__ = "analyses"

    id: str = SQLField(sa_column=Column(String(36), primary_key=True))
    kind: str = SQLField(sa_column=Column(String(32), nullable=False))
    status: str = SQLField(sa_column=Column(String(16), nullable=False))
    progress: float = SQLField(default=0.0, sa_column=Column(Float(), nullable=False))
    request: str = SQLField(sa_column=Column(Text(), nullable=False))
    result: str | None = SQLField(default=None, sa_column=Column(Text(), nullable=True))
    error: str | None = SQLField(default=None, sa_column=Column(Text(), nullable=True))
    created_by: str = SQLField(sa_column=Column(String(NAME_MAX), nullable=False))
    created_at: datetime = SQLField(default_factory=utcnow, sa_column=Column(DateTime(), nullable=False))
    updated_at: datetime = SQLField(default_factory=utcnow, sa_column=Column(DateTime(), nullable=False))
