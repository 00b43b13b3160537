"""The fleet simulator's inputs (node shapes, the pool, builds, ballast, scenarios), the state it
keeps per node and pod, and the quantiles its report uses. Times in seconds, CPU millicores,
memory bytes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from service import core


@dataclass(frozen=True)
class Shape:
    name: str
    cpu: int
    memory: int
    price_per_hour: float = 0.0


#: cluster-autoscaler's default ``--expendable-pods-priority-cutoff`` (SA3)
EXPENDABLE_CUTOFF = -10
#: the ``cf-ballast`` PriorityClass value cf-runtime hard-codes (templates/ballast/priority-class.yaml)
BALLAST_PRIORITY = -1_000_000


@dataclass(frozen=True)
class Pool:
    shapes: tuple[Shape, ...]
    #: nodes of the first shape, ready at the start
    initial_nodes: int = 0
    min_nodes: int = 0
    max_nodes: int = 1000
    provision_delay: float = 120.0
    scale_down_idle: float = 600.0
    expendable_cutoff: int = EXPENDABLE_CUTOFF


@dataclass(frozen=True)
class Build:
    start: float
    duration: float
    cpu: int
    memory: int
    #: the limits the sizer would give the pod (SA1); -1: derived from the request by rule S12
    cpu_limit: int = -1
    memory_limit: int = -1

    def limits(self) -> tuple[int, int]:
        return (
            core.cpu_limit_for(self.cpu) if self.cpu_limit < 0 else self.cpu_limit,
            core.memory_limit_for(self.memory) if self.memory_limit < 0 else self.memory_limit,
        )


@dataclass(frozen=True)
class Ballast:
    replicas: int
    cpu: int
    memory: int
    priority: int = BALLAST_PRIORITY


@dataclass(frozen=True)
class Scenario:
    name: str
    profile: str
    ballast: Ballast | None = None


@dataclass
class Node:
    id: int
    shape: Shape
    launched: float
    ready_at: float
    ready: bool = False
    removed: float | None = None
    cpu: int = 0
    memory: int = 0
    lim_cpu: int = 0
    lim_mem: int = 0
    build_cpu: int = 0
    build_memory: int = 0
    builds: set[int] = field(default_factory=set)
    ballast: list[int] = field(default_factory=list)
    idle_since: float | None = None
    lone_since: float | None = None  # since when exactly one build (and nothing else) runs here


@dataclass
class Pod:
    id: int
    cpu: int
    memory: int
    build: int | None  # index into the builds; None for a ballast pod
    node: int | None = None
    lim_cpu: int = 0
    lim_mem: int = 0


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks; 0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    h = (len(xs) - 1) * q
    lo = math.floor(h)
    return xs[lo] if lo + 1 >= len(xs) else xs[lo] + (h - lo) * (xs[lo + 1] - xs[lo])


def weighted_quantile(segments: Sequence[tuple[float, float]], q: float) -> float:
    """The q-quantile of a piecewise-constant signal given as ``(duration, value)`` segments."""
    total = sum(d for d, _ in segments)
    if total <= 0:
        return 0.0
    acc = 0.0
    for d, v in sorted(segments, key=lambda s: s[1]):
        acc += d
        if acc >= q * total - 1e-9:
            return v
    return max(v for _, v in segments)
