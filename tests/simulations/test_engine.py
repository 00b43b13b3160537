"""The fleet simulator's engine on tiny scenarios worked by hand for every metric, each event kind's
handler, and determinism.

Times in seconds; CPU in millicores. Nodes of 4000m/16Gi; builds of 1000m/1Gi unless said."""

from __future__ import annotations

from typing import Any

import pytest

from service import simulations as simulate
from service.simulations import Ballast, Build, Event, Pool, Scenario, Shape, Simulation

from ..helpers import GIB, MIB

NODE = Shape("n", 4000, 16 * GIB, 2.0)


def b(start: float, duration: float, cpu: int = 1000, memory: int = GIB) -> Build:
    return Build(start, duration, cpu, memory)


# A runs 0-1000; B 10-110; C 200-300. Two nodes ready at 0, none kept at minimum.
TRICKLE = [b(0, 1000), b(10, 100), b(200, 100)]
TWO_NODES = Pool(shapes=(NODE,), initial_nodes=2, provision_delay=60, scale_down_idle=300)


def run(
    builds: list[Build], pool: Pool, profile: str, ballast_pods: Ballast | None = None, seed: int = 1
) -> dict[str, Any]:
    report, _ = simulate.simulate(builds, pool, Scenario(profile, profile, ballast_pods), seed=seed)
    return report


def test_spread_keeps_both_nodes_longer() -> None:
    # spread: A on X; B to the empty Y; Y empty at 110, C comes back to Y at 200 (Y still idle < 300 s),
    # Y empty at 300 -> removed at 600. X runs A alone 0-1000. Node-seconds 1000 + 600 = 1600.
    r = run(TRICKLE, TWO_NODES, "spread")
    assert r["node_hours"] == pytest.approx(1600 / 3600, abs=1e-4)
    assert r["cost"] == pytest.approx(1600 / 3600 * 2.0, abs=1e-4)
    # CPU: 0-10 1/8, 10-110 2/8, 110-200 1/8, 200-300 2/8, 300-600 1/8, 600-1000 1/4 (one node left)
    assert r["cpu_allocation"]["mean"] == pytest.approx(0.2, abs=1e-4)
    assert r["cpu_allocation"]["p95"] == 0.25
    assert r["memory_allocation"]["mean"] == pytest.approx(0.2 / 4, abs=1e-4)  # 1Gi of 16Gi vs 1000m of 4000m
    # A alone on X for 1000 s > the 300 s idle time: one node held by a lone build; B and C alone on
    # Y for 100 s each do not count
    assert r["nodes_blocked_by_single_build"] == 1
    assert r["single_build_node_hours"] == pytest.approx(1000 / 3600, abs=1e-4)
    assert (r["waited"], r["start_delay_seconds"]["p95"], r["peak_nodes"], r["nodes_launched"]) == (0, 0.0, 2, 2)


def test_bin_pack_frees_a_node() -> None:
    # ci-bin-pack: A, B and C share X; Y is empty from 0 and removed at 300. Node-seconds 1000 + 300.
    r = run(TRICKLE, TWO_NODES, "ci-bin-pack")
    assert r["node_hours"] == pytest.approx(1300 / 3600, abs=1e-4)
    # CPU: 0-10 1/8, 10-110 2/8, 110-200 1/8, 200-300 2/8 (both nodes), 300-1000 1/4 -> 237.5/1000
    assert r["cpu_allocation"]["mean"] == pytest.approx(0.2375, abs=1e-4)
    # lone episodes on X: 0-10, 110-200, 300-1000 (700 s, the only one past 300 s)
    assert r["nodes_blocked_by_single_build"] == 1
    assert r["single_build_node_hours"] == pytest.approx(700 / 3600, abs=1e-4)


def test_waiting_for_the_autoscaler() -> None:
    # no node: A at 0 launches one (ready at 60); B at 10 fits on it (covered, no second node);
    # C (3000m) at 20 does not fit beside them: a second node, ready at 80. Waits 60, 50, 60.
    pool = Pool(shapes=(NODE,), provision_delay=60, scale_down_idle=300)
    r = run([b(0, 600), b(10, 600), b(20, 1200, cpu=3000)], pool, "spread")
    assert (r["waited"], r["nodes_launched"], r["peak_nodes"]) == (3, 2, 2)
    assert r["start_delay_seconds"] == {"p50": 60.0, "p95": 60.0, "max": 60.0}
    # node 0: launched 0, empty at 660, removed 960; node 1: launched 20, runs C 80-1280
    assert r["node_hours"] == pytest.approx((960 + 1260) / 3600, abs=1e-4)


#: an autoscaler whose --expendable-pods-priority-cutoff is below cf-runtime's ballast priority (SA3)
CUTOFF_BELOW_BALLAST = -1_000_001


