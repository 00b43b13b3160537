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
from dataclasses import dataclass, field
from typing import Any

from service import core
from service.errors import InvalidInput
from service.placement.schemas import (
    PlacementAdvise,
    PlacementChain,
    PlacementContainer,
    PlacementNode,
    PlacementPod,
    PlacementStep,
    ResourceWeights,
    ScorerSpec,
)
from service.quantity import format_cpu, format_memory
from service.sizing.answer import Answer

NONZERO_CPU = 100  # millicores: what a container without a CPU request counts when scoring (P7)
NONZERO_MEMORY = 200 * core.MIB  # P7

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


@dataclass(frozen=True)
class PodTotals:
    """One pod in the units the core takes: requests as the fit filter counts them, non-zero
    requests as NodeResourcesFit scores them, limits, containers without a limit, and the
    extended resources it requests (by name)."""

    req_cpu: int
    req_mem: int
    nz_cpu: int
    nz_mem: int
    lim_cpu: int
    lim_mem: int
    miss_cpu: int
    miss_mem: int
    extended: dict[str, int] = field(default_factory=dict)

    def as_tuple(self, ext_names: Sequence[str] = ()) -> tuple[int, ...]:
        return (
            self.req_cpu,
            self.req_mem,
            self.nz_cpu,
            self.nz_mem,
            self.lim_cpu,
            self.lim_mem,
            self.miss_cpu,
            self.miss_mem,
            *(self.extended.get(name, 0) for name in ext_names),
        )


def _request(c: PlacementContainer, resource: str) -> int | None:
    """A container's request; a limit without a request is the request (PK7, SetDefaults_Pod)."""
    value: int | None = getattr(c.requests, resource)
    return getattr(c.limits, resource) if value is None else value


def _aggregate(pod: PlacementPod, value: Callable[[PlacementContainer], int]) -> int:
    """``AggregateContainerRequests`` of k8s.io/component-helpers (PK7): the containers' sum plus
    every sidecar (an init container with ``restart_policy: Always``); a regular init container
    counts its own value plus the sidecars started before it; the pod takes the larger."""
    total = sum(value(c) for c in pod.container_list())
    sidecars = init_max = 0
    for c in pod.init_containers:
        v = value(c)
        if c.restart_policy == "Always":
            total += v
            sidecars += v
            init_max = max(init_max, sidecars)
        else:
            init_max = max(init_max, v + sidecars)
    return max(total, init_max)


def pod_totals(pod: PlacementPod, *, placing: bool) -> PodTotals:
    """Kubernetes' pod arithmetic (PK7): requests aggregated as ``_aggregate`` does, plus
    overhead; a container without a request (after a limit set it) counts 100m/200Mi when the Fit
    scorers score, an explicit 0 stays 0. The limit of the pod being placed follows the same rule
    (P8); the limits of pods already on a node are the sum of their containers' limits, as the
    proposal in 003 computes them."""
    cs, oh = pod.container_list(), pod.overhead

    def rq(resource: str, unset: int) -> int:
        def one(c: PlacementContainer) -> int:
            v = _request(c, resource)
            return unset if v is None else v

        return _aggregate(pod, one) + (getattr(oh, resource) or 0)

    def lim(resource: str) -> tuple[int, int]:
        if placing:
            total = _aggregate(pod, lambda c: getattr(c.limits, resource) or 0) + (getattr(oh, resource) or 0)
            running = [*cs, *(c for c in pod.init_containers if c.restart_policy == "Always")]
            return total, sum(getattr(c.limits, resource) is None for c in running)
        given = [getattr(c.limits, resource) for c in cs]
        return sum(v for v in given if v is not None), sum(v is None for v in given)

    names = {n for c in (*cs, *pod.init_containers) for n in (*c.requests.extended, *c.limits.extended)}
    extended = {}
    for name in sorted(names):

        def ext(c: PlacementContainer, name: str = name) -> int:
            return c.requests.extended.get(name, c.limits.extended.get(name, 0))

        value = _aggregate(pod, ext) + oh.extended.get(name, 0)
        if value:
            extended[name] = value
    lim_cpu, miss_cpu = lim("cpu")
    lim_mem, miss_mem = lim("memory")
    return PodTotals(
        rq("cpu", 0), rq("memory", 0), rq("cpu", NONZERO_CPU), rq("memory", NONZERO_MEMORY),
        lim_cpu, lim_mem, miss_cpu, miss_mem, extended,
    )  # fmt: skip


