"""Wire schemas of the override check (``PUT ...?dry_run=true``, issue 34)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from service.jobs import risk
from service.keys import Scope
from service.quantity import format_cpu, format_memory


class PinRiskPublic(BaseModel):
    """A container the override would put below what it uses."""

    org: str
    repo: str
    workflow: str
    job: str
    container: str
    field: Literal["memory_limit", "cpu_limit"]
    pinned: str = Field(description="the value the override would give it (a quantity)")
    pinned_value: int = Field(description="bytes or millicores")
    used: str = Field(description="the highest memory peak or CPU p95 of the job's newest runs (a quantity)")
    used_value: float = Field(description="bytes or millicores")
    runs: int = Field(description="the newest runs it was read from")


class OverrideCheckPublic(BaseModel):
    """What a PUT with ``?dry_run=true`` answers: nothing is written."""

    dry_run: Literal[True] = True
    scope: Scope
    jobs: int = Field(description="the jobs the override's scope covers")
    below_use: list[PinRiskPublic] = Field(
        description="every container whose pinned memory limit would be below its peak (killed on every run: "
        "pins skip the OOM backoff) or whose pinned CPU limit would be below its CPU p95 (throttled), "
        "worst first; per job each field resolves as the answer does (rules O2-O3)"
    )


def check_public(r: risk.PinRisk) -> PinRiskPublic:
    """A container a pin would put below use, in its wire shape."""
    memory = r.field == "memory_limit"
    fmt = format_memory if memory else format_cpu
    step = 1 << 20 if memory else 1  # a canonical quantity: memory in whole MiB, CPU in millicores, rounded up
    used = int(-(-r.used // step)) * step
    return PinRiskPublic(
        org=r.key.org,
        repo=r.key.repo,
        workflow=r.key.workflow,
        job=r.key.job,
        container=r.container,
        field=r.field,
        pinned=fmt(r.pinned),
        pinned_value=r.pinned,
        used=fmt(used),
        used_value=r.used,
        runs=r.runs,
    )
