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
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlmodel import col

from service import core
from service.ballast import service as ballast
from service.console import table
from service.keys import ScopeKey
from service.placement import scoring as placement
from service.plots import line_panels, step_series
from service.quantity import format_cpu, format_memory
from service.sizing import service as sizing_service
from service.sizing.answer import Answer
from service.tables import RunContainer

FINISH, READY, ARRIVE, IDLE = 0, 1, 2, 3  # the order of events at the same instant


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
class _Node:
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
class _Pod:
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
        self.events: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.nodes: list[_Node] = []
        self.pods: list[_Pod] = []
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

    # ------------------------------------------------------------------ events

    def _push(self, t: float, kind: int, ref: int) -> None:
        heapq.heappush(self.events, (t, kind, self.seq, ref))
        self.seq += 1

    def _live(self) -> list[_Node]:
        return [n for n in self.nodes if n.removed is None]

    def _launch(self, shape: Shape, *, ready_now: bool = False) -> _Node:
        node = _Node(len(self.nodes), shape, self.now, self.now if ready_now else self.now + self.pool.provision_delay)
        self.nodes.append(node)
        if ready_now:
            node.ready = True
            self._became_empty(node)
        else:
            self._push(node.ready_at, READY, node.id)
        return node

    # ------------------------------------------------------------------ placing

    def _pick(self, pod: _Pod) -> _Node | None:
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

    def _bind(self, pod: _Pod, node: _Node) -> None:
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
            self._push(self.now + self.builds[pod.build].duration, FINISH, pod.id)
        self._lone_check(node)

    def _unbind(self, pod: _Pod) -> _Node:
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

    def _empty(self, node: _Node) -> bool:
        """No pod that keeps the node: no build, and no ballast unless it is expendable (SA3)."""
        return not node.builds and (not node.ballast or self.expendable)

    def _became_empty(self, node: _Node) -> None:
        node.idle_since = self.now
        self._push(self.now + self.pool.scale_down_idle, IDLE, node.id)

    def _note_lone(self, node: _Node) -> None:
        """Close a single-build episode before the node's pods change."""
        if node.lone_since is not None:
            length = self.now - node.lone_since
            if length > self.pool.scale_down_idle:
                self.lone.append(length)
            node.lone_since = None

    def _lone_check(self, node: _Node) -> None:
        if len(node.builds) == 1 and (not node.ballast or self.expendable):
            node.lone_since = self.now

    def _preempt(self, pod: _Pod) -> bool:
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
        for i, b in enumerate(self.builds):
            self._push(b.start, ARRIVE, i)
        for _ in range(max(self.pool.initial_nodes, self.pool.min_nodes)):
            self._launch(self.pool.shapes[0], ready_now=True)
        if self.scenario.ballast is not None:
            for _ in range(self.scenario.ballast.replicas):
                bal = self.scenario.ballast
                pod = _Pod(len(self.pods), bal.cpu, bal.memory, None, lim_cpu=bal.cpu, lim_mem=bal.memory)
                self.pods.append(pod)
                self.waiting_ballast.append(pod.id)
            self._drain_waiting()
        arrived = 0
        total = len(self.builds)
        last_finish = 0.0
        while self.events:
            t, kind, _, ref = heapq.heappop(self.events)
            if kind == IDLE and arrived == total and not self.running and not self.waiting_builds:
                continue  # after the last build: the tail of idle timers is not simulated
            self._sample(t)
            self.now = t
            if kind == ARRIVE:
                arrived += 1
                b = self.builds[ref]
                lim_cpu, lim_mem = b.limits()
                pod = _Pod(len(self.pods), b.cpu, b.memory, ref, lim_cpu=lim_cpu, lim_mem=lim_mem)
                self.pods.append(pod)
                node = self._pick(pod)
                if node is not None:
                    self._bind(pod, node)
                elif not (self.scenario.ballast is not None and self._preempt(pod)):
                    if not any(s.cpu >= b.cpu and s.memory >= b.memory for s in self.pool.shapes):
                        self.unschedulable += 1
                        self.placed_at[ref] = math.nan
                        continue
                    self.waiting_builds.append(pod.id)
                self._drain_waiting()
                if progress is not None and (arrived % 500 == 0 or arrived == total):
                    progress(arrived / total)
            elif kind == FINISH:
                last_finish = max(last_finish, t)
                self._unbind(self.pods[ref])
                self._drain_waiting()
            elif kind == READY:
                node = self.nodes[ref]
                if node.removed is None:
                    node.ready = True
                    if self._empty(node):
                        self._became_empty(node)
                    self._drain_waiting()
            elif kind == IDLE:
                node = self.nodes[ref]
                if (
                    node.removed is None
                    and node.ready
                    and node.idle_since is not None
                    and t - node.idle_since >= self.pool.scale_down_idle - 1e-9
                    and len(self._live()) > self.pool.min_nodes
                ):
                    node.removed = t
                    if node.ballast:  # expendable ballast does not keep the node: it is evicted
                        for victim in list(node.ballast):
                            self._unbind(self.pods[victim])
                            self.waiting_ballast.append(victim)
                        node.idle_since = None
                        self._drain_waiting()
        end = max([last_finish, *(b.start for b in self.builds)], default=0.0)
        self.now = max(self.now, end)
        for n in self.nodes:
            self._note_lone(n)
        return self._report(end)

    def _report(self, end: float) -> dict[str, Any]:
        hours = 0.0
        cost = 0.0
        for n in self.nodes:
            life = (min(n.removed, end) if n.removed is not None else end) - n.launched
            life = max(0.0, life)
            hours += life / 3600
            cost += life / 3600 * n.shape.price_per_hour
        segs = [(t1 - t0, cpu, mem) for t0, t1, cpu, mem, alloc, _ in self.segments if alloc > 0 and t1 <= end]
        cpu_segments = [(d, c) for d, c, _ in segs]
        mem_segments = [(d, m) for d, _, m in segs]
        span = sum(d for d, _, _ in segs)
        waits = [
            (p - b.start)
            for b, p in zip(self.builds, self.placed_at, strict=True)
            if p is not None and not math.isnan(p)
        ]
        return {
            "scenario": self.scenario.name,
            "profile": self.scenario.profile,
            "ballast": None
            if self.scenario.ballast is None
            else {
                "replicas": self.scenario.ballast.replicas,
                "cpu_millicores": self.scenario.ballast.cpu,
                "memory_bytes": self.scenario.ballast.memory,
                "priority": self.scenario.ballast.priority,
                "expendable": self.expendable,
            },
            "builds": len(self.builds),
            "unschedulable": self.unschedulable,
            "node_hours": round(hours, 4),
            "cost": round(cost, 4),
            "peak_nodes": max((s[5] for s in self.segments), default=0),
            "nodes_launched": len(self.nodes),
            "cpu_allocation": {
                "mean": round(sum(d * c for d, c in cpu_segments) / span, 4) if span else 0.0,
                "p95": round(weighted_quantile(cpu_segments, 0.95), 4),
            },
            "memory_allocation": {
                "mean": round(sum(d * m for d, m in mem_segments) / span, 4) if span else 0.0,
                "p95": round(weighted_quantile(mem_segments, 0.95), 4),
            },
            "waited": sum(1 for w in waits if w > 0),
            "start_delay_seconds": {
                "p50": round(quantile(waits, 0.5), 3),
                "p95": round(quantile(waits, 0.95), 3),
                "max": round(max(waits, default=0.0), 3),
            },
            "preemptions": self.preemptions,
            "nodes_blocked_by_single_build": len(self.lone),
            "single_build_node_hours": round(sum(self.lone) / 3600, 4),
        }


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


