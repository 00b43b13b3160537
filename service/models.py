"""SQLModel tables and the wire schemas of each resource.

Tables: ``jobs`` (one row per org/repo/workflow/job), ``runs`` (one finished CI run of a job),
``run_containers`` (the six CPU stats, memory peak/limit and OOM fields per container) and
``overrides``. Datetimes are stored as naive UTC on every database, so ordering and comparison
behave the same on SQLite and PostgreSQL; the API speaks RFC 3339 with ``Z``.

The wire schemas are plain pydantic models: the ingest body carries samples that are never
stored, so it is not the shape of any table.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    StringConstraints,
    Tag,
    WithJsonSchema,
    field_validator,
    model_validator,
)
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

from .quantity import parse_cpu_millicores, parse_memory_bytes

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
NAME_MAX = 200
MAX_MEMORY_BYTES = 1 << 50  # 1 PiB: bounds inputs so the integer arithmetic never overflows
MAX_CPU_MILLICORES = 1e9  # a million cores


def utcnow() -> datetime:
    """Now, as the naive UTC datetime the tables store."""
    return datetime.now(UTC).replace(tzinfo=None)


def to_naive_utc(value: datetime) -> datetime:
    """Naive UTC; a value whose UTC time falls outside years 1-9999 (``9999-12-31T23:59:59-01:00``)
    raises ``ValueError``, which a validator reports as a 422 naming the field."""
    if value.tzinfo is None:
        return value
    try:
        return value.astimezone(UTC).replace(tzinfo=None)
    except OverflowError:
        raise ValueError("is out of range once converted to UTC (years 1 to 9999)") from None


def to_rfc3339(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


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
    reason: str | None = SQLField(default=None, sa_column=Column(Text(), nullable=True))
    expires_at: datetime | None = SQLField(default=None, sa_column=Column(DateTime(), nullable=True))
    created_at: datetime = SQLField(default_factory=utcnow, sa_column=Column(DateTime(), nullable=False))
    updated_at: datetime = SQLField(default_factory=utcnow, sa_column=Column(DateTime(), nullable=False))
    updated_by: str = SQLField(sa_column=Column(String(NAME_MAX), nullable=False))
    version: int = SQLField(default=1, sa_column=Column(Integer(), nullable=False))


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


# --------------------------------------------------------------------------- wire: runs


#: The Unicode Bidi_Control characters (UAX #9): they reorder how a name is displayed, so a name
#: could read as another one ("Trojan Source", CVE-2021-42574).
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def name_problem(value: str) -> str | None:
    """Why ``value`` cannot be a name (rule I3), or None: control characters, bidirectional
    control characters, and lone surrogates (what invalid UTF-8 decodes to with
    ``surrogateescape``, and what a JSON ``\\udc80`` escape gives) are refused."""
    for ch in value:
        if ch in BIDI_CONTROLS:
            return "must not contain bidirectional control characters"
        category = unicodedata.category(ch)
        if category == "Cc":
            return "must not contain control characters"
        if category == "Cs":
            return "must be valid UTF-8 (no lone surrogates)"
    return None


def _no_control_chars(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _rfc3339_text(value: object) -> object:
    """Timestamps come as RFC 3339 strings; pydantic's lax mode would take a number as epoch seconds."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 date-time string such as 2026-11-20T10:07:12Z")
    return value


Timestamp = Annotated[datetime, BeforeValidator(_rfc3339_text)]

Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=NAME_MAX),
    AfterValidator(_no_control_chars),
]
CpuValue = Annotated[float, Field(strict=True, ge=0, le=MAX_CPU_MILLICORES, allow_inf_nan=False)]
MemoryBytes = Annotated[int, Field(strict=True, ge=0, le=MAX_MEMORY_BYTES)]
STAT_NAMES = ("peak", "p99", "p95", "p75", "p50", "avg")
CpuPercentile = Literal["peak", "p99", "p95", "p75", "p50", "avg"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class CpuStats(_Strict):
    """The six CPU stats of one container in one run, in millicores (rule I1)."""

    peak: CpuValue
    p99: CpuValue
    p95: CpuValue
    p75: CpuValue
    p50: CpuValue
    avg: CpuValue

    @model_validator(mode="after")
    def _ordered(self) -> CpuStats:
        if not (self.p50 <= self.p75 <= self.p95 <= self.p99 <= self.peak):
            raise ValueError("must satisfy p50 <= p75 <= p95 <= p99 <= peak")
        if self.avg > self.peak:
            raise ValueError("avg must not exceed peak")
        return self


class ContainerCreate(_Strict):
    name: Name
    cpu_samples_millicores: list[CpuValue] | None = Field(default=None, min_length=1, max_length=100_000)
    cpu_stats_millicores: CpuStats | None = None
    memory_peak_bytes: MemoryBytes = Field(description="peak working set (rule I5a), not memory.peak")
    memory_limit_bytes: Annotated[int, Field(strict=True, ge=1, le=MAX_MEMORY_BYTES)] | None = None
    cpu_request_millicores: CpuValue | None = Field(
        default=None, description="the CPU request in force during the run (for the jobs list's waste)"
    )
    oom_killed: Annotated[bool, Field(strict=True)] | None = None
    oom_kill_events: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)] | None = None

    @model_validator(mode="after")
    def _one_cpu_source(self) -> ContainerCreate:
        if (self.cpu_samples_millicores is None) == (self.cpu_stats_millicores is None):
            raise ValueError("give exactly one of cpu_samples_millicores or cpu_stats_millicores")
        return self


