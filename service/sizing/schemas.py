"""Wire schemas of sizing answers."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    Field,
)

from service.wire import CpuPercentile

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


class GrowPublic(BaseModel):
    max: str
    max_bytes: int = Field(description="the most the memory limit may grow to during one run (>= memory.limit_bytes)")
    threshold_percent: int = Field(ge=50, le=99, description="grow when use reaches this percent of the current limit")
    step: str
    step_bytes: int = Field(description="each growth raises the limit by at least this much, never past max_bytes")


class ContainerSizingPublic(BaseModel):
    name: str
    cpu: CpuPublic
    memory: MemoryPublic
    observed: ObservedPublic
    oom: OomPublic
    runner_ceiling: RunnerCeilingPublic | None = Field(
        default=None, description="present when runner ceilings are configured for the org"
    )
    grow: GrowPublic | None = Field(
        description="how far a run may grow its memory limit in place (rules G1-G5, docs/sizing.md); "
        "null: this container must not grow"
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
    policy: Literal["seed", "efficient", "growth"] = Field(
        description="the sizing policy that made this answer: the most specific override's, else the server's"
    )
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