# --------------------------------------------------------------------------- synthetic traces


@dataclass(frozen=True)
class JobKind:
    """A kind of build in a synthetic trace: its share of builds, pod size and typical duration."""

    share: float
    cpu: int
    memory: int
    minutes: float


DEFAULT_KINDS = (
    JobKind(0.45, 1000, 2 * core.GIB, 6),  # unit tests, lint
    JobKind(0.30, 2000, 4 * core.GIB, 12),  # builds
    JobKind(0.15, 4000, 8 * core.GIB, 25),  # integration suites
    JobKind(0.10, 500, 1 * core.GIB, 2),  # small jobs: checks, notifications
)


def synthetic_from(spec: Any) -> list[Build]:
    """``synthetic`` with the fields of a ``SyntheticSpec``."""
    return synthetic(
        days=spec.days,
        builds_per_day=spec.builds_per_day,
        seed=spec.seed,
        peak_hour=spec.peak_hour,
        weekend_factor=spec.weekend_factor,
        bursts_per_day=spec.bursts_per_day,
    )


def synthetic(
    *,
    days: float = 7,
    builds_per_day: float = 1500,
    seed: int = 0,
    peak_hour: float = 14.0,
    weekend_factor: float = 0.2,
    night_factor: float = 0.1,
    bursts_per_day: float = 6,
    burst_size: tuple[int, int] = (5, 20),
    kinds: Sequence[JobKind] = DEFAULT_KINDS,
) -> list[Build]:
    """Builds over ``days`` from a Monday 00:00: a daily cycle peaking at ``peak_hour`` (a Gaussian
    of 3 hours over a ``night_factor`` floor), weekends at ``weekend_factor``, Poisson arrivals by
    thinning, and bursts (a push that starts ``burst_size`` builds within a minute) during working
    hours. Durations are log-normal around each kind's typical minutes (sigma 0.4)."""
    rng = random.Random(seed)
    total_weight = sum(k.share for k in kinds)

    def rate(t: float) -> float:  # relative, 0..1
        day, hour = divmod(t / 3600, 24)
        daily = night_factor + (1 - night_factor) * math.exp(-(((hour - peak_hour) / 3.0) ** 2))
        return daily * (weekend_factor if int(day) % 7 >= 5 else 1.0)

    mean_rate = sum(rate(h * 3600 + 1800) for h in range(24 * 7)) / (24 * 7)
    peak_per_second = builds_per_day / 86400 / mean_rate
    builds: list[Build] = []

    def one(t: float) -> Build:
        x = rng.random() * total_weight
        kind = kinds[-1]
        for k in kinds:
            x -= k.share
            if x < 0:
                kind = k
                break
        duration = kind.minutes * 60 * math.exp(rng.gauss(0, 0.4))
        return Build(round(t, 3), round(max(30.0, duration), 3), kind.cpu, kind.memory)

    horizon = days * 86400
    t = 0.0
    while True:
        t += rng.expovariate(peak_per_second)
        if t >= horizon:
            break
        if rng.random() < rate(t):
            builds.append(one(t))
    t = 0.0
    while bursts_per_day > 0:
        t += rng.expovariate(bursts_per_day / 86400)
        if t >= horizon:
            break
        if rng.random() < rate(t):
            for _ in range(rng.randint(*burst_size)):
                builds.append(one(t + rng.random() * 60))
    builds.sort(key=lambda b: b.start)
    return builds