class RunCreate(_Strict):
    """One finished CI run of one job (``POST /api/v1/runs``)."""

    org: Name
    repo: Name
    workflow: Name
    job: Name
    run_id: Name
    started_at: Timestamp | None = None
    finished_at: Timestamp
    node_memory_bytes: Annotated[int, Field(strict=True, ge=1, le=MAX_MEMORY_BYTES)] | None = None
    pod_memory_peak_bytes: MemoryBytes | None = None
    containers: list[ContainerCreate] = Field(min_length=1, max_length=64)

    @field_validator("started_at", "finished_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else to_naive_utc(value)

    @model_validator(mode="after")
    def _consistent(self) -> RunCreate:
        names = [c.name for c in self.containers]
        if len(set(names)) != len(names):
            raise ValueError("container names must be unique within a run")
        if self.started_at is not None and self.started_at > self.finished_at:
            raise ValueError("started_at must not be after finished_at")
        return self


class CpuStatsPublic(BaseModel):
    peak: float
    p99: float
    p95: float
    p75: float
    p50: float
    avg: float


class RunContainerPublic(BaseModel):
    name: str
    cpu_stats_millicores: CpuStatsPublic
    memory_peak_bytes: int
    oom_suspect: bool


class RunPublic(BaseModel):
    org: str
    repo: str
    workflow: str
    job: str
    run_id: str
    finished_at: str
    result: Literal["created", "duplicate"]
    clean: bool
    oom_suspect_containers: list[str]
    containers: list[RunContainerPublic]


class RunsBatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # items are not typed as objects here: an item that is not one is answered by its index, like
    # any other bad run, instead of rejecting the whole batch
    runs: list[
        Annotated[Any, WithJsonSchema({"description": "a run (RunCreate); anything else is rejected by its index"})]
    ] = Field(
        min_length=1,
        max_length=500,
        description="up to 500 runs, each in the shape of RunCreate; each is validated on its own",
    )


class BatchItemPublic(BaseModel):
    index: int
    status: int
    result: Literal["created", "duplicate", "conflict", "rejected"]
    run: RunPublic | None = None
    problem: dict[str, Any] | None = None


class RunsBatchPublic(BaseModel):
    created: int
    duplicates: int
    conflicts: int
    rejected: int
    results: list[BatchItemPublic]


# --------------------------------------------------------------------------- wire: sizing


class SourcePublic(BaseModel):
    request: str
    limit: str


class CpuPublic(BaseModel):
    request: str
    limit: str
    request_millicores: int
    limit_millicores: int
    enforced: bool
    source: SourcePublic


class MemoryPublic(BaseModel):
    request: str
    limit: str
    request_bytes: int
    limit_bytes: int
    source: SourcePublic


class ObservedPublic(BaseModel):
    cpu_millicores: float | None
    memory_bytes: int | None


class OomPublic(BaseModel):
    consecutive: int
    backoff_factor: int
    capped: bool


class RunnerCeilingPublic(BaseModel):
    capped: bool = Field(description="a value was lowered to the org's runner ceiling")
    fields: list[str] = Field(description='which: "cpu.request", "cpu.limit", "memory.request", "memory.limit"')


class ContainerSizingPublic(BaseModel):
    name: str
    cpu: CpuPublic
    memory: MemoryPublic
    observed: ObservedPublic
    oom: OomPublic
    runner_ceiling: RunnerCeilingPublic | None = Field(
        default=None, description="present when runner ceilings are configured for the org"
    )


class SizingMetaPublic(BaseModel):
    phase: Literal["unknown", "learning", "confident"]
    clean_samples: int
    runs_analyzed: int
    runs: int
    buffer: int
    cpu_percentile: CpuPercentile
    override_scope: Literal["job", "workflow", "repo", "org", "global"]
    cpu_sizing_mode: Literal["observe", "enforce"]
    memory_qos: Literal["guaranteed", "burstable"]
    node_ceiling_bytes: int | None
    generated_at: str
    degraded: bool = Field(description="true when the database failed or was slow and this is a fallback")


class SizingPublic(BaseModel):
    org: str
    repo: str
    workflow: str
    job: str
    containers: list[ContainerSizingPublic]
    meta: SizingMetaPublic


# --------------------------------------------------------------------------- wire: stages (stage.md)

STAGE_MAX_ITEMS = 2000
STAGE_MAX_DEPTH = 32


def _quantity_text(v: Any, what: str) -> str:
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise ValueError(f"a {what} quantity: a string such as {'500m or 2' if what == 'CPU' else '500Mi or 1Gi'}")
    return v if isinstance(v, str) else repr(v)


def _bounded(v: Any, what: Literal["CPU", "memory"], *, positive: bool, maximum: float) -> int:
    """A typed quantity in base units (millicores, bytes; rounded up), within its bounds."""
    parse = parse_cpu_millicores if what == "CPU" else parse_memory_bytes
    value = parse(_quantity_text(v, what))
    if positive and value <= 0:
        raise ValueError("must be greater than zero")
    if value < 0:
        raise ValueError("must not be negative")
    if value > maximum:
        raise ValueError("is larger than any node")
    return value


def _stage_cpu(v: Any) -> int:
    """A CPU limit in whole millicores (rule H7); a bare number is cores."""
    return _bounded(v, "CPU", positive=True, maximum=MAX_CPU_MILLICORES)


def _stage_memory(v: Any) -> int:
    """A memory limit in whole MiB, rounded up (rule H7); a bare number is bytes."""
    return -(-_bounded(v, "memory", positive=True, maximum=MAX_MEMORY_BYTES) // (1 << 20))


_QUANTITY_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "number"}]}
StageCpu = Annotated[
    int,
    BeforeValidator(_stage_cpu),
    WithJsonSchema({**_QUANTITY_SCHEMA, "description": "CPU limit: 500m, 0.5, 2 (a bare number is cores)"}),
]
StageMemory = Annotated[
    int,
    BeforeValidator(_stage_memory),
    WithJsonSchema({**_QUANTITY_SCHEMA, "description": "memory limit: 500Mi, 1Gi, 129M (rounded up to whole MiB)"}),
]


