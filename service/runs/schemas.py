"""Wire schemas of runs. The ingest body carries samples that are never stored, so it is not the
shape of any table."""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from service.wire import MAX_MEMORY_BYTES, CpuValue, MemoryBytes, Name, Strict, Timestamp, to_naive_utc


class CpuStats(Strict):
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


GrowthResult = Literal["grown", "deferred", "infeasible", "too_late", "error"]
GROWTH_RESULTS: tuple[GrowthResult, ...] = ("grown", "deferred", "infeasible", "too_late", "error")
#: the most growth events one container may report in one run (GROWTH-CONTRACT.md section 2)
MAX_GROWTHS = 100
GrowthBytes = Annotated[int, Field(strict=True, ge=1, le=MAX_MEMORY_BYTES)]


class GrowthCreate(Strict):
    """One attempt of the growth guard (``ci-sizer collect --grow``) to raise a running container's memory
    limit (issue 40): ``grown`` raised it from ``from_bytes`` to ``to_bytes``; ``deferred`` and
    ``infeasible`` (Kubernetes' PodResizePending reasons) and ``error`` left it at ``from_bytes``, having
    asked for ``to_bytes``; ``too_late``: the kernel killed the container before a growth took effect."""

    at: Timestamp
    from_bytes: GrowthBytes
    to_bytes: GrowthBytes = Field(description="what the limit became (grown), else what was asked")
    result: GrowthResult

    @field_validator("at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return to_naive_utc(value)

    @model_validator(mode="after")
    def _upward(self) -> GrowthCreate:
        if self.to_bytes < self.from_bytes:
            raise ValueError("to_bytes must not be below from_bytes (a growth only raises a limit)")
        if self.result == "grown" and self.to_bytes == self.from_bytes:
            raise ValueError("a grown event raises the limit: to_bytes must be above from_bytes")
        return self


class ContainerCreate(Strict):
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
    growths: list[GrowthCreate] | None = Field(
        default=None,
        max_length=MAX_GROWTHS,
        description="the growth guard's events, oldest first (issue 40); memory_limit_bytes is then the limit "
        "the container ended with",
    )

    @model_validator(mode="after")
    def _one_cpu_source(self) -> ContainerCreate:
        if (self.cpu_samples_millicores is None) == (self.cpu_stats_millicores is None):
            raise ValueError("give exactly one of cpu_samples_millicores or cpu_stats_millicores")
        return self

    @field_validator("growths")
    @classmethod
    def _growths_in_order(cls, value: list[GrowthCreate] | None) -> list[GrowthCreate] | None:
        if value and any(b.at < a.at for a, b in pairwise(value)):
            raise ValueError("must be in the order they happened (at never decreasing)")
        return value


class RunCreate(Strict):
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


class GrowthPublic(BaseModel):
    at: str
    from_bytes: int
    to_bytes: int
    result: GrowthResult


class RunContainerPublic(BaseModel):
    name: str
    cpu_stats_millicores: CpuStatsPublic
    memory_peak_bytes: int
    oom_suspect: bool
    growths: list[GrowthPublic] = Field(
        default_factory=list, description="the growth events stored with the container, oldest first (issue 40)"
    )


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
