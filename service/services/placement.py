"""Placement advice (``shared/spec/placement.md``): Concourse filter chains (P1-P6) and Kubernetes
node scoring (P7-P10), for one pod or step.

Chains are a few set operations per worker and stay in Python; scoring every node sums the pods
on each node and scores them in the core (``score_nodes``), which is where large clusters spend time.
"""

from __future__ import annotations

import random
import secrets
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import core
from ..errors import InvalidInput
from ..models import (
    PlacementAdvise,
    PlacementChain,
    PlacementContainer,
    PlacementNode,
    PlacementPod,
    PlacementStep,
    ResourceWeights,
    ScorerSpec,
)
from ..quantity import format_cpu, format_memory

NONZERO_CPU = 100  # millicores: what a container without a CPU request counts when scoring (P7)
NONZERO_MEMORY = 200 * core.MIB  # P7

SCORER_KINDS = {
    "least-allocated": core.LEAST_ALLOCATED,
    "most-allocated": core.MOST_ALLOCATED,
    "limit-aware": core.LIMIT_AWARE,
    "smallest-node": core.SMALLEST_NODE,
    "largest-node": core.LARGEST_NODE,
}
#: The built-in profiles (P10).
PROFILES: dict[str, list[ScorerSpec]] = {
    # NodeResourcesFit LeastAllocated: the Kubernetes default, spreads pods
    "spread": [ScorerSpec(name="least-allocated")],
    # the proposal in 003: spread the limits, so burstable pods over-subscribe fewer nodes
    "limit-aware": [ScorerSpec(name="limit-aware")],
    # 004: the smallest node that fits (CPU), the fullest on ties
    "ci-bin-pack": [
        ScorerSpec(name="smallest-node", weight=100, resources=ResourceWeights(cpu=1, memory=0)),
        ScorerSpec(name="most-allocated", weight=1),
    ],
}


@dataclass(frozen=True)
class PodTotals:
    """One pod in the units the core takes: requests as the fit filter counts them, non-zero
    requests as NodeResourcesFit scores them, limits, and containers without a limit."""

    req_cpu: int
    req_mem: int
    nz_cpu: int
    nz_mem: int
    lim_cpu: int
    lim_mem: int
    miss_cpu: int
    miss_mem: int

    def as_tuple(self) -> tuple[int, int, int, int, int, int, int, int]:
        return (
            self.req_cpu,
            self.req_mem,
            self.nz_cpu,
            self.nz_mem,
            self.lim_cpu,
            self.lim_mem,
            self.miss_cpu,
            self.miss_mem,
        )


def pod_totals(pod: PlacementPod, *, placing: bool) -> PodTotals:
    """Kubernetes' pod arithmetic: requests are ``max(sum of containers, largest init container)
    + overhead``; a container without a request counts 100m/200Mi when scoring. The limit of the
    pod being placed follows the same rule (P8); the limits of pods already on a node are the sum
    of their containers' limits, as the proposal in 003 computes them."""
    cs, inits, oh = pod.container_list(), pod.init_containers, pod.overhead

    def rq(resource: str, unset: int) -> int:
        def one(c: PlacementContainer) -> int:
            v: int | None = getattr(c.requests, resource)
            return unset if v is None else v

        value = max(sum(one(c) for c in cs), max((one(c) for c in inits), default=0))
        return value + (getattr(oh, resource) or 0)

    def lim(resource: str) -> tuple[int, int]:
        given = [getattr(c.limits, resource) for c in cs]
        total = sum(v for v in given if v is not None)
        if placing:
            total = max(total, max((getattr(c.limits, resource) or 0 for c in inits), default=0))
            total += getattr(oh, resource) or 0
        return total, sum(v is None for v in given)

    lim_cpu, miss_cpu = lim("cpu")
    lim_mem, miss_mem = lim("memory")
    return PodTotals(
        rq("cpu", 0), rq("memory", 0), rq("cpu", NONZERO_CPU), rq("memory", NONZERO_MEMORY),
        lim_cpu, lim_mem, miss_cpu, miss_mem,
    )  # fmt: skip