class StageJobRef(_Strict):
    """The sized job a step runs as: with ``use_recommendations`` its recommended limits apply (H1)."""

    org: Name
    repo: Name
    workflow: Name
    job: Name
    container: Name | None = Field(default=None, description="which container of the job; optional when it has one")


#: A per-copy value in a looped step's ``cpu``/``memory`` (rule H8): ``<+matrix.KEY>`` or ``<+repeat.item>``.
STAGE_EXPRESSION = re.compile(r"<\+(?:matrix\.[A-Za-z_][A-Za-z0-9_]*|repeat\.item)>")
_STAGE_SCALAR = str | int | float | bool
_MATRIX_WORDS = ("exclude", "maxConcurrency", "nodeName")


def _matrix(v: dict[str, Any]) -> dict[str, Any]:
    """A Harness ``matrix``: axes (a key and a list of values), optional ``exclude`` (a list of
    partial combinations) and ``maxConcurrency`` (rule H8)."""
    axes = {k: a for k, a in v.items() if k not in _MATRIX_WORDS}
    if not axes:
        raise ValueError("a matrix needs at least one axis (a key with a list of values)")
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"axis {key!r}: a non-empty list of values")
        if any(isinstance(x, dict | list) or x is None for x in values):
            raise ValueError(f"axis {key!r}: values are strings or numbers")
    exclude = v.get("exclude", [])
    if not isinstance(exclude, list) or any(
        not isinstance(e, dict) or not e or any(isinstance(x, dict | list) or x is None for x in e.values())
        for e in exclude
    ):
        raise ValueError("exclude: a list of partial combinations ({axis: value, ...})")
    k = v.get("maxConcurrency")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError("maxConcurrency: a whole number of at least 1")
    if "nodeName" in v and not isinstance(v["nodeName"], str):
        raise ValueError("nodeName: a string")
    return v


StageMatrix = Annotated[
    dict[str, Any],
    AfterValidator(_matrix),
    WithJsonSchema(
        {
            "type": "object",
            "description": "axes (key: list of values), optional exclude (list of partial combinations) "
            "and maxConcurrency (default: every combination at once)",
            "properties": {
                "exclude": {"type": "array", "items": {"type": "object"}},
                "maxConcurrency": {"type": "integer", "minimum": 1},
            },
            "additionalProperties": {"type": "array"},
        }
    ),
]


class StageRepeat(_Strict):
    times: Annotated[int, Field(strict=True, ge=1)] | None = None
    items: list[_STAGE_SCALAR] | None = Field(default=None, min_length=1)
    maxConcurrency: Annotated[int, Field(strict=True, ge=1)] | None = None

    @model_validator(mode="after")
    def _one(self) -> StageRepeat:
        if (self.times is None) == (self.items is None):
            raise ValueError("repeat takes times or items")
        return self


class StageStrategy(_Strict):
    """A Harness looping strategy (rule H8): one of ``matrix``, ``parallelism`` or ``repeat``."""

    matrix: StageMatrix | None = None
    parallelism: Annotated[int, Field(strict=True, ge=1, le=STAGE_MAX_ITEMS)] | None = None
    repeat: StageRepeat | None = None

    @model_validator(mode="after")
    def _one(self) -> StageStrategy:
        if sum(x is not None for x in (self.matrix, self.parallelism, self.repeat)) != 1:
            raise ValueError("a strategy is one of matrix, parallelism or repeat")
        return self


class StageStep(_Strict):
    name: Name | None = None
    cpu: StageCpu | None = None
    memory: StageMemory | None = None
    background: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="its own container for the whole stage (rule H4)"
    )
    job: StageJobRef | None = None
    strategy: StageStrategy | None = Field(
        default=None, description="looped into copies (rules H8-H10; generation harness)"
    )
    non_ci: Annotated[bool, Field(strict=True)] = Field(
        default=False,
        description="an approval or a shell script run on the delegate: no container, no request (rule H11; "
        "generation harness)",
    )
    #: ``cpu``/``memory`` as written (the quantity text, or a ``<+matrix.KEY>`` expression): the
    #: harness generation rounds them as the source does (H14), and copies resolve expressions (H8)
    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_raw(cls, data: Any, handler: ModelWrapValidatorHandler[StageStep]) -> StageStep:
        raw: dict[str, Any] = {}
        if isinstance(data, dict):
            data = dict(data)
            for field in ("cpu", "memory"):
                value = data.get(field)
                if value is not None:
                    raw[field] = value
                if isinstance(value, str) and STAGE_EXPRESSION.fullmatch(value):
                    data[field] = None  # resolved per copy by the service
        step = handler(data)
        if raw:
            step._raw = raw
        return step

    @model_validator(mode="after")
    def _non_ci(self) -> StageStep:
        if self.non_ci and (self.background or self.job is not None or self._raw_given()):
            raise ValueError("a non-CI step has no container: no cpu, memory, background or job")
        return self

    def _raw_given(self) -> bool:
        return self.cpu is not None or self.memory is not None