# --------------------------------------------------------------------------- scenarios side by side


def auto_ballast(builds: Sequence[Build], provision_delay: float, coverage: float = ballast.COVERAGE) -> Ballast:
    """The ballast advice on a trace: the most common pod size, the replicas that cover
    ``coverage`` of the bursts (SA2), at cf-runtime's priority."""
    size = ballast.most_common_size((b.cpu, b.memory) for b in builds) or (0, 0)
    count, _ = ballast.replicas(ballast.bursts((b.start for b in builds), provision_delay), coverage)
    return Ballast(count, size[0], size[1])


def scenarios_for(profiles: Sequence[str], ballast: Ballast | None) -> list[Scenario]:
    out = [Scenario(p, p) for p in profiles]
    if ballast is not None and ballast.replicas > 0:
        out += [Scenario(f"{p} + ballast", p, ballast) for p in profiles]
    return out


def run_all(
    builds: Sequence[Build],
    pool: Pool,
    scenarios: Sequence[Scenario],
    *,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
    every: float = 900.0,
) -> dict[str, Any]:
    """Every scenario on the same trace: the reports side by side and each one's timeline
    (live nodes and CPU allocation, the maximum over each ``every`` seconds)."""
    reports = []
    timelines: dict[str, dict[str, list[list[float]]]] = {}
    end = max((b.start + b.duration for b in builds), default=0.0)
    for k, sc in enumerate(scenarios):

        def part(f: float, k: int = k) -> None:
            if progress is not None:
                progress((k + f) / len(scenarios))

        report, timeline = simulate(builds, pool, sc, seed=seed, progress=part)
        reports.append(report)
        nodes = step_series([(t, float(n)) for t, n, _, _ in timeline], end, every)
        cpu = step_series([(t, c) for t, _, c, _ in timeline], end, every)
        timelines[sc.name] = {
            "nodes": [[t, v] for t, v in nodes],
            "cpu_allocation": [[t, round(v, 4)] for t, v in cpu],
        }
    if progress is not None:
        progress(1.0)
    return {
        "trace": {
            "builds": len(builds),
            "hours": round(end / 3600, 2),
        },
        "pool": {
            "shapes": [vars(s) for s in pool.shapes],
            "provision_delay_seconds": pool.provision_delay,
            "scale_down_idle_seconds": pool.scale_down_idle,
            "expendable_pods_priority_cutoff": pool.expendable_cutoff,
            "min_nodes": pool.min_nodes,
            "max_nodes": pool.max_nodes,
        },
        "scenarios": reports,
        "timelines": timelines,
    }