def pod_from_answer(answer: Answer, *, cpu_limit: str = "as-applied") -> PlacementPod:
    """A pod of the job's recommended containers; CPU limits only where the sizer enforces them,
    or everywhere with ``cpu_limit="enforce"`` (the limits enforce mode would give, PK9)."""
    containers = []
    for c in answer.containers:
        containers.append(
            PlacementContainer.model_validate(
                {
                    "requests": {
                        "cpu": f"{c.cpu.request_millicores}m",
                        "memory": str(c.memory.request_bytes),
                    },
                    "limits": {
                        "cpu": f"{c.cpu.limit_millicores}m" if c.cpu.enforced or cpu_limit == "enforce" else None,
                        "memory": str(c.memory.limit_bytes),
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


# --------------------------------------------------------------------------- PC1-PC8: Concourse by generation


def _inputs_held(node: PlacementNode, inputs: set[str]) -> int:
    return len(inputs.intersection(node.volumes_held))


def run_chain_v70(
    nodes: list[PlacementNode], step: PlacementStep, chain: PlacementChain, rng: random.Random
) -> dict[str, Any]:
    """Concourse v7.0.0 (``atc/worker/placement.go``, ``atc/engine/task_delegate.go``): a filter
    chain whose empty survivor set fails the step (PC1), except that a task step waits when
    ``limit-active-tasks`` emptied it (PC2); limits keep ``<= max`` for containers and volumes,
    ``< max`` for tasks; checks go to a random worker (PC3); ``random`` adds nothing."""
    survivors = list(range(len(nodes)))
    inputs = set(step.inputs)
    trace: list[dict[str, Any]] = []
    strategies = [] if step.step_type in ("check", "resource-check") else [s for s in chain.strategies if s != "random"]
    for strategy in strategies:
        dropped: list[dict[str, str]] = []
        if strategy == "volume-locality":
            survivors, dropped = _keep_best(
                nodes, survivors, lambda i: _inputs_held(nodes[i], inputs), max, "holds inputs:"
            )
        elif strategy == "fewest-build-containers":
            survivors, dropped = _keep_best(
                nodes, survivors, lambda i: nodes[i].build_containers, min, "build containers:"
            )
        elif strategy == "limit-active-tasks":
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
        else:  # limit-active-containers / limit-active-volumes
            what = "containers" if strategy == "limit-active-containers" else "volumes"
            cap = getattr(chain, f"max_active_{what}_per_worker")
            if cap > 0:
                dropped = [
                    {"name": nodes[i].name, "why": f"{what} {getattr(nodes[i], what)} > max {cap}"}
                    for i in survivors
                    if getattr(nodes[i], what) > cap
                ]
                survivors = [i for i in survivors if getattr(nodes[i], what) <= cap]
        trace.append({"strategy": strategy, "survivors": [nodes[i].name for i in survivors], "dropped": dropped})
        if not survivors:
            if strategy == "limit-active-tasks" and step.step_type == "task":
                reason = "limit-active-tasks left no worker: the task waits and polls for a free one"
                return {"decision": "wait", "pick": None, "reason": reason, "survivors": [], "chain": trace}
            reason = f"no worker fit container placement strategy: {strategy} (the step errors)"
            return {"decision": "fail", "pick": None, "reason": reason, "survivors": [], "chain": trace}
    pick = rng.choice(survivors)
    how = "checks go to a random worker" if step.step_type in ("check", "resource-check") else None
    return {
        "decision": "place",
        "pick": nodes[pick].name,
        "reason": how
        or (f"picked at random from {len(survivors)} survivor(s)" if len(survivors) > 1 else "the only survivor"),
        "survivors": [nodes[i].name for i in survivors],
        "chain": trace,
    }


def head_strategies(step: PlacementStep, chain: PlacementChain) -> list[str]:
    """PC8: tasks and puts use the main chain; gets and checks inside a build the no-input chain
    (default: the main one); resource checks the check chain (default ``random``)."""
    if step.step_type in ("task", "put"):
        names: list[str] = list(chain.strategies)
    elif step.step_type in ("get", "check"):
        names = list(chain.no_input_strategies if chain.no_input_strategies is not None else chain.strategies)
    else:
        names = list(chain.check_strategies)
    return [n for n in names if n != "random"]  # random adds nothing: the order is shuffled first


def run_chain_head(
    nodes: list[PlacementNode], step: PlacementStep, chain: PlacementChain, rng: random.Random
) -> dict[str, Any]:
    """Concourse at HEAD (``atc/worker/placement.go``, ``atc/worker/pool.go``): shuffle, stable-sort
    by each strategy from the last to the first (PC4), then the first worker every strategy
    approves wins; none approved: the step waits (PC5). Every limit approves ``< max`` (PC6);
    ``limit-active-tasks`` orders and limits task steps only and takes the worker's own max when
    > 0 (PC7)."""
    strategies = head_strategies(step, chain)
    inputs = set(step.inputs)
    order = list(range(len(nodes)))
    rng.shuffle(order)
    trace: list[dict[str, Any]] = [{"strategy": "shuffle", "survivors": [nodes[i].name for i in order], "dropped": []}]

    def within(value: int, cap: int) -> bool:
        return cap == 0 or value < cap

    for strategy in reversed(strategies):
        if strategy == "volume-locality":
            order.sort(key=lambda i: -_inputs_held(nodes[i], inputs))
        elif strategy == "fewest-build-containers":
            order.sort(key=lambda i: nodes[i].build_containers)
        elif strategy == "limit-active-tasks":
            if step.step_type == "task":
                order.sort(key=lambda i: nodes[i].active_tasks)
        elif strategy == "limit-active-containers":
            order.sort(key=lambda i: not within(nodes[i].containers, chain.max_active_containers_per_worker))
        else:
            order.sort(key=lambda i: not within(nodes[i].volumes, chain.max_active_volumes_per_worker))
        trace.append({"strategy": strategy, "survivors": [nodes[i].name for i in order], "dropped": []})

    def refusal(i: int) -> str | None:
        w = nodes[i]
        for strategy in strategies:
            if strategy == "limit-active-tasks" and step.step_type == "task" and chain.max_active_tasks_per_worker:
                cap = w.max_active_tasks if w.max_active_tasks > 0 else chain.max_active_tasks_per_worker
                if w.active_tasks >= cap:
                    return f"limit-active-tasks: active tasks {w.active_tasks} >= max {cap}"
            elif strategy == "limit-active-containers" and not within(
                w.containers, chain.max_active_containers_per_worker
            ):
                return f"limit-active-containers: containers {w.containers} >= max {chain.max_active_containers_per_worker}"
            elif strategy == "limit-active-volumes" and not within(w.volumes, chain.max_active_volumes_per_worker):
                return f"limit-active-volumes: volumes {w.volumes} >= max {chain.max_active_volumes_per_worker}"
        return None

    refused: list[dict[str, str]] = []
    for i in order:
        why = refusal(i)
        if why is None:
            trace.append({"strategy": "approve", "survivors": [nodes[i].name], "dropped": refused})
            return {
                "decision": "place",
                "pick": nodes[i].name,
                "reason": f"the first of the ordered workers that every strategy approves ({len(refused)} refused before it)",
                "survivors": [nodes[j].name for j in order],
                "chain": trace,
            }
        refused.append({"name": nodes[i].name, "why": why})
    trace.append({"strategy": "approve", "survivors": [], "dropped": refused})
    return {
        "decision": "wait",
        "pick": None,
        "reason": "no worker is approved: the step waits and polls for a free one",
        "survivors": [nodes[j].name for j in order],
        "chain": trace,
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
        run = {"doc": run_chain, "v7.0": run_chain_v70, "head": run_chain_head}[body.chain.generation]
        out.update(run(body.nodes, body.pod, body.chain, rng))
    else:
        scorers = scorers_of(body)
        out["profile"] = [s.model_dump() for s in scorers]
        columns = Columns.of(body.nodes, extended_names(totals, scorers))
        out.update(score(body.nodes, columns, totals, scorers, rng, top=body.top, scorer=scorer))
    return out
