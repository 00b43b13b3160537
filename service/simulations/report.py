"""What a simulation reports: one scenario's figures (``scenario_report``), and the scenarios side
by side as a table (``render``) and as an SVG of nodes and CPU allocation over time (``plot``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from service.console import table
from service.plots import line_panels
from service.quantity import format_cpu, format_memory
from service.simulations.model import quantile, weighted_quantile

if TYPE_CHECKING:
    from service.simulations.engine import Simulation


def scenario_report(sim: Simulation, end: float) -> dict[str, Any]:
    """One scenario's figures once its events ran out, up to ``end`` (the last finish or arrival)."""
    hours = 0.0
    cost = 0.0
    for n in sim.nodes:
        life = (min(n.removed, end) if n.removed is not None else end) - n.launched
        life = max(0.0, life)
        hours += life / 3600
        cost += life / 3600 * n.shape.price_per_hour
    segs = [(t1 - t0, cpu, mem) for t0, t1, cpu, mem, alloc, _ in sim.segments if alloc > 0 and t1 <= end]
    cpu_segments = [(d, c) for d, c, _ in segs]
    mem_segments = [(d, m) for d, _, m in segs]
    span = sum(d for d, _, _ in segs)
    waits = [
        (p - b.start) for b, p in zip(sim.builds, sim.placed_at, strict=True) if p is not None and not math.isnan(p)
    ]
    return {
        "scenario": sim.scenario.name,
        "profile": sim.scenario.profile,
        "ballast": None
        if sim.scenario.ballast is None
        else {
            "replicas": sim.scenario.ballast.replicas,
            "cpu_millicores": sim.scenario.ballast.cpu,
            "memory_bytes": sim.scenario.ballast.memory,
            "priority": sim.scenario.ballast.priority,
            "expendable": sim.expendable,
        },
        "builds": len(sim.builds),
        "unschedulable": sim.unschedulable,
        "node_hours": round(hours, 4),
        "cost": round(cost, 4),
        "peak_nodes": max((s[5] for s in sim.segments), default=0),
        "nodes_launched": len(sim.nodes),
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
        "preemptions": sim.preemptions,
        "nodes_blocked_by_single_build": len(sim.lone),
        "single_build_node_hours": round(sum(sim.lone) / 3600, 4),
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
