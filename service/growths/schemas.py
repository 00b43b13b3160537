"""Wire schemas of a job's growth events (issue 40: what the growth guard did to its runs)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.runs.schemas import GrowthResult


class GrowthEventPublic(BaseModel):
    run_id: str
    finished_at: str = Field(description="when the run finished")
    container: str
    at: str
    from_bytes: int
    to_bytes: int
    result: GrowthResult


class GrowthCountsPublic(BaseModel):
    grown: int
    deferred: int
    infeasible: int
    too_late: int
    error: int


class JobGrowthsPublic(BaseModel):
    org: str
    repo: str
    workflow: str
    job: str
    window_days: int
    runs: int = Field(description="runs that finished in the window")
    runs_grown: int = Field(description="runs in the window with a container whose memory limit grew")
    kills_avoided: int = Field(
        description="runs in the window that grew, were not OOM-killed and peaked above the limit they started "
        "with: without growth, the kernel would have killed each of them"
    )
    runs_too_late: int = Field(description="runs in the window killed before a growth took effect")
    events: GrowthCountsPublic = Field(description="the window's growth events, by result")
    recent: list[GrowthEventPublic] = Field(description="the job's newest growth events (any age), newest first")
