"""Response schemas of placement (placement.md): the reply of ``POST /api/v1/placement:advise``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from service.placement.schemas import ScorerSpec
from service.stages.public import StageTotalPublic


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