class StageParallel(_Strict):
    name: Name | None = None
    parallel: list[StageItem] = Field(min_length=1, description="items run at once")


class StageGroup(_Strict):
    name: Name | None = None
    group: list[StageItem] = Field(min_length=1, description="items run in sequence")
    strategy: StageStrategy | None = Field(
        default=None, description="looped into copies (rules H8-H10; generation harness)"
    )


def _stage_item_tag(v: Any) -> str:
    if isinstance(v, dict):
        if "parallel" in v:
            return "parallel"
        if "group" in v:
            return "group"
        return "step"
    if isinstance(v, StageParallel):
        return "parallel"
    if isinstance(v, StageGroup):
        return "group"
    return "step"


StageItem = Annotated[
    Annotated[StageStep, Tag("step")] | Annotated[StageParallel, Tag("parallel")] | Annotated[StageGroup, Tag("group")],
    Discriminator(_stage_item_tag),
]


class StageOptions(_Strict):
    increase_default_resources: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="default step limits 1000m/3000Mi instead of 400m/500Mi (rule H1)"
    )
    conservative_addon_limits: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="the stage container is a flat 100m/100Mi (rule H3)"
    )
    use_recommendations: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="steps with a job reference take the sizer's recommended limits (rule H1)"
    )
    generation: Literal["doc", "harness"] = Field(
        default="doc",
        description="doc: the rules as the seed document states them (H1-H7); harness: as Harness CI's "
        "source does it (H8-H14: looping strategies, non-CI steps, its parallel divisor and rounding)",
    )
    disable_resource_optimization: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="CI_DISABLE_RESOURCE_OPTIMIZATION: every step's limit is its own (rule H12)"
    )
    extra_addon_resource: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="CI_EXTRA_ADDON_RESOURCE: the setup-addon init container is 300m/400Mi (rule H13)"
    )


class StageCompute(_Strict):
    stage: list[StageItem] = Field(min_length=1, description="the top-level items, run in sequence")
    options: StageOptions = Field(default_factory=StageOptions)


StageParallel.model_rebuild()
StageGroup.model_rebuild()
StageCompute.model_rebuild()


class StageCpuPublic(BaseModel):
    request: str
    limit: str
    request_millicores: int
    limit_millicores: int


class StageMemoryPublic(BaseModel):
    request: str
    limit: str
    request_bytes: int
    limit_bytes: int


class StageContainerPublic(BaseModel):
    cpu: StageCpuPublic
    memory: StageMemoryPublic


class StageTotalPublic(BaseModel):
    cpu: str
    cpu_millicores: int
    memory: str
    memory_bytes: int


class StageSourcePublic(BaseModel):
    cpu: Literal["declared", "recommendation", "default"]
    memory: Literal["declared", "recommendation", "default"]
    note: str | None = Field(default=None, description="why a job reference did not give the numbers")
    phase: Literal["unknown", "learning", "confident"] | None = Field(
        default=None, description="the referenced job's phase, when it was read"
    )
    override_scope: str | None = None


class StageStepPublic(BaseModel):
    name: str
    path: str = Field(description="JSON pointer of the step in the request body")
    background: bool
    own: StageTotalPublic = Field(
        description="the step's limit by rule H1 (declared, recommended or default), before H5 hands room back"
    )
    cpu: StageCpuPublic
    memory: StageMemoryPublic
    source: StageSourcePublic
    iteration: str | None = Field(
        default=None,
        description="which copy of a looped step or group (H8): each enclosing loop's index, outermost first",
    )


class StageNonCiPublic(BaseModel):
    name: str
    path: str = Field(description="JSON pointer of the step in the request body")
    iteration: str | None = None


class StageInitPublic(BaseModel):
    name: str
    cpu: StageCpuPublic
    memory: StageMemoryPublic


class StageLoopPublic(BaseModel):
    name: str
    path: str = Field(description="JSON pointer of the looped step or group in the request body")
    iteration: str | None = Field(default=None, description="which copy of an enclosing loop this loop is in")
    copies: int
    max_concurrency: int = Field(description="how many copies run at once: their requests are added up (H9)")
    request: StageTotalPublic = Field(description="the top max_concurrency copies by request, added up (H9)")


class StageDeciderPublic(BaseModel):
    path: str | None = Field(
        description="the top-level item that set the stage value; null for an all-background stage"
    )
    name: str | None
    explanation: str


class StagePublic(BaseModel):
    stage_container: StageContainerPublic = Field(description="the lite-engine container (H3)")
    total_with_background: StageTotalPublic = Field(description="stage container plus background containers (H4)")
    pod: dict[Literal["request", "limit"], StageTotalPublic] = Field(
        description="the pod's scheduling request and its sum of limits (H6)"
    )
    steps: list[StageStepPublic] = Field(description="every step in order, background steps included")
    non_ci_steps: list[StageNonCiPublic] = Field(
        default_factory=list, description="approvals and delegate scripts: no container, no request (H11)"
    )
    loops: list[StageLoopPublic] = Field(default_factory=list, description="every looped step or group (H8, H9)")
    init_containers: list[StageInitPublic] = Field(
        default_factory=list, description="the setup-addon init container (H13)"
    )
    decided_by: dict[Literal["cpu", "memory"], StageDeciderPublic]
    options: StageOptions
    degraded: bool = Field(description="recommendations were wanted but the database failed or was slow")


