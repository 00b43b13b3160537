"""A discrete-event fleet simulator: build pods arrive, are placed by a scoring profile
(``placement.PROFILES``), wait for the autoscaler when nothing fits, and leave; ballast pods hold
room and are preempted by builds. Same input and seed, same output.

Times are seconds from the trace's start; CPU millicores, memory bytes. The model:

- a node is billed from launch (the autoscaler's decision) to removal; it takes pods once ready,
  ``provision_delay`` after launch;
- a build that fits nowhere first evicts ballast (the node needing the fewest evictions), else
  waits; waiting pods (builds first, then evicted ballast) are placed first-come as room appears;
- the autoscaler launches, for the waiting pods that the nodes already launching cannot hold
  (first fit), the smallest shape that holds each (first fit again), up to ``max_nodes``;
- a node with no pod at all is removed after ``scale_down_idle``, down to ``min_nodes``; build
  pods are never moved to free a node (CI pods are not disruptible);
- the cluster-autoscaler's ``--expendable-pods-priority-cutoff`` (SA3): a pod with priority
  strictly below it neither triggers a scale-up nor blocks a scale-down. cf-runtime's ballast runs
  at priority -1000000, below the stock cutoff -10, so by default a waiting ballast pod brings no
  node and a node holding only ballast is removed like an empty one (its ballast is evicted);
- pods carry the limits the sizer would give them (SA1), which ``limit-aware`` scores.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Any

from service import core
from service.placement import scoring as placement
from service.simulations.model import Build, Node, Pod, Pool, Scenario, Shape
from service.simulations.report import scenario_report


class Event(IntEnum):
    """The kinds of event; their order is the order of events at the same instant."""

    FINISH = 0
    READY = 1
    ARRIVE = 2
    IDLE = 3


class Simulation:
    def __init__(self, builds: Sequence[Build], pool: Pool, scenario: Scenario, seed: int) -> None:
        if not pool.shapes:
            raise ValueError("the pool needs at least one node shape")
        self.builds = list(builds)
        self.pool = pool
        self.scenario = scenario
        self.rng = random.Random(seed)
        self.scorers = [placement.scorer_tuple(s) for s in placement.PROFILES[scenario.profile]]
        #: ballast below the autoscaler's cutoff: brings no node, keeps no node (SA3)
        self.expendable = scenario.ballast is not None and scenario.ballast.priority < pool.expendable_cutoff
        self.events: list[tuple[float, Event, int, int]] = []
        self.seq = 0
        self.nodes: list[Node] = []
        self.pods: list[Pod] = []
        self.waiting_builds: deque[int] = deque()
        self.waiting_ballast: deque[int] = deque()
        self.placed_at: list[float | None] = [None] * len(self.builds)
        self.placed_on: list[int | None] = [None] * len(self.builds)  # the node each build ran on
        self.now = 0.0
        self.segments: list[tuple[float, float, float, float, float, int]] = []  # t0, t1, cpu%, mem%, alloc cpu, nodes
        self.timeline: list[tuple[float, int, float, float]] = []  # t, live nodes, cpu%, mem%
        self.lone: list[float] = []  # lengths of single-build episodes that outlasted the idle time
        self.unschedulable = 0
        self.preemptions = 0
        self.running = 0  # builds on nodes
        self.arrived = 0  # builds whose arrival was handled
        self.last_finish = 0.0
        self.progress: Callable[[float], None] | None = None
        #: one handler per event kind, called with the event's time and its node or pod
        self.handlers: dict[Event, Callable[[float, int], None]] = {
            Event.FINISH: self._on_finish,
            Event.READY: self._on_ready,
            Event.ARRIVE: self._on_arrive,
            Event.IDLE: self._on_idle,
        }

    # ------------------------------------------------------------------ events

    def _push(self, t: float, kind: Event, ref: int) -> None:
        heapq.heappush(self.events, (t, kind, self.seq, ref))
        self.seq += 1

    def _live(self) -> list[Node]:
        return [n for n in self.nodes if n.removed is None]

    def _launch(self, shape: Shape, *, ready_now: bool = False) -> Node:
        node = Node(len(self.nodes), shape, self.now, self.now if ready_now else self.now + self.pool.provision_delay)
        self.nodes.append(node)
        if ready_now:
            node.ready = True
            self._became_empty(node)
        else:
            self._push(node.ready_at, Event.READY, node.id)
        return node

    # ------------------------------------------------------------------ placing

    def _pick(self, pod: Pod) -> Node | None:
        ready = [n for n in self.nodes if n.ready and n.removed is None]
        if not ready:
            return None
        used_cpu = [n.cpu for n in ready]
        used_mem = [n.memory for n in ready]
        zeros = [0] * len(ready)
        fits, _, _, totals = core.score_nodes(
            [n.shape.cpu for n in ready], [n.shape.memory for n in ready], list(range(len(ready))),
            used_cpu, used_mem, used_cpu, used_mem, [n.lim_cpu for n in ready], [n.lim_mem for n in ready],
            zeros, zeros, (pod.cpu, pod.memory, pod.cpu, pod.memory, pod.lim_cpu, pod.lim_mem, 0, 0), self.scorers,
        )  # fmt: skip
        candidates = [j for j in range(len(ready)) if fits[j]]
        if not candidates:
            return None
        best = max(totals[j] for j in candidates)
        return ready[self.rng.choice([j for j in candidates if totals[j] == best])]

    def _bind(self, pod: Pod, node: Node) -> None:
        self._note_lone(node)
        pod.node = node.id
        node.cpu += pod.cpu
        node.memory += pod.memory
        node.lim_cpu += pod.lim_cpu
        node.lim_mem += pod.lim_mem
        if pod.build is not None or not self.expendable:
            node.idle_since = None
        if pod.build is None:
            node.ballast.append(pod.id)
        else:
            node.builds.add(pod.id)
            node.build_cpu += pod.cpu
            node.build_memory += pod.memory
            self.running += 1
            self.placed_at[pod.build] = self.now
            self.placed_on[pod.build] = node.id
            self._push(self.now + self.builds[pod.build].duration, Event.FINISH, pod.id)
        self._lone_check(node)

    def _unbind(self, pod: Pod) -> Node:
        assert pod.node is not None
        node = self.nodes[pod.node]
        self._note_lone(node)
        node.cpu -= pod.cpu
        node.memory -= pod.memory
        node.lim_cpu -= pod.lim_cpu
        node.lim_mem -= pod.lim_mem
        if pod.build is None:
            node.ballast.remove(pod.id)
        else:
            node.builds.discard(pod.id)
            node.build_cpu -= pod.cpu
            node.build_memory -= pod.memory
            self.running -= 1
        pod.node = None
        self._lone_check(node)
        if self._empty(node) and node.idle_since is None:
            self._became_empty(node)
        return node

    def _empty(self, node: Node) -> bool:
        """No pod that keeps the node: no build, and no ballast unless it is expendable (SA3)."""
        return not node.builds and (not node.ballast or self.expendable)

    def _became_empty(self, node: Node) -> None:
        node.idle_since = self.now
        self._push(self.now + self.pool.scale_down_idle, Event.IDLE, node.id)

    def _note_lone(self, node: Node) -> None:
        """Close a single-build episode before the node's pods change."""
        if node.lone_since is not None:
            length = self.now - node.lone_since
            if length > self.pool.scale_down_idle:
                self.lone.append(length)
            node.lone_since = None

    def _lone_check(self, node: Node) -> None:
        if len(node.builds) == 1 and (not node.ballast or self.expendable):
            node.lone_since = self.now

    def _preempt(self, pod: Pod) -> bool:
        """Evict the fewest ballast pods that make room for a build; False when none can."""
        best: tuple[int, int] | None = None
        for n in self.nodes:
            if not n.ready or n.removed is not None or not n.ballast:
                continue
            free_cpu, free_mem = n.shape.cpu - n.cpu, n.shape.memory - n.memory
            need = 0
            for b in n.ballast:
                if free_cpu >= pod.cpu and free_mem >= pod.memory:
                    break
                free_cpu += self.pods[b].cpu
                free_mem += self.pods[b].memory
                need += 1
            if free_cpu >= pod.cpu and free_mem >= pod.memory and (best is None or need < best[0]):
                best = (need, n.id)
        if best is None:
            return False
        node = self.nodes[best[1]]
        for _ in range(best[0]):
            victim = self.pods[node.ballast[-1]]
            self._unbind(victim)
            self.waiting_ballast.appendleft(victim.id)
            self.preemptions += 1
        self._bind(pod, node)
        return True

    def _drain_waiting(self) -> None:
        for queue in (self.waiting_builds, self.waiting_ballast):
            still: deque[int] = deque()
            while queue:
                pod = self.pods[queue.popleft()]
                node = self._pick(pod)
                if node is None:
                    still.append(pod.id)
                else:
                    self._bind(pod, node)
            queue.extend(still)
        self._scale_up()

    def _scale_up(self) -> None:
        """Launch nodes for the waiting pods that the nodes already launching cannot hold."""
        # expendable pods do not trigger a scale-up (FilterOutExpendableAndSplit, SA3); a build that
        # preempted ballast is bound at once here, so none waits on a preemption either
        ballast_waiting = () if self.expendable else tuple(self.waiting_ballast)
        waiting = [self.pods[i] for i in (*self.waiting_builds, *ballast_waiting)]
        if not waiting:
            return
        room = [
            [n.shape.cpu - n.cpu, n.shape.memory - n.memory] for n in self.nodes if not n.ready and n.removed is None
        ]
        fresh: list[list[int]] = []
        for pod in waiting:
            slot = next((r for r in (*room, *fresh) if r[0] >= pod.cpu and r[1] >= pod.memory), None)
            if slot is None:
                shape = next((s for s in self._by_size() if s.cpu >= pod.cpu and s.memory >= pod.memory), None)
                # _launch adds the node to the live ones: counting `fresh` as well would count it twice
                if shape is None or len(self._live()) >= self.pool.max_nodes:
                    continue
                self._launch(shape)
                slot = [shape.cpu, shape.memory]
                fresh.append(slot)
            slot[0] -= pod.cpu
            slot[1] -= pod.memory

    def _by_size(self) -> list[Shape]:
        return sorted(self.pool.shapes, key=lambda s: (s.cpu, s.memory))

    # ------------------------------------------------------------------ the run

    def _sample(self, until: float) -> None:
        live = self._live()
        ready = [n for n in live if n.ready]
        alloc_cpu = sum(n.shape.cpu for n in ready)
        alloc_mem = sum(n.shape.memory for n in ready)
        build_cpu = sum(n.build_cpu for n in ready)
        build_mem = sum(n.build_memory for n in ready)
        cpu = build_cpu / alloc_cpu if alloc_cpu else 0.0
        mem = build_mem / alloc_mem if alloc_mem else 0.0
        if until > self.now:
            self.segments.append((self.now, until, cpu, mem, float(alloc_cpu), len(live)))
        if not self.timeline or self.timeline[-1][1:] != (len(live), cpu, mem):
            self.timeline.append((self.now, len(live), cpu, mem))

    def run(self, progress: Callable[[float], None] | None = None) -> dict[str, Any]:
        """Replay the builds to the last event; the scenario's report."""
        self.progress = progress
        self._start()
        while self.events:
            t, kind, _, ref = heapq.heappop(self.events)
            if kind == Event.IDLE and self._all_done():
                continue  # after the last build: the tail of idle timers is not simulated
            self._sample(t)
            self.now = t
            self.handlers[kind](t, ref)
        end = max([self.last_finish, *(b.start for b in self.builds)], default=0.0)
        self.now = max(self.now, end)
        for n in self.nodes:
            self._note_lone(n)
        return scenario_report(self, end)

    def _start(self) -> None:
        """Every arrival on the clock, the initial nodes up, the ballast pods placed or waiting."""
        for i, b in enumerate(self.builds):
            self._push(b.start, Event.ARRIVE, i)
        for _ in range(max(self.pool.initial_nodes, self.pool.min_nodes)):
            self._launch(self.pool.shapes[0], ready_now=True)
        bal = self.scenario.ballast
        if bal is not None:
            for _ in range(bal.replicas):
                pod = Pod(len(self.pods), bal.cpu, bal.memory, None, lim_cpu=bal.cpu, lim_mem=bal.memory)
                self.pods.append(pod)
                self.waiting_ballast.append(pod.id)
            self._drain_waiting()

    def _all_done(self) -> bool:
        """Every build arrived, none runs and none waits."""
        return self.arrived == len(self.builds) and not self.running and not self.waiting_builds

    # ------------------------------------------------------------------ handlers

    def _on_arrive(self, t: float, ref: int) -> None:
        """Build ``ref`` arrives: it is placed, preempts ballast, waits, or can never run."""
        self.arrived += 1
        b = self.builds[ref]
        lim_cpu, lim_mem = b.limits()
        pod = Pod(len(self.pods), b.cpu, b.memory, ref, lim_cpu=lim_cpu, lim_mem=lim_mem)
        self.pods.append(pod)
        if not self._admit(pod):
            self.unschedulable += 1
            self.placed_at[ref] = math.nan
            return
        self._drain_waiting()
        total = len(self.builds)
        if self.progress is not None and (self.arrived % 500 == 0 or self.arrived == total):
            self.progress(self.arrived / total)

    def _admit(self, pod: Pod) -> bool:
        """Bind an arriving build, or let it evict ballast, or queue it; False when no shape holds it."""
        node = self._pick(pod)
        if node is not None:
            self._bind(pod, node)
        elif not (self.scenario.ballast is not None and self._preempt(pod)):
            if not any(s.cpu >= pod.cpu and s.memory >= pod.memory for s in self.pool.shapes):
                return False
            self.waiting_builds.append(pod.id)
        return True

    def _on_finish(self, t: float, ref: int) -> None:
        """Build pod ``ref`` ends: its room goes to the waiting pods."""
        self.last_finish = max(self.last_finish, t)
        self._unbind(self.pods[ref])
        self._drain_waiting()

    def _on_ready(self, t: float, ref: int) -> None:
        """Node ``ref`` is ready (unless removed meanwhile): it takes the waiting pods."""
        node = self.nodes[ref]
        if node.removed is not None:
            return
        node.ready = True
        if self._empty(node):
            self._became_empty(node)
        self._drain_waiting()

    def _on_idle(self, t: float, ref: int) -> None:
        """Node ``ref``'s idle timer: remove it if it stayed empty that long; its expendable ballast waits."""
        node = self.nodes[ref]
        if not self._removable(node, t):
            return
        node.removed = t
        if node.ballast:  # expendable ballast does not keep the node: it is evicted
            for victim in list(node.ballast):
                self._unbind(self.pods[victim])
                self.waiting_ballast.append(victim)
            node.idle_since = None
            self._drain_waiting()

    def _removable(self, node: Node, t: float) -> bool:
        return (
            node.removed is None
            and node.ready
            and node.idle_since is not None
            and t - node.idle_since >= self.pool.scale_down_idle - 1e-9
            and len(self._live()) > self.pool.min_nodes
        )


def simulate(
    builds: Sequence[Build],
    pool: Pool,
    scenario: Scenario,
    *,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
) -> tuple[dict[str, Any], list[tuple[float, int, float, float]]]:
    """One scenario: the report and the timeline ``(t, live nodes, cpu allocation, memory allocation)``."""
    sim = Simulation(sorted(builds, key=lambda b: b.start), pool, scenario, seed)
    report = sim.run(progress)
    return report, sim.timeline
