"""Fleet simulations as the API and the CLI run them: a ``SimulationCreate`` turned into the pool
and the ballast (``pool_of``, ``ballast_of``), the scenarios (each profile, with and without
ballast), and every scenario on the same trace side by side (``run_all``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from service.ballast import service as ballast_service
from service.plots import step_series
from service.simulations.engine import simulate
from service.simulations.model import Ballast, Build, Pool, Scenario, Shape
from service.simulations.schemas import SimulationCreate


def pool_of(body: SimulationCreate) -> Pool:
    """The node pool a simulation request describes."""
    p = body.pool
    return Pool(
        shapes=tuple(Shape(s.name, s.cpu, s.memory, s.price_per_hour) for s in p.shapes),
        initial_nodes=p.initial_nodes,
        min_nodes=p.min_nodes,
        max_nodes=p.max_nodes,
        provision_delay=p.provision_delay_seconds,
        scale_down_idle=p.scale_down_idle_seconds,
        expendable_cutoff=p.expendable_pods_priority_cutoff,
    )


def ballast_of(body: SimulationCreate, builds: list[Build], provision_delay: float) -> Ballast | None:
    """The ballast a simulation request asks for: none, ``auto`` (sized from the trace), or the
    given replicas with each size left out taken from ``auto``."""
    if body.ballast is None:
        return None
    auto = auto_ballast(builds, provision_delay, body.ballast_coverage)
    if body.ballast == "auto":
        return auto
    return Ballast(
        body.ballast.replicas,
        auto.cpu if body.ballast.cpu is None else body.ballast.cpu,
        auto.memory if body.ballast.memory is None else body.ballast.memory,
        body.ballast.priority,
    )


def auto_ballast(
    builds: Sequence[Build], provision_delay: float, coverage: float = ballast_service.COVERAGE
) -> Ballast:
    """The ballast advice on a trace: the most common pod size, the replicas that cover
    ``coverage`` of the bursts (SA2), at cf-runtime's priority."""
    size = ballast_service.most_common_size((b.cpu, b.memory) for b in builds) or (0, 0)
    count, _ = ballast_service.replicas(ballast_service.bursts((b.start for b in builds), provision_delay), coverage)
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