# --------------------------------------------------------------------------- wire: placement (placement.md)

PLACEMENT_MAX_NODES = 20_000
PLACEMENT_MAX_PODS_PER_NODE = 1000
PLACEMENT_MAX_CONTAINERS = 64
#: bounds a placement value so a node's sums stay far inside 64-bit integers in the compiled core
PLACEMENT_MAX_MEMORY_BYTES = 1 << 44  # 16 TiB
PLACEMENT_MAX_CPU_MILLICORES = 1 << 30


def _placement_cpu(v: Any) -> int:
    return _bounded(v, "CPU", positive=False, maximum=PLACEMENT_MAX_CPU_MILLICORES)


def _placement_memory(v: Any) -> int:
    return _bounded(v, "memory", positive=False, maximum=PLACEMENT_MAX_MEMORY_BYTES)


PlacementCpu = Annotated[
    int,
    BeforeValidator(_placement_cpu),
    WithJsonSchema({**_QUANTITY_SCHEMA, "description": "CPU: 500m, 0.5, 2 (a bare number is cores)"}),
]
PlacementMemory = Annotated[
    int,
    BeforeValidator(_placement_memory),
    WithJsonSchema({**_QUANTITY_SCHEMA, "description": "memory: 512Mi, 4Gi (a bare number is bytes)"}),
]
Count = Annotated[int, Field(strict=True, ge=0, le=1_000_000)]


#: an extended resource (``example.com/gpu``): a domain-prefixed name, as Kubernetes' IsExtendedResourceName
EXTENDED_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
ExtendedName = Annotated[str, Field(pattern=EXTENDED_NAME, max_length=253)]
ExtendedCount = Annotated[int, Field(strict=True, ge=0, le=1_000_000)]
PLACEMENT_MAX_EXTENDED = 8


def _extended_keys(v: Any) -> Any:
    """Kubernetes writes extended resources beside cpu and memory (``{"cpu": 1, "example.com/gpu": 2}``)."""
    if isinstance(v, dict) and any(isinstance(k, str) and "/" in k for k in v):
        out = {k: x for k, x in v.items() if not (isinstance(k, str) and "/" in k)}
        out["extended"] = {**out.get("extended", {}), **{k: x for k, x in v.items() if isinstance(k, str) and "/" in k}}
        return out
    return v


class Resources(_Strict):
    cpu: PlacementCpu | None = None
    memory: PlacementMemory | None = None
    extended: dict[ExtendedName, ExtendedCount] = Field(
        default_factory=dict,
        max_length=PLACEMENT_MAX_EXTENDED,
        description="extended resources by name (whole numbers); may also be written beside cpu and memory",
    )

    @model_validator(mode="before")
    @classmethod
    def _flat_extended(cls, v: Any) -> Any:
        return _extended_keys(v)


class PlacementContainer(_Strict):
    requests: Resources = Field(default_factory=Resources)
    limits: Resources = Field(
        default_factory=Resources, description="a limit without a request sets the request, per resource (PK7)"
    )
    restart_policy: Literal["Always"] | None = Field(
        default=None, description="init containers only: Always makes it a sidecar, which runs beside the pod (PK7)"
    )


class PlacementPod(_Strict):
    """A pod: its containers, or ``requests``/``limits`` as the shorthand for one container."""

    name: Name | None = None
    containers: list[PlacementContainer] | None = Field(default=None, min_length=1, max_length=PLACEMENT_MAX_CONTAINERS)
    init_containers: list[PlacementContainer] = Field(default_factory=list, max_length=PLACEMENT_MAX_CONTAINERS)
    overhead: Resources = Field(default_factory=Resources)
    requests: Resources | None = None
    limits: Resources | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> PlacementPod:
        if self.containers is not None and (self.requests is not None or self.limits is not None):
            raise ValueError("give either containers or the requests/limits shorthand, not both")
        if any(c.restart_policy is not None for c in self.container_list()):
            raise ValueError("restart_policy is for init containers (sidecars) only")
        return self

    def container_list(self) -> list[PlacementContainer]:
        if self.containers is not None:
            return self.containers
        return [PlacementContainer(requests=self.requests or Resources(), limits=self.limits or Resources())]


class PlacementStep(PlacementPod):
    """The pod (or Concourse step) to place; ``job`` takes its containers from the sizer."""

    step_type: Literal["task", "get", "put", "check", "resource-check"] = Field(
        default="task",
        description="get/put/check steps are never capped by limit-active-tasks (P4); check is a check step "
        "inside a build, resource-check the periodic check of a resource (PC3, PC8)",
    )
    inputs: list[Name] = Field(default_factory=list, max_length=1000, description="input volumes (P2)")
    job: StageJobRef | None = Field(
        default=None,
        description="requests and limits from the sizer's recommendation for this job (all its containers)",
    )
    job_cpu_limit: Literal["as-applied", "enforce"] = Field(
        default="as-applied",
        description="a job pod's CPU limits: as the runner applies them (none in observe mode, so limit-aware "
        "counts each container as a whole node), or the limits enforce mode would give (PK9)",
    )

    @model_validator(mode="after")
    def _job_or_resources(self) -> PlacementStep:
        if self.job is not None and (
            self.containers is not None or self.requests is not None or self.limits is not None
        ):
            raise ValueError("give either a job reference or the pod's resources, not both")
        return self


