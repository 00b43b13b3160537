"""Response schemas of stages (stage.md): the reply of ``POST /api/v1/stages:compute``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from service.stages.schemas import StageOptions


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