def render(result: dict[str, Any]) -> str:
    """The comparison as a table: one column per scenario."""
    scs = result["scenarios"]
    rows: list[list[object]] = []

    def row(label: str, get: Callable[[dict[str, Any]], object]) -> None:
        rows.append([label, *(get(s) for s in scs)])

    def ballast(s: dict[str, Any]) -> str:
        b = s["ballast"]
        if b is None:
            return "-"
        return f"{b['replicas']} x {format_cpu(b['cpu_millicores'])}/{format_memory(b['memory_bytes'])}"

    row("ballast pods", ballast)
    row("node-hours", lambda s: f"{s['node_hours']:.1f}")
    row("cost", lambda s: f"{s['cost']:.2f}")
    row("peak nodes", lambda s: s["peak_nodes"])
    row("nodes launched", lambda s: s["nodes_launched"])
    row("CPU allocation mean / p95", lambda s: f"{s['cpu_allocation']['mean']:.0%} / {s['cpu_allocation']['p95']:.0%}")
    row(
        "memory allocation mean / p95",
        lambda s: f"{s['memory_allocation']['mean']:.0%} / {s['memory_allocation']['p95']:.0%}",
    )
    row("builds that waited", lambda s: f"{s['waited']} of {s['builds']}")
    row(
        "start delay p50 / p95 / max (s)",
        lambda s: "{p50:.0f} / {p95:.0f} / {max:.0f}".format(**s["start_delay_seconds"]),
    )
    row("ballast preemptions", lambda s: s["preemptions"])
    row("nodes held by a lone build", lambda s: s["nodes_blocked_by_single_build"])
    row("  their node-hours", lambda s: f"{s['single_build_node_hours']:.1f}")
    head = f"{result['trace']['builds']} builds over {result['trace']['hours']} h"
    return head + "\n\n" + table(["", *(s["scenario"] for s in scs)], rows, right=tuple(range(1, len(scs) + 1)))


def plot(result: dict[str, Any]) -> str:
    """Node count and CPU allocation over time, one line per scenario (SVG)."""
    tl = result["timelines"]
    return line_panels(
        f"{result['trace']['builds']} builds: nodes and CPU allocation over time",
        [
            ("live nodes", {name: [(t, v) for t, v in s["nodes"]] for name, s in tl.items()}),
            (
                "CPU allocation (build requests / allocatable)",
                {name: [(t, v) for t, v in s["cpu_allocation"]] for name, s in tl.items()},
            ),
        ],
    )


async def load_trace(
    *,
    conn: AsyncConnection,
    org: str,
    since: datetime,
    until: datetime,
    sizes: str,
    policy: sizing_service.Policy,
    default_duration: float = 600.0,
) -> tuple[list[Build], dict[str, Any]]:
    """The org's runs that finished in the window, as builds: start (``started_at``, else the
    finish minus ``default_duration``), duration, and the pod size (``recommended`` or ``recorded``)."""
    rows = await ballast.org_runs(conn=conn, org=org, since=since, until=until)
    if sizes == "recommended":
        keys = {r.id: ScopeKey(r.org, r.repo, r.workflow, r.job) for r in rows}
        answers = await sizing_service.fetch_many(conn=conn, keys=list(dict.fromkeys(keys.values())), policy=policy)
        size = {rid: answers[k].pod_requests() for rid, k in keys.items()}
        limits = {rid: pod_limits(answers[k]) for rid, k in keys.items()}
    else:
        size = await recorded_sizes(conn=conn, run_ids=[r.id for r in rows])
        limits = {}
    starts = [r.started_at or r.finished_at - timedelta(seconds=default_duration) for r in rows]
    t0 = min(starts, default=since)
    builds = [
        Build(
            (s - t0).total_seconds(),
            max(1.0, (r.finished_at - s).total_seconds()),
            *size.get(r.id, (0, 0)),
            *limits.get(r.id, (-1, -1)),
        )
        for r, s in zip(rows, starts, strict=True)
    ]
    return builds, {
        "runs": len(rows),
        "without_start": sum(r.started_at is None for r in rows),
        "t0": t0.isoformat() + "Z",
    }


def pod_limits(answer: Answer) -> tuple[int, int]:
    """The limits the sizer gives the job's pod, summed (SA1): the CPU limit as enforce mode sets
    it (observe sets none, which limit-aware would count as a whole node), the memory limit."""
    cs = answer.containers
    return sum(c.cpu.limit_millicores for c in cs), sum(c.memory.limit_bytes for c in cs)


async def recorded_sizes(*, conn: AsyncConnection, run_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Per run, what it recorded: CPU peak and the reported memory limit (else the memory peak), summed."""
    out: dict[int, tuple[int, int]] = {}
    for chunk in range(0, len(run_ids), 500):
        rows = await conn.execute(
            select(
                col(RunContainer.run_pk),
                col(RunContainer.cpu_peak),
                col(RunContainer.memory_peak_bytes),
                col(RunContainer.memory_limit_bytes),
            ).where(col(RunContainer.run_pk).in_(run_ids[chunk : chunk + 500]))
        )
        for r in rows:
            cpu, mem = out.get(r.run_pk, (0, 0))
            out[r.run_pk] = (cpu + int(-(-r.cpu_peak // 1)), mem + (r.memory_limit_bytes or r.memory_peak_bytes))
    return out
