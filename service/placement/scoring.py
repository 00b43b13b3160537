"""Kubernetes node scoring (``shared/spec/placement.md``, P7-P10): the scorers and built-in
profiles, the cluster as the columns the core takes, and the ranking of the nodes that fit.

Scoring every node sums the pods on each node and scores them in the core (``score_nodes``),
which is where large clusters spend time.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service import core
from service.errors import InvalidInput
from service.placement.pods import PodTotals, pod_totals
from service.placement.schemas import PlacementAdvise, PlacementNode, ResourceWeights, ScorerSpec
from service.quantity import format_cpu, format_memory

SCORER_KINDS = {
    "least-allocated": core.LEAST_ALLOCATED,
    "most-allocated": core.MOST_ALLOCATED,
    "limit-aware": core.LIMIT_AWARE,
    "smallest-node": core.SMALLEST_NODE,
    "largest-node": core.LARGEST_NODE,
    "requested-to-capacity-ratio": core.REQUESTED_TO_CAPACITY_RATIO,
    "balanced-allocation": core.BALANCED_ALLOCATION_CHANGE,
}
#: kube-scheduler's resourceAllocationScorer family: a weight of 0 means 1 (PK5)
KUBE_SCORERS = ("least-allocated", "most-allocated", "requested-to-capacity-ratio", "balanced-allocation")
#: The built-in profiles (P10).
PROFILES: dict[str, list[ScorerSpec]] = {
    # kube-scheduler's default profile, its resource scorers only (PK6): NodeResourcesFit
    # LeastAllocated and NodeResourcesBalancedAllocation, weight 1 each
    "spread": [ScorerSpec(name="least-allocated"), ScorerSpec(name="balanced-allocation")],
    # the proposal in 003: spread the limits, so burstable pods over-subscribe fewer nodes
    "limit-aware": [ScorerSpec(name="limit-aware")],
    # 004: the smallest node that fits (CPU), the fullest on ties
    "ci-bin-pack": [
        ScorerSpec(name="smallest-node", weight=100, resources=ResourceWeights(cpu=1)),
        ScorerSpec(name="most-allocated", weight=1),
    ],
}


# --------------------------------------------------------------------------- P7-P10: scoring


def scorer_tuple(spec: ScorerSpec, ext_names: Sequence[str] = ()) -> tuple[Any, ...]:
    """``(kind, weight, cpu weight, memory weight, missing cpu, missing memory, extended weights,
    shape)`` for the core. A resource left out of ``resources`` weighs 0 (not scored); Kubernetes'
    scorers read an explicit 0 as 1 (PK5, ``SetDefaults_NodeResourcesFitArgs``)."""
    kube = spec.name in KUBE_SCORERS
    if spec.resources is None:
        w_cpu, w_mem = (1 << 20, 1) if spec.name in ("smallest-node", "largest-node") else (1, 1)  # P9
        ext = [0] * len(ext_names)
    else:

        def weight(w: int | None) -> int:
            return 0 if w is None else (1 if kube and w == 0 else w)

        w_cpu, w_mem = weight(spec.resources.cpu), weight(spec.resources.memory)
        ext = [weight(spec.resources.extended.get(name)) if kube else 0 for name in ext_names]
    missing = spec.missing_limit
    miss_cpu = -1 if missing is None or missing.cpu is None else missing.cpu
    miss_mem = -1 if missing is None or missing.memory is None else missing.memory
    kind = SCORER_KINDS[spec.name]
    if spec.name == "balanced-allocation" and spec.kubernetes == "1.35":
        kind = core.BALANCED_ALLOCATION
    # scores 0..10 in the configuration, times MaxNodeScore / MaxCustomPriorityScore (PK1)
    shape = [v for p in spec.shape or () for v in (p.utilization, p.score * 10)]
    return kind, spec.weight, w_cpu, w_mem, miss_cpu, miss_mem, ext, shape


def extended_names(pod: PodTotals, scorers: Sequence[ScorerSpec]) -> list[str]:
    """The extended resources the core sees: those the pod requests (the fit filter) and those a scorer weighs."""
    names = set(pod.extended)
    for s in scorers:
        if s.resources is not None:
            names.update(s.resources.extended)
    return sorted(names)


@dataclass
class Columns:
    """The cluster as the core takes it: node columns and one entry per pod already placed."""

    alloc_cpu: array[int]
    alloc_mem: array[int]
    pod_node: array[int]
    pods: list[array[int]]  # req_cpu, req_mem, nz_cpu, nz_mem, lim_cpu, lim_mem, miss_cpu, miss_mem
    ext_names: tuple[str, ...] = ()
    ext_alloc: array[int] = field(default_factory=lambda: array("q"))
    ext_req: array[int] = field(default_factory=lambda: array("q"))

    @classmethod
    def of(cls, nodes: Sequence[PlacementNode], ext_names: Sequence[str] = ()) -> Columns:
        missing = [
            {"field": f"body/nodes/{j}/allocatable", "message": "node scoring needs allocatable cpu and memory"}
            for j, n in enumerate(nodes)
            if n.allocatable is None or n.allocatable.cpu is None or n.allocatable.memory is None
        ]
        if missing:
            raise InvalidInput("node scoring needs every node's allocatable cpu and memory", errors=missing[:20])
        out = cls(array("q"), array("q"), array("q"), [array("q") for _ in range(8)], tuple(ext_names))
        for j, n in enumerate(nodes):
            assert n.allocatable is not None
            out.alloc_cpu.append(n.allocatable.cpu or 0)
            out.alloc_mem.append(n.allocatable.memory or 0)
            out.ext_alloc.extend(n.allocatable.extended.get(name, 0) for name in ext_names)
            for p in n.pods:
                out.pod_node.append(j)
                values = pod_totals(p, placing=False).as_tuple(ext_names)
                for column, value in zip(out.pods, values[:8], strict=True):
                    column.append(value)
                out.ext_req.extend(values[8:])
        return out


def score(
    nodes: Sequence[PlacementNode],
    columns: Columns,
    pod: PodTotals,
    scorers: Sequence[ScorerSpec],
    rng: random.Random,
    *,
    top: int,
    scorer: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Rank the nodes that fit by the weighted sum of the scorers (P10); the pick is the best,
    at random among equals. ``scorer`` is the core's ``score_nodes`` of a given backend (tests)."""
    req_cpu, req_mem, nz_cpu, nz_mem, lim_cpu, lim_mem, miss_cpu, miss_mem = columns.pods
    names = columns.ext_names
    fits, raws, scores, totals = (scorer or core.score_nodes)(
        columns.alloc_cpu, columns.alloc_mem, columns.pod_node,
        req_cpu, req_mem, nz_cpu, nz_mem, lim_cpu, lim_mem, miss_cpu, miss_mem,
        pod.as_tuple(names), [scorer_tuple(s, names) for s in scorers], columns.ext_alloc, columns.ext_req,
    )  # fmt: skip
    order = sorted(range(len(nodes)), key=lambda j: (not fits[j], -totals[j], j))
    candidates = []
    for rank, j in enumerate(order[:top], start=1):
        candidates.append(
            {
                "name": nodes[j].name,
                "rank": rank,
                "fits": fits[j],
                "total": totals[j],
                "scores": [
                    {
                        "scorer": s.name,
                        "weight": s.weight,
                        "raw": raws[k][j],
                        "score": scores[k][j],
                        "weighted": s.weight * scores[k][j],
                    }
                    for k, s in enumerate(scorers)
                ],
            }
        )
    fitting = sum(fits)
    if not fitting:
        need = f"{format_cpu(pod.req_cpu)} CPU, {format_memory(pod.req_mem)} memory" + "".join(
            f", {v} {k}" for k, v in pod.extended.items()
        )
        return {
            "decision": "wait",
            "pick": None,
            "reason": f"no node fits the pod's requests ({need}): it stays pending until one does",
            "candidates": candidates,
            "nodes_fit": 0,
        }
    best = totals[order[0]]
    tied = [j for j in order if fits[j] and totals[j] == best]
    pick = rng.choice(tied)
    reason = f"the highest total, {best}" + (
        f", picked at random among {len(tied)} equal nodes" if len(tied) > 1 else ""
    )
    return {
        "decision": "place",
        "pick": nodes[pick].name,
        "reason": reason,
        "candidates": candidates,
        "nodes_fit": fitting,
    }


def scorers_of(body: PlacementAdvise) -> list[ScorerSpec]:
    if isinstance(body.profile, str):
        return PROFILES[body.profile]
    assert body.profile is not None
    return body.profile.scorers