class PlacementNode(_Strict):
    """A Kubernetes node or a Concourse worker."""

    name: Name
    allocatable: Resources | None = Field(default=None, description="needed by the node scorers (P7-P10)")
    pods: list[PlacementPod] = Field(default_factory=list, max_length=PLACEMENT_MAX_PODS_PER_NODE)
    active_tasks: Count = 0
    containers: Count = 0
    volumes: Count = 0
    build_containers: Count = 0
    volumes_held: list[Name] = Field(
        default_factory=list, max_length=100_000, description="volume names on the worker (P2)"
    )
    max_active_tasks: Count = Field(
        default=0, description="head generation: the worker's own max active tasks, when > 0 (PC7)"
    )


STRATEGY_NAMES = (
    "volume-locality",
    "fewest-build-containers",
    "limit-active-tasks",
    "limit-active-containers",
    "limit-active-volumes",
    "random",
)
Strategy = Literal[
    "volume-locality",
    "fewest-build-containers",
    "limit-active-tasks",
    "limit-active-containers",
    "limit-active-volumes",
    "random",
]


#: Concourse's documented chain (the chaining example of its placement docs), by name.
CHAINS = {
    "concourse-chained": "limit-active-containers,limit-active-volumes,volume-locality,fewest-build-containers",
}


def _strategy_list(v: Any) -> Any:
    if isinstance(v, str):  # Concourse's own syntax: CONCOURSE_CONTAINER_PLACEMENT_STRATEGY=a,b,c
        return [s.strip() for s in CHAINS.get(v, v).split(",")]
    return v


NoInputStrategy = Literal[
    "fewest-build-containers", "limit-active-tasks", "limit-active-containers", "limit-active-volumes", "random"
]


class PlacementChain(_Strict):
    strategies: Annotated[list[Strategy], BeforeValidator(_strategy_list)] = Field(
        min_length=1,
        max_length=10,
        description="a list, a comma-separated string as Concourse takes it, or concourse-chained "
        "(limit-active-containers,limit-active-volumes,volume-locality,fewest-build-containers)",
    )
    max_active_tasks_per_worker: Count = 0
    max_active_containers_per_worker: Count = 0
    max_active_volumes_per_worker: Count = 0
    generation: Literal["doc", "v7.0", "head"] = Field(
        default="doc",
        description="doc: the seed document's filter chain (P1-P6); v7.0: Concourse 7.0's filter chain (PC1-PC3); "
        "head: Concourse's order-and-approve (PC4-PC8)",
    )
    no_input_strategies: Annotated[list[NoInputStrategy], BeforeValidator(_strategy_list)] | None = Field(
        default=None,
        max_length=10,
        description="head: the chain for get steps and checks inside a build; default the main chain (PC8)",
    )
    check_strategies: Annotated[list[NoInputStrategy], BeforeValidator(_strategy_list)] = Field(
        default=["random"], min_length=1, max_length=10, description="head: the chain for resource checks (PC8)"
    )


ScorerName = Literal[
    "least-allocated",
    "most-allocated",
    "limit-aware",
    "smallest-node",
    "largest-node",
    "requested-to-capacity-ratio",
    "balanced-allocation",
]
Weight = Annotated[int, Field(strict=True, ge=0, le=1 << 30)]


class ResourceWeights(_Strict):
    """The resources a scorer weighs; a resource left out is not scored. Kubernetes' scorers
    (least/most-allocated, requested-to-capacity-ratio, balanced-allocation) read a weight of 0 as 1 (PK5)."""

    cpu: Weight | None = None
    memory: Weight | None = None
    extended: dict[ExtendedName, Weight] = Field(default_factory=dict, max_length=PLACEMENT_MAX_EXTENDED)

    @model_validator(mode="before")
    @classmethod
    def _flat_extended(cls, v: Any) -> Any:
        return _extended_keys(v)


class ShapePoint(_Strict):
    utilization: Annotated[int, Field(strict=True, ge=0, le=100)]
    score: Annotated[int, Field(strict=True, ge=0, le=10)]


class ScorerSpec(_Strict):
    name: ScorerName
    weight: Annotated[int, Field(strict=True, ge=0, le=10_000)] = 1
    resources: ResourceWeights | None = Field(
        default=None,
        description="per-resource weights; default cpu 1, memory 1 (smallest/largest-node: cpu 1<<20, memory 1 per byte)",
    )
    missing_limit: Resources | None = Field(
        default=None, description="limit-aware: what a container without a limit counts; default the node's allocatable"
    )
    shape: list[ShapePoint] | None = Field(
        default=None,
        min_length=1,
        max_length=20,
        description="requested-to-capacity-ratio: utilization 0..100 to score 0..10, utilizations increasing (PK1)",
    )
    kubernetes: Literal["1.35", "1.36"] = Field(
        default="1.36",
        description="balanced-allocation: 1.35 scores the balance with the pod (PK3); 1.36 the change in "
        "balance the pod makes (PK4, kubernetes PR 135573)",
    )

    @model_validator(mode="after")
    def _shape(self) -> ScorerSpec:
        if (self.name == "requested-to-capacity-ratio") != (self.shape is not None):
            raise ValueError("shape is given for requested-to-capacity-ratio, and only for it")
        if self.shape is not None:
            us = [p.utilization for p in self.shape]
            if any(b <= a for a, b in itertools.pairwise(us)):
                raise ValueError("shape utilizations must be strictly increasing")
        return self


