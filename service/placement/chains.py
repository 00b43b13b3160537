"""Concourse placement (``shared/spec/placement.md``): the filter chains of the doc (P1-P6) and of
each Concourse generation (PC1-PC8), for one step over its workers.

A chain is a few set operations per worker; it stays in Python and picks with the seeded ``rng``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from service.placement.schemas import PlacementChain, PlacementNode, PlacementStep

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