def test_ballast_is_preempted_so_the_build_starts_at_once() -> None:
    # one ballast pod the size of a node, with an autoscaler that scales for it: placed when the
    # first node is ready (60). The build at 100 evicts it and starts at once; the ballast waits for
    # a second node (launched 100, ready 160).
    pool = Pool(shapes=(NODE,), provision_delay=60, scale_down_idle=300, expendable_cutoff=CUTOFF_BELOW_BALLAST)
    builds = [b(100, 200)]
    with_ballast = run(builds, pool, "spread", Ballast(1, 4000, 16 * GIB))
    assert (with_ballast["waited"], with_ballast["preemptions"], with_ballast["nodes_launched"]) == (0, 1, 2)
    # node-seconds: 0-300 and 100-300 (the run ends with the last build)
    assert with_ballast["node_hours"] == pytest.approx(500 / 3600, abs=1e-4)
    without = run(builds, pool, "spread")
    assert (without["waited"], without["start_delay_seconds"]["max"], without["nodes_launched"]) == (1, 60.0, 1)
    # the build starts at 160 and ends at 360; its node was launched at 100
    assert without["node_hours"] == pytest.approx(260 / 3600, abs=1e-4)


def test_max_nodes_and_unschedulable() -> None:
    # a build bigger than every shape is counted, not run; with max_nodes 1 the second build waits
    # for the first to finish (0-100), then starts at 100
    pool = Pool(shapes=(NODE,), initial_nodes=1, max_nodes=1, provision_delay=60, scale_down_idle=300)
    r = run([b(0, 100, cpu=4000), b(5, 50, cpu=4000), b(6, 10, cpu=8000)], pool, "spread")
    assert r["unschedulable"] == 1
    assert r["start_delay_seconds"]["max"] == pytest.approx(95.0)
    assert r["nodes_launched"] == 1


def test_max_nodes_counts_each_launch_once() -> None:
    # two node-sized ballast pods wait at the start with max_nodes 2: both nodes launch at 0 (not the
    # second only when the first is ready). A build at 90 evicts one and runs 100 s: the run ends at
    # 190 and both nodes were billed from 0, 380 node-seconds
    pool = Pool(
        shapes=(NODE,), max_nodes=2, provision_delay=60, scale_down_idle=300, expendable_cutoff=CUTOFF_BELOW_BALLAST
    )
    r = run([b(90, 100, cpu=4000)], pool, "spread", Ballast(2, 4000, 16 * GIB))
    assert (r["nodes_launched"], r["waited"], r["preemptions"]) == (2, 0, 1)
    assert r["node_hours"] == pytest.approx(380 / 3600, abs=1e-4)


def test_sa3_stock_autoscaler_ignores_the_ballast() -> None:
    # SA3 (cluster-autoscaler core/utils/expendable.go; default cutoff -10 in its main.go flags):
    # cf-runtime's ballast runs at -1000000 (charts/cf-runtime/templates/ballast/priority-class.yaml),
    # strictly below the cutoff, so the waiting ballast brings no node: the run is the one without it
    pool = Pool(shapes=(NODE,), provision_delay=60, scale_down_idle=300)
    with_ballast = run([b(100, 200)], pool, "spread", Ballast(1, 4000, 16 * GIB))
    without = run([b(100, 200)], pool, "spread")
    assert (with_ballast["waited"], with_ballast["preemptions"], with_ballast["nodes_launched"]) == (1, 0, 1)
    assert with_ballast["node_hours"] == without["node_hours"]
    assert (with_ballast["ballast"]["priority"], with_ballast["ballast"]["expendable"]) == (-1_000_000, True)
    # a ballast at the cutoff itself is not expendable ("strictly below")
    at_cutoff = run([b(100, 200)], pool, "spread", Ballast(1, 4000, 16 * GIB, priority=-10))
    assert (at_cutoff["waited"], at_cutoff["nodes_launched"]) == (0, 2)
    # nor does expendable ballast keep a node: one initial node holding only ballast goes after the
    # idle time (300 s) although the ballast sits on it; a build at 1000 then waits for a new node
    pool = Pool(shapes=(NODE,), initial_nodes=1, provision_delay=60, scale_down_idle=300)
    r = run([b(1000, 100)], pool, "spread", Ballast(1, 1000, GIB))
    assert (r["waited"], r["nodes_launched"]) == (1, 2)
    kept = run([b(1000, 100)], pool, "spread", Ballast(1, 1000, GIB, priority=0))
    assert (kept["waited"], kept["nodes_launched"]) == (0, 1)


