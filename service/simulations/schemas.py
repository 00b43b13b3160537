"""Wire schemas of simulations, ballast and analyses."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    field_validator,
    model_validator,
)

from service.placement.schemas import PlacementCpu, PlacementMemory
from service.stages.public import StageTotalPublic
from service.wire import Name, Strict, Timestamp, to_naive_utc

# --------------------------------------------------------------------------- wire: simulations and ballast

Seconds = Annotated[float, Field(strict=True, ge=0, le=7 * 86400, allow_inf_nan=False)]
SYNTHETIC_MAX_BUILDS = 500_000
ProfileName = Literal["spread", "limit-aware", "ci-bin-pack"]


class ShapeSpec(Strict):
    name: Name
    cpu: PlacementCpu
    memory: PlacementMemory
    price_per_hour: Annotated[float, Field(strict=True, ge=0, le=10_000, allow_inf_nan=False)] = 0.0

    @model_validator(mode="after")
    def _positive(self) -> ShapeSpec:
        if self.cpu <= 0 or self.memory <= 0:
            raise ValueError("a node shape needs cpu and memory above zero")
        return self


class PoolSpec(Strict):
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


class SyntheticSpec(Strict):
    days: Annotated[float, Field(strict=True, gt=0, le=31, allow_inf_nan=False)] = 7
    builds_per_day: Annotated[float, Field(strict=True, gt=0, le=200_000, allow_inf_nan=False)] = 1500
    seed: Annotated[int, Field(strict=True, ge=0, le=2**31)] = 0
    peak_hour: Annotated[float, Field(strict=True, ge=0, le=24, allow_inf_nan=False)] = 14
    weekend_factor: Annotated[float, Field(strict=True, ge=0, le=1, allow_inf_nan=False)] = 0.2
    bursts_per_day: Annotated[float, Field(strict=True, ge=0, le=1000, allow_inf_nan=False)] = 6

    @model_validator(mode="after")
    def bounded_quantity(self) -> SyntheticSpec:
        if self.days * self.builds_per_day > SYNTHETIC_MAX_BUILDS:
            raise ValueError(f"days x builds_per_day is at most {SYNTHETIC_MAX_BUILDS:,} builds")
        return self


class HistorySpec(Strict):
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


class BallastSpec(Strict):
    replicas: Annotated[int, Field(strict=True, ge=0, le=1000)]
    cpu: PlacementCpu | None = Field(default=None, description="default: the most common build-pod size of the trace")
    memory: PlacementMemory | None = None
    priority: Annotated[int, Field(strict=True, ge=-(2**31), le=2**31 - 1)] = Field(
        default=-1_000_000, description="the ballast pods' priority; cf-runtime hard-codes -1000000 (SA3)"
    )


class SimulationCreate(Strict):
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
