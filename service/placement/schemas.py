"""Request schemas of placement (placement.md); the reply is in ``placement.public``."""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    model_validator,
)

from service.stages.schemas import QUANTITY_SCHEMA, StageJobRef, bounded_quantity
from service.wire import Name, Strict

# --------------------------------------------------------------------------- wire: placement (placement.md)

PLACEMENT_MAX_NODES = 20_000
PLACEMENT_MAX_PODS_PER_NODE = 1000
PLACEMENT_MAX_CONTAINERS = 64
#: bounds a placement value so a node's sums stay far inside 64-bit integers in the compiled core
PLACEMENT_MAX_MEMORY_BYTES = 1 << 44  # 16 TiB
PLACEMENT_MAX_CPU_MILLICORES = 1 << 30


def _placement_cpu(v: Any) -> int:
    return bounded_quantity(v, "CPU", positive=False, maximum=PLACEMENT_MAX_CPU_MILLICORES)


def _placement_memory(v: Any) -> int:
    return bounded_quantity(v, "memory", positive=False, maximum=PLACEMENT_MAX_MEMORY_BYTES)


PlacementCpu = Annotated[
    int,
    BeforeValidator(_placement_cpu),
    WithJsonSchema({**QUANTITY_SCHEMA, "description": "CPU: 500m, 0.5, 2 (a bare number is cores)"}),
]
PlacementMemory = Annotated[
    int,
    BeforeValidator(_placement_memory),
    WithJsonSchema({**QUANTITY_SCHEMA, "description": "memory: 512Mi, 4Gi (a bare number is bytes)"}),
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


class Resources(Strict):
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


class PlacementContainer(Strict):
    requests: Resources = Field(default_factory=Resources)
    limits: Resources = Field(
        default_factory=Resources, description="a limit without a request sets the request, per resource (PK7)"
    )
    restart_policy: Literal["Always"] | None = Field(
        default=None, description="init containers only: Always makes it a sidecar, which runs beside the pod (PK7)"
    )


class PlacementPod(Strict):
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


class PlacementNode(Strict):
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


class PlacementChain(Strict):
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


class ResourceWeights(Strict):
    """The resources a scorer weighs; a resource left out is not scored. Kubernetes' scorers
    (least/most-allocated, requested-to-capacity-ratio, balanced-allocation) read a weight of 0 as 1 (PK5)."""

    cpu: Weight | None = None
    memory: Weight | None = None
    extended: dict[ExtendedName, Weight] = Field(default_factory=dict, max_length=PLACEMENT_MAX_EXTENDED)

    @model_validator(mode="before")
    @classmethod
    def _flat_extended(cls, v: Any) -> Any:
        return _extended_keys(v)


class ShapePoint(Strict):
    utilization: Annotated[int, Field(strict=True, ge=0, le=100)]
    score: Annotated[int, Field(strict=True, ge=0, le=10)]


class ScorerSpec(Strict):
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


class PlacementProfile(Strict):
    scorers: list[ScorerSpec] = Field(min_length=1, max_length=10)


ProfileChoice = Annotated[
    Annotated[Literal["spread", "limit-aware", "ci-bin-pack"], Tag("profile-name")]
    | Annotated[PlacementProfile, Tag("profile-scorers")],
    Discriminator(lambda v: "profile-name" if isinstance(v, str) else "profile-scorers"),
]


class PlacementAdvise(Strict):
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