def test_sa1_limit_aware_sees_the_sizers_limits() -> None:
    # SA1: a pod carries the limits the sizer would give it: rule S12 rounds a 1200m request up to a
    # 1500m limit and 1000Mi to 1Gi. Two nodes, one running a build whose limit is far above its
    # request (given: 500m request, 3500m limit): limit-aware avoids it, spread (requests) does not.
    pool = Pool(shapes=(NODE,), initial_nodes=2, provision_delay=60, scale_down_idle=300)
    assert Build(0, 1, 1200, 1000 * MIB).limits() == (1500, GIB)
    builds = [Build(0, 1000, 500, GIB, cpu_limit=3500), Build(10, 100, 1000, GIB), Build(20, 100, 1000, GIB)]
    for profile in ("spread", "limit-aware"):
        report, _ = simulate.simulate(builds, pool, Scenario(profile, profile), seed=1)
        assert report["builds"] == 3
    sim = Simulation(builds, pool, Scenario("limit-aware", "limit-aware"), seed=1)
    sim.run()
    by_build = dict(enumerate(sim.placed_on))
    assert by_build[1] != by_build[0]  # the second build avoids the node whose limits are spoken for
    assert by_build[2] != by_build[0]  # and so does the third: 3500 + 1000 of 4000 vs 2000 of 4000
    sim = Simulation(builds, pool, Scenario("spread", "spread"), seed=1)
    sim.run()
    by_build = dict(enumerate(sim.placed_on))
    # spread sees requests only: after build 1 lands on the empty node, build 2 returns to the first
    # (500m + 1000m requested vs 1000m)
    assert by_build[2] == by_build[0]


def test_same_input_same_output() -> None:
    builds = simulate.synthetic(days=1, builds_per_day=800, seed=3)
    assert builds == simulate.synthetic(days=1, builds_per_day=800, seed=3)
    assert builds != simulate.synthetic(days=1, builds_per_day=800, seed=4)
    pool = Pool(shapes=(Shape("m", 8000, 32 * GIB, 0.4),))
    scenarios = simulate.scenarios_for(["spread", "ci-bin-pack"], Ballast(2, 2000, 4 * GIB))
    first = simulate.run_all(builds, pool, scenarios, seed=9)
    assert first == simulate.run_all(builds, pool, scenarios, seed=9)
    assert [s["scenario"] for s in first["scenarios"]] == [
        "spread",
        "ci-bin-pack",
        "spread + ballast",
        "ci-bin-pack + ballast",
    ]
    # the claim of 004, on this trace: packing needs fewer node-hours than spreading
    by = {s["scenario"]: s for s in first["scenarios"]}
    assert by["ci-bin-pack"]["node_hours"] < by["spread"]["node_hours"]


def test_every_event_kind_has_a_handler_and_each_moves_the_state() -> None:
    # one node shape, none at first, nodes come 60 s after launch and go after 300 s empty.
    # A (0-100 once placed) launches node 0, which is READY at 60, empty for an instant (an IDLE
    # timer for 360) and takes A: A runs 60-160 (FINISH). The timer at 360 finds the node busy since
    # and leaves it; node 0 is empty from 160 and the timer at 460 removes it. B at 500 launches
    # node 1 (ready 560, B runs 560-660); node 1's timers fall after the last build: not simulated.
    pool = Pool(shapes=(NODE,), provision_delay=60, scale_down_idle=300)
    sim = Simulation([b(0, 100), b(500, 100)], pool, Scenario("spread", "spread"), seed=1)
    names = {kind: handler.__name__ for kind, handler in sim.handlers.items()}
    assert names == {k: f"_on_{k.name.lower()}" for k in Event}  # the table is complete, one handler a kind

    def state() -> tuple[Any, ...]:
        nodes = tuple((n.ready, n.removed) for n in sim.nodes)
        return sim.arrived, len(sim.pods), sim.running, sim.last_finish, nodes

    calls: list[tuple[Event, float, int, tuple[Any, ...], tuple[Any, ...]]] = []

    def recording(kind: Event) -> Any:
        handler = sim.handlers[kind]

        def record(t: float, ref: int) -> None:
            before = state()
            handler(t, ref)
            calls.append((kind, t, ref, before, state()))

        return record

    sim.handlers = {kind: recording(kind) for kind in sim.handlers}
    report = sim.run()
    assert [(kind, t, ref) for kind, t, ref, _, _ in calls] == [
        (Event.ARRIVE, 0, 0),
        (Event.READY, 60, 0),
        (Event.FINISH, 160, 0),
        (Event.IDLE, 360, 0),
        (Event.IDLE, 460, 0),
        (Event.ARRIVE, 500, 1),
        (Event.READY, 560, 1),
        (Event.FINISH, 660, 1),
    ]
    for kind, t, ref, (arrived, pods, running, last, nodes), after in calls:
        if kind == Event.ARRIVE:  # one more build arrived, as a pod, waiting for the node it launched
            assert after[:3] == (arrived + 1, pods + 1, running)
            assert len(after[4]) == len(nodes) + 1
        elif kind == Event.READY:  # the node is ready and takes the waiting build
            assert (nodes[ref][0], after[4][ref][0], after[2]) == (False, True, running + 1)
        elif kind == Event.FINISH:  # the build leaves; the last finish moves
            assert after[2] == running - 1
            assert after[3] == t > last
        elif t == 360:  # IDLE, stale: the node took a build after the timer was set
            assert after == (arrived, pods, running, last, nodes)
        else:  # IDLE: the node empty for the idle time is removed
            assert (nodes[ref][1], after[4][ref][1]) == (None, t)
    assert (report["waited"], report["nodes_launched"], report["peak_nodes"]) == (2, 2, 1)
    # node 0 billed 0-460, node 1 500-660
    assert report["node_hours"] == pytest.approx((460 + 160) / 3600, abs=1e-4)