def pod_from_answer(answer: dict[str, Any]) -> PlacementPod:
    """A pod of the job's recommended containers; CPU limits only where the sizer enforces them."""
    containers = []
    for c in answer["containers"]:
        containers.append(
            PlacementContainer.model_validate(
                {
                    "requests": {
                        "cpu": f"{c['cpu']['request_millicores']}m",
                        "memory": str(c["memory"]["request_bytes"]),
                    },
                    "limits": {
                        "cpu": f"{c['cpu']['limit_millicores']}m" if c["cpu"]["enforced"] else None,
                        "memory": str(c["memory"]["limit_bytes"]),
                    },
                }
            )
        )
    return PlacementPod(containers=containers)


def _total(cpu: int, memory: int) -> dict[str, Any]:
    return {"cpu": format_cpu(cpu), "cpu_millicores": cpu, "memory": format_memory(memory), "memory_bytes": memory}


def describe_pod(t: PodTotals, source: str, phase: str | None = None, degraded: bool = False) -> dict[str, Any]:
    return {
        "requests": _total(t.req_cpu, t.req_mem),
        "limits": _total(t.lim_cpu, t.lim_mem),
        "containers_without_limit": {"cpu": t.miss_cpu, "memory": t.miss_mem},
        "source": source,
        "phase": phase,
        "degraded": degraded,
    }


# --------------------------------------------------------------------------- P1-P6: chains


def _keep_best(
    nodes: list[PlacementNode], survivors: list[int], value: Callable[[int], int], best: Callable[..., int], what: str
) -> tuple[list[int], list[dict[str, str]]]:
    target = best(value(i) for i in survivors)
    kept = [i for i in survivors if value(i) == target]
    dropped = [
        {"name": nodes[i].name, "why": f"{what} {value(i)}, the best has {target}"}
        for i in survivors
        if value(i) != target
    ]
    return kept, dropped


def run_chain(
    nodes: list[PlacementNode], step: PlacementStep, chain: PlacementChain, rng: random.Random
) -> dict[str, Any]:
    """Each strategy narrows the survivors (P1); an empty set is ``wait`` (P4, P6); else a seeded pick."""
    survivors = list(range(len(nodes)))
    inputs = set(step.inputs)
    trace: list[dict[str, Any]] = []
    for strategy in chain.strategies:
        dropped: list[dict[str, str]] = []
        if strategy == "volume-locality":  # P2
            local = {i: len(inputs.intersection(nodes[i].volumes_held)) for i in survivors}
            survivors, dropped = _keep_best(nodes, survivors, local.__getitem__, max, "holds inputs:")
        elif strategy == "fewest-build-containers":  # P3
            survivors, dropped = _keep_best(
                nodes, survivors, lambda i: nodes[i].build_containers, min, "build containers:"
            )
        elif strategy == "limit-active-tasks":  # P4
            cap = chain.max_active_tasks_per_worker
            if step.step_type == "task" and cap > 0:
                dropped = [
                    {"name": nodes[i].name, "why": f"active tasks {nodes[i].active_tasks} >= max {cap}"}
                    for i in survivors
                    if nodes[i].active_tasks >= cap
                ]
                survivors = [i for i in survivors if nodes[i].active_tasks < cap]
            if survivors:
                survivors, more = _keep_best(nodes, survivors, lambda i: nodes[i].active_tasks, min, "active tasks:")
                dropped += more
        elif strategy in ("limit-active-containers", "limit-active-volumes"):  # P5
            field = "containers" if strategy == "limit-active-containers" else "volumes"
            cap = getattr(chain, f"max_active_{field}_per_worker")
            if cap > 0:
                dropped = [
                    {"name": nodes[i].name, "why": f"{field} {getattr(nodes[i], field)} > max {cap}"}
                    for i in survivors
                    if getattr(nodes[i], field) > cap
                ]
                survivors = [i for i in survivors if getattr(nodes[i], field) <= cap]
        # "random" (P6) filters nothing: the pick below is random anyway
        trace.append({"strategy": strategy, "survivors": [nodes[i].name for i in survivors], "dropped": dropped})
        if not survivors:
            return {
                "decision": "wait",
                "pick": None,
                "reason": f"{strategy} left no worker: the step waits and polls for a free one",
                "survivors": [],
                "chain": trace,
            }
    pick = rng.choice(survivors)
    return {
        "decision": "place",
        "pick": nodes[pick].name,
        "reason": f"picked at random from {len(survivors)} survivor(s)" if len(survivors) > 1 else "the only survivor",
        "survivors": [nodes[i].name for i in survivors],
        "chain": trace,
    }