class PlacementProfile(_Strict):
    scorers: list[ScorerSpec] = Field(min_length=1, max_length=10)


ProfileChoice = Annotated[
    Annotated[Literal["spread", "limit-aware", "ci-bin-pack"], Tag("profile-name")]
    | Annotated[PlacementProfile, Tag("profile-scorers")],
    Discriminator(lambda v: "profile-name" if isinstance(v, str) else "profile-scorers"),
]


class PlacementAdvise(_Strict):
    nodes: list[PlacementNode] = Field(min_length=1, max_length=PLACEMENT_MAX_NODES)
    pod: PlacementStep
    chain: PlacementChain | None = Field(default=None, description="Concourse strategies in order (P1-P6)")
    profile: ProfileChoice | None = Field(
        default=None, description="Kubernetes scoring (P7-P10): a built-in profile's name or scorers with weights"
    )
    seed: Annotated[int, Field(strict=True, ge=0, le=2**63 - 1)] | None = Field(
        default=None, description="seeds the random pick among equals; the answer echoes the seed it used"
    )
    top: Annotated[int, Field(strict=True, ge=0, le=PLACEMENT_MAX_NODES)] = Field(
        default=50, description="how many ranked candidates the answer lists"
    )

    @model_validator(mode="after")
    def _chain_or_profile(self) -> PlacementAdvise:
        if (self.chain is None) == (self.profile is None):
            raise ValueError("give exactly one of chain (Concourse strategies) or profile (node scoring)")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        return self


class PlacementScorePublic(BaseModel):
    scorer: str
    weight: int
    raw: float = Field(description="before normalisation: P8's weighted limit ratio, P9's weighted size, P7's score")
    score: int = Field(description="0..100")
    weighted: int = Field(description="weight x score")


class PlacementCandidatePublic(BaseModel):
    name: str
    rank: int
    fits: bool
    total: int
    scores: list[PlacementScorePublic]


class PlacementDroppedPublic(BaseModel):
    name: str
    why: str


class PlacementStrategyPublic(BaseModel):
    strategy: str
    survivors: list[str]
    dropped: list[PlacementDroppedPublic]


class PlacementPodPublic(BaseModel):
    requests: StageTotalPublic = Field(description="as the fit filter counts them")
    limits: StageTotalPublic = Field(description="max(sum of containers, largest init container) + overhead")
    containers_without_limit: dict[Literal["cpu", "memory"], int]
    source: Literal["given", "recommendation", "default"]
    phase: Literal["unknown", "learning", "confident"] | None = None
    degraded: bool = False


class PlacementPublic(BaseModel):
    decision: Literal["place", "wait", "fail"] = Field(
        description="fail: Concourse v7.0 errors the step when a strategy leaves no worker (PC1)"
    )
    pick: str | None
    reason: str | None = Field(description="why the step waits, or how the pick was made")
    seed: int
    pod: PlacementPodPublic
    survivors: list[str] | None = Field(default=None, description="chain: the workers the pick was made from")
    chain: list[PlacementStrategyPublic] | None = Field(default=None, description="chain: each strategy's survivors")
    profile: list[ScorerSpec] | None = Field(default=None, description="profile: the scorers applied")
    candidates: list[PlacementCandidatePublic] | None = Field(default=None, description="profile: ranked, best first")
    nodes_fit: int | None = None


# --------------------------------------------------------------------------- wire: simulations and ballast

Seconds = Annotated[float, Field(strict=True, ge=0, le=7 * 86400, allow_inf_nan=False)]
SYNTHETIC_MAX_BUILDS = 500_000
ProfileName = Literal["spread", "limit-aware", "ci-bin-pack"]


class ShapeSpec(_Strict):
    name: Name
    cpu: PlacementCpu
    memory: PlacementMemory
    price_per_hour: Annotated[float, Field(strict=True, ge=0, le=10_000, allow_inf_nan=False)] = 0.0

    @model_validator(mode="after")
    def _positive(self) -> ShapeSpec:
        if self.cpu <= 0 or self.memory <= 0:
            raise ValueError("a node shape needs cpu and memory above zero")
        return self


class PoolSpec(_Strict):
    shapes: list[ShapeSpec] = Field(
        min_length=1, max_length=10, description="the autoscaler launches the smallest that fits"
    )
    initial_nodes: Annotated[int, Field(strict=True, ge=0, le=10_000)] = Field(
        default=0, description="of the first shape"
    )
    min_nodes: Annotated[int, Field(strict=True, ge=0, le=10_000)] = 0
    max_nodes: Annotated[int, Field(strict=True, ge=1, le=10_000)] = 1000
    provision_delay_seconds: Seconds = 120.0
    scale_down_idle_seconds: Seconds = 600.0
    expendable_pods_priority_cutoff: Annotated[int, Field(strict=True, ge=-(2**31), le=2**31 - 1)] = Field(
        default=-10,
        description="cluster-autoscaler's flag: pods with a priority below it neither trigger a scale-up nor "
        "block a scale-down (SA3); -10 is its default",
    )