# --------------------------------------------------------------------------- P7-P10: scoring


def scorer_tuple(spec: ScorerSpec) -> tuple[int, int, int, int, int, int]:
    """``(kind, weight, cpu weight, memory weight, missing cpu, missing memory)`` for the core."""
    if spec.resources is not None:
        w_cpu, w_mem = spec.resources.cpu, spec.resources.memory
    elif spec.name in ("smallest-node", "largest-node"):
        w_cpu, w_mem = 1 << 20, 1  # P9: a millicore weighs as much as a MiB
    else:
        w_cpu, w_mem = 1, 1
    missing = spec.missing_limit
    miss_cpu = -1 if missing is None or missing.cpu is None else missing.cpu
    miss_mem = -1 if missing is None or missing.memory is None else missing.memory
    return SCORER_KINDS[spec.name], spec.weight, w_cpu, w_mem, miss_cpu, miss_mem


@dataclass
class Columns:
    """The cluster as the core takes it: node columns and one entry per pod already placed."""

    alloc_cpu: array[int]
    alloc_mem: array[int]
    pod_node: array[int]
    pods: list[array[int]]  # req_cpu, req_mem, nz_cpu, nz_mem, lim_cpu, lim_mem, miss_cpu, miss_mem

    @classmethod
    def of(cls, nodes: Sequence[PlacementNode]) -> Columns:
        missing = [
            {"field": f"body/nodes/{j}/allocatable", "message": "node scoring needs allocatable cpu and memory"}
            for j, n in enumerate(nodes)
            if n.allocatable is None or n.allocatable.cpu is None or n.allocatable.memory is None
        ]
        if missing:
            raise InvalidInput("node scoring needs every node's allocatable cpu and memory", errors=missing[:20])
        out = cls(array("q"), array("q"), array("q"), [array("q") for _ in range(8)])
        for j, n in enumerate(nodes):
            assert n.allocatable is not None
            out.alloc_cpu.append(n.allocatable.cpu or 0)
            out.alloc_mem.append(n.allocatable.memory or 0)
            for p in n.pods:
                out.pod_node.append(j)
                for column, value in zip(out.pods, pod_totals(p, placing=False).as_tuple(), strict=True):
                    column.append(value)
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
    fits, raws, scores, totals = (scorer or core.score_nodes)(
        columns.alloc_cpu, columns.alloc_mem, columns.pod_node,
        req_cpu, req_mem, nz_cpu, nz_mem, lim_cpu, lim_mem, miss_cpu, miss_mem,
        pod.as_tuple(), [scorer_tuple(s) for s in scorers],
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
        need = f"{format_cpu(pod.req_cpu)} CPU, {format_memory(pod.req_mem)} memory"
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


def advise(
    body: PlacementAdvise, pod: PlacementPod, pod_info: dict[str, Any], *, scorer: Callable[..., Any] | None = None
) -> dict[str, Any]:
    """The reply of ``POST /api/v1/placement:advise``; ``pod`` is the step's pod (the job's
    recommended containers when the step referenced one), ``pod_info`` where it came from."""
    seed = body.seed if body.seed is not None else secrets.randbelow(2**63)
    rng = random.Random(seed)
    totals = pod_totals(pod, placing=True)
    out: dict[str, Any] = {"seed": seed, "pod": describe_pod(totals, **pod_info)}
    if body.chain is not None:
        out.update(run_chain(body.nodes, body.pod, body.chain, rng))
    else:
        scorers = scorers_of(body)
        out["profile"] = [s.model_dump() for s in scorers]
        out.update(score(body.nodes, Columns.of(body.nodes), totals, scorers, rng, top=body.top, scorer=scorer))
    return out