class SyntheticSpec(_Strict):
    days: Annotated[float, Field(strict=True, gt=0, le=31, allow_inf_nan=False)] = 7
    builds_per_day: Annotated[float, Field(strict=True, gt=0, le=200_000, allow_inf_nan=False)] = 1500
    seed: Annotated[int, Field(strict=True, ge=0, le=2**31)] = 0
    peak_hour: Annotated[float, Field(strict=True, ge=0, le=24, allow_inf_nan=False)] = 14
    weekend_factor: Annotated[float, Field(strict=True, ge=0, le=1, allow_inf_nan=False)] = 0.2
    bursts_per_day: Annotated[float, Field(strict=True, ge=0, le=1000, allow_inf_nan=False)] = 6

    @model_validator(mode="after")
    def _bounded(self) -> SyntheticSpec:
        if self.days * self.builds_per_day > SYNTHETIC_MAX_BUILDS:
            raise ValueError(f"days x builds_per_day is at most {SYNTHETIC_MAX_BUILDS:,} builds")
        return self


class HistorySpec(_Strict):
    org: Name
    since: Timestamp
    until: Timestamp
    sizes: Literal["recommended", "recorded"] = Field(
        default="recommended",
        description="recommended: each job's current recommendation; recorded: each run's CPU peak and "
        "reported memory limit (else its memory peak)",
    )

    @field_validator("since", "until")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return to_naive_utc(value)

    @model_validator(mode="after")
    def _ordered(self) -> HistorySpec:
        if self.since >= self.until:
            raise ValueError("since must be before until")
        if self.until - self.since > timedelta(days=92):
            raise ValueError("the window is at most 92 days")
        return self


class BallastSpec(_Strict):
    replicas: Annotated[int, Field(strict=True, ge=0, le=1000)]
    cpu: PlacementCpu | None = Field(default=None, description="default: the most common build-pod size of the trace")
    memory: PlacementMemory | None = None
    priority: Annotated[int, Field(strict=True, ge=-(2**31), le=2**31 - 1)] = Field(
        default=-1_000_000, description="the ballast pods' priority; cf-runtime hard-codes -1000000 (SA3)"
    )


class SimulationCreate(_Strict):
    synthetic: SyntheticSpec | None = Field(default=None, description="a generated trace (see docs/simulation.md)")
    history: HistorySpec | None = Field(default=None, description="the org's stored runs in a window")
    pool: PoolSpec
    profiles: list[ProfileName] = Field(default=["spread", "ci-bin-pack"], min_length=1, max_length=3)
    ballast: Literal["auto"] | BallastSpec | None = Field(
        default="auto",
        description="each profile is also run with ballast: auto sizes it from the trace (most common pod, "
        "the replicas that cover ballast_coverage of the bursts within the provision delay); null runs "
        "without ballast only",
    )
    ballast_coverage: Annotated[float, Field(strict=False, gt=0, le=1, allow_inf_nan=False)] = Field(
        default=0.9, description="auto ballast: the share of bursts it should absorb (SA2)"
    )
    seed: Annotated[int, Field(strict=True, ge=0, le=2**31)] = 0

    @model_validator(mode="after")
    def _one_source(self) -> SimulationCreate:
        if (self.synthetic is None) == (self.history is None):
            raise ValueError("give exactly one of synthetic or history")
        return self


class AnalysisPublic(BaseModel):
    id: str
    kind: str
    status: Literal["queued", "running", "done", "failed"]
    progress: float = Field(description="0..1")
    created_at: str | None
    updated_at: str | None
    created_by: str
    request: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None


class BallastPublic(BaseModel):
    org: str
    window: dict[str, Any]
    provision_delay_seconds: float
    pod: StageTotalPublic = Field(description="the most common recommended build-pod size")
    replicas: int = Field(description="the smallest count whose share of bursts no bigger reaches coverage (SA2)")
    coverage: float
    bursts: dict[str, Any] = Field(description="how many bursts, the largest, the share no bigger than replicas")
    choices: list[dict[str, Any]] = Field(
        description="every burst size as a replica count: its covered share and node-hours per week"
    )
    zero_hours_utc: list[str] = Field(
        description="hours of the week with no build start, among the hour-of-week slots the data covers (SA4)"
    )
    hours_covered: int = Field(description="how many of the 168 hour-of-week slots the data covers")
    autoscaler: str = Field(description="what cluster-autoscaler needs for an evicted ballast pod to bring a node")
    helm_values: str = Field(description="the cf-runtime chart's ballast.dind values")


class BacktestCreate(_Strict):
    org: Name | None = Field(default=None, description="one org's jobs; leave out for all (a token for every org)")
    since: Timestamp | None = None
    until: Timestamp | None = None
    runs: list[Annotated[int, Field(strict=True, ge=1, le=100)]] = Field(default=[5], min_length=1, max_length=10)
    buffer: list[Annotated[int, Field(strict=True, ge=0, le=1000)]] = Field(default=[20], min_length=1, max_length=10)
    cpu_percentile: list[CpuPercentile] = Field(default=["p95"], min_length=1, max_length=6)
    memory_qos: list[Literal["guaranteed", "burstable"]] = Field(default=["guaranteed"], min_length=1, max_length=2)
    baselines: Annotated[bool, Field(strict=True)] = Field(
        default=True, description="add the fixed default and the approximations of other right-sizers"
    )

    @field_validator("since", "until")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else to_naive_utc(value)

    @model_validator(mode="after")
    def _bounded(self) -> BacktestCreate:
        sets = len(self.runs) * len(self.buffer) * len(self.cpu_percentile) * len(self.memory_qos)
        if sets > 50:
            raise ValueError(f"at most 50 parameter sets in one backtest, not {sets}")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("since must be before until")
        return self
