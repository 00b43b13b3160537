"""Placement (``shared/spec/placement.md``): the vectors PV1-PV7 and hand-worked cases on both
core backends through ``services.placement.advise``, and hypothesis checks that the compiled
``score_nodes`` gives the reference's answers."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.models import PlacementAdvise
from service.services import placement

from .conftest import PURE, compiled

REF = importlib.import_module("service.core._reference")
GIB = 1 << 30
MIB = 1 << 20


def advise(core: ModuleType, body: dict[str, Any]) -> dict[str, Any]:
    parsed = PlacementAdvise.model_validate(body)
    return placement.advise(parsed, parsed.pod, {"source": "given"}, scorer=core.score_nodes)


def worker(
    name: str, containers: int = 0, volumes: int = 0, local: int = 0, builds: int = 0, **kw: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "containers": containers,
        "volumes": volumes,
        "build_containers": builds,
        "volumes_held": [f"in{i}" for i in range(local)],
        **kw,
    }


INPUTS = ["in0", "in1", "in2"]
PV1_CHAIN = {
    "strategies": "limit-active-containers,limit-active-volumes,volume-locality,fewest-build-containers",
    "max_active_containers_per_worker": 200,
    "max_active_volumes_per_worker": 100,
}


def pv1_workers(w4_containers: int = 60) -> list[dict[str, Any]]:
    return [
        worker("w1", 201, 10, 3, 1),
        worker("w2", 50, 101, 3, 1),
        worker("w3", 50, 50, 2, 9),
        worker("w4", w4_containers, 60, 2, 4),
        worker("w5", 10, 10, 1, 0),
    ]


def test_pv1_chain(core: ModuleType) -> None:
    # PV1 (P1, P2, P3, P5): w1 > 200 containers and w2 > 100 volumes go; w3/w4 hold 2 of the inputs
    # (w5 only 1); of those, w4 has fewer build containers
    a = advise(core, {"nodes": pv1_workers(), "pod": {"inputs": INPUTS}, "chain": PV1_CHAIN, "seed": 1})
    assert (a["decision"], a["pick"], a["survivors"]) == ("place", "w4", ["w4"])
    assert [s["survivors"] for s in a["chain"]] == [
        ["w2", "w3", "w4", "w5"],
        ["w3", "w4", "w5"],
        ["w3", "w4"],
        ["w4"],
    ]


def test_pv2_exactly_at_the_limit_stays(core: ModuleType) -> None:
    # PV2 (P5): "more than M" drops; exactly 200 containers is kept
    a = advise(core, {"nodes": pv1_workers(200), "pod": {"inputs": INPUTS}, "chain": PV1_CHAIN, "seed": 1})
    assert a["pick"] == "w4"


def test_named_chain_is_the_documented_one(core: ModuleType) -> None:
    a = advise(
        core,
        {"nodes": pv1_workers(), "pod": {"inputs": INPUTS}, "chain": {**PV1_CHAIN, "strategies": "concourse-chained"}},
    )
    assert [s["strategy"] for s in a["chain"]] == PV1_CHAIN["strategies"].split(",")
    assert a["pick"] == "w4"


def test_pv3_fewest_build_containers_keeps_ties(core: ModuleType) -> None:
    # PV3 (P3, P1): w1 and w3 tie at 1; the pick is one of them, the same for the same seed
    nodes = [worker("w1", builds=1), worker("w2", builds=2), worker("w3", builds=1)]
    body = {"nodes": nodes, "pod": {}, "chain": {"strategies": ["fewest-build-containers"]}}
    a = advise(core, {**body, "seed": 7})
    assert a["survivors"] == ["w1", "w3"]
    assert a["pick"] in ("w1", "w3")
    assert advise(core, {**body, "seed": 7})["pick"] == a["pick"]
    picks = {advise(core, {**body, "seed": s})["pick"] for s in range(40)}
    assert picks == {"w1", "w3"}  # both survivors do get picked


def test_pv4_limit_active_tasks_waits(core: ModuleType) -> None:
    # PV4 (P4): max 1, both workers at 1 active task: a task step waits, it is not an error
    nodes = [worker("w1", active_tasks=1), worker("w2", active_tasks=1)]
    chain = {"strategies": ["limit-active-tasks"], "max_active_tasks_per_worker": 1}
    a = advise(core, {"nodes": nodes, "pod": {"step_type": "task"}, "chain": chain})
    assert (a["decision"], a["pick"]) == ("wait", None)
    assert "limit-active-tasks" in a["reason"]
    # get/put steps are never capped: they go to the fewest active tasks
    nodes[1]["active_tasks"] = 3
    for step_type in ("get", "put"):
        a = advise(core, {"nodes": nodes, "pod": {"step_type": step_type}, "chain": chain})
        assert (a["decision"], a["pick"]) == ("place", "w1")


def test_limit_active_tasks_zero_means_no_limit(core: ModuleType) -> None:
    # P4: max 0 = no cap; the fewest active tasks still wins
    nodes = [worker("w1", active_tasks=5), worker("w2", active_tasks=3)]
    a = advise(core, {"nodes": nodes, "pod": {}, "chain": {"strategies": ["limit-active-tasks"]}})
    assert a["pick"] == "w2"
    # P5: max 0 = no effect
    nodes = [worker("w1", containers=10_000, volumes=10_000)]
    a = advise(
        core, {"nodes": nodes, "pod": {}, "chain": {"strategies": ["limit-active-containers", "limit-active-volumes"]}}
    )
    assert a["pick"] == "w1"


def test_strategy_that_empties_the_set_is_named(core: ModuleType) -> None:
    # P6: limit-active-containers drops everyone -> wait, naming it
    nodes = [worker("w1", containers=5), worker("w2", containers=6)]
    chain = {"strategies": ["random", "limit-active-containers"], "max_active_containers_per_worker": 4}
    a = advise(core, {"nodes": nodes, "pod": {}, "chain": chain})
    assert a["decision"] == "wait"
    assert a["reason"].startswith("limit-active-containers left no worker")


# --------------------------------------------------------------------------- scoring vectors


def pv5_nodes() -> list[dict[str, Any]]:
    # two 8-CPU nodes; memory plays no part (weight 0, nothing requested)
    def pod(req: int, lim: int) -> dict[str, Any]:
        return {"requests": {"cpu": req, "memory": 0}, "limits": {"cpu": lim}}

    return [
        {"name": "node1", "allocatable": {"cpu": 8, "memory": "32Gi"}, "pods": [pod(2, 6), pod(2, 4)]},
        {"name": "node2", "allocatable": {"cpu": 8, "memory": "32Gi"}, "pods": [pod(3, 3), pod(2, 2)]},
    ]


NEW_POD = {"requests": {"cpu": 1, "memory": 0}, "limits": {"cpu": 4}}
CPU_ONLY = {"cpu": 1, "memory": 0}


def scores(a: dict[str, Any]) -> dict[str, tuple[float, int]]:
    return {c["name"]: (c["scores"][0]["raw"], c["scores"][0]["score"]) for c in a["candidates"]}


def test_pv5_limit_aware(core: ModuleType) -> None:
    # PV5 (P8): L = 6+4+4 = 14 -> (8-14)*100/8 = -75; L = 3+2+4 = 9 -> -12.5; min-max -> 0 / 100
    profile = {"scorers": [{"name": "limit-aware", "resources": CPU_ONLY}]}
    a = advise(core, {"nodes": pv5_nodes(), "pod": NEW_POD, "profile": profile, "seed": 3})
    assert scores(a) == {"node1": (-75.0, 0), "node2": (-12.5, 100)}
    assert a["pick"] == "node2"


def test_pv6_least_allocated(core: ModuleType) -> None:
    # PV6 (P7): requests 4+1 of 8 -> 3*100//8 = 37; 5+1 of 8 -> 2*100//8 = 25
    profile = {"scorers": [{"name": "least-allocated", "resources": CPU_ONLY}]}
    a = advise(core, {"nodes": pv5_nodes(), "pod": NEW_POD, "profile": profile})
    assert {k: v[1] for k, v in scores(a).items()} == {"node1": 37, "node2": 25}
    assert a["pick"] == "node1"
    # the built-in spread profile weighs memory too: 0 requested of 32Gi = 100 on both nodes... minus
    # the pod's 0 -> (37+100)//2 = 68 and (25+100)//2 = 62
    a = advise(core, {"nodes": pv5_nodes(), "pod": NEW_POD, "profile": "spread"})
    assert {c["name"]: c["total"] for c in a["candidates"]} == {"node1": 68, "node2": 62}


def test_pv7_smallest_node(core: ModuleType) -> None:
    # PV7 (P9): raw -4000, -8000, -16000 -> (x+16000)*100//12000 = 100, 66, 0
    nodes = [{"name": f"n{c}", "allocatable": {"cpu": f"{c}m", "memory": "64Gi"}} for c in (4000, 8000, 16000)]
    profile = {"scorers": [{"name": "smallest-node", "resources": CPU_ONLY}]}
    a = advise(core, {"nodes": nodes, "pod": {}, "profile": profile})
    assert [(c["name"], c["scores"][0]["score"]) for c in a["candidates"]] == [
        ("n4000", 100),
        ("n8000", 66),
        ("n16000", 0),
    ]


def test_ci_bin_pack_fills_the_smallest_then_the_fullest(core: ModuleType) -> None:
    # P10's ci-bin-pack: two 4-CPU nodes (one half full) and an 8-CPU one. Smallest-node x100 puts
    # both small nodes at 100 and the big one at 0; most-allocated breaks the tie for the fuller one.
    def node(name: str, cpu: int, used: int) -> dict[str, Any]:
        pods = [{"requests": {"cpu": used, "memory": "1Gi"}}] if used else []
        return {"name": name, "allocatable": {"cpu": cpu, "memory": "16Gi"}, "pods": pods}

    nodes = [node("small-empty", 4, 0), node("small-half", 4, 2), node("big", 8, 0)]
    a = advise(core, {"nodes": nodes, "pod": {"requests": {"cpu": 1, "memory": "1Gi"}}, "profile": "ci-bin-pack"})
    assert a["pick"] == "small-half"
    totals = {c["name"]: c["total"] for c in a["candidates"]}
    # small-half: 100*100 + (3000*100//4000 + 2Gi*100//16Gi)//2 = 10000 + (75+12)//2 = 10043
    # small-empty: 10000 + (25 + 6)//2 = 10015; big: 0 + (12 + 6)//2 = 9
    assert totals == {"small-half": 10043, "small-empty": 10015, "big": 9}
    # the same cluster under spread goes to the emptiest node instead
    assert (
        advise(core, {"nodes": nodes, "pod": {"requests": {"cpu": 1, "memory": "1Gi"}}, "profile": "spread"})["pick"]
        == "big"
    )


def test_nodes_that_do_not_fit_are_filtered_then_wait(core: ModuleType) -> None:
    # P10: a node that cannot hold the requests takes no part (not even in the normalisation);
    # when none fits, the answer is wait
    nodes = [
        {"name": "tiny", "allocatable": {"cpu": 1, "memory": "1Gi"}},
        {"name": "a", "allocatable": {"cpu": 4, "memory": "8Gi"}},
        {"name": "b", "allocatable": {"cpu": 8, "memory": "8Gi"}},
    ]
    profile = {"scorers": [{"name": "smallest-node", "resources": CPU_ONLY}]}
    a = advise(core, {"nodes": nodes, "pod": {"requests": {"cpu": 2, "memory": "1Gi"}}, "profile": profile})
    by = {c["name"]: c for c in a["candidates"]}
    assert by["tiny"]["fits"] is False
    assert (by["a"]["scores"][0]["score"], by["b"]["scores"][0]["score"]) == (100, 0)  # min-max over a, b only
    assert a["nodes_fit"] == 2
    assert [c["name"] for c in a["candidates"]][-1] == "tiny"
    a = advise(core, {"nodes": nodes, "pod": {"requests": {"cpu": 16, "memory": "1Gi"}}, "profile": profile})
    assert (a["decision"], a["pick"], a["nodes_fit"]) == ("wait", None, 0)
    assert "no node fits" in a["reason"]


def test_all_equal_scores_are_zero(core: ModuleType) -> None:
    # P8/P9: when every node is equal the normalised score is 0 (no division by zero); the pick is random among them
    nodes = [{"name": f"n{i}", "allocatable": {"cpu": 4, "memory": "8Gi"}} for i in range(3)]
    for name in ("limit-aware", "smallest-node", "largest-node"):
        a = advise(core, {"nodes": nodes, "pod": {}, "profile": {"scorers": [{"name": name}]}, "seed": 5})
        assert {c["scores"][0]["score"] for c in a["candidates"]} == {0}
        assert "among 3 equal nodes" in a["reason"]


def test_best_effort_pods_under_limit_aware(core: ModuleType) -> None:
    # P8: a container without a limit counts as the node's allocatable (or the configured value).
    # n1 (8 CPU) runs one best-effort pod: L = 8000 + 1000 = 9000 -> -12.5; n2 runs a pod limited to
    # 2 CPU: L = 3000 -> 62.5. With missing_limit 500m, n1: L = 1500 -> 81.25 beats n2.
    nodes = [
        {"name": "n1", "allocatable": {"cpu": 8, "memory": "8Gi"}, "pods": [{"requests": {"cpu": "100m"}}]},
        {"name": "n2", "allocatable": {"cpu": 8, "memory": "8Gi"}, "pods": [{"limits": {"cpu": 2}}]},
    ]
    pod = {"requests": {"cpu": "100m"}, "limits": {"cpu": 1}}
    a = advise(
        core, {"nodes": nodes, "pod": pod, "profile": {"scorers": [{"name": "limit-aware", "resources": CPU_ONLY}]}}
    )
    assert {k: v[0] for k, v in scores(a).items()} == {"n1": -12.5, "n2": 62.5}
    assert a["pick"] == "n2"
    scorer = {"name": "limit-aware", "resources": CPU_ONLY, "missing_limit": {"cpu": "500m"}}
    a = advise(core, {"nodes": nodes, "pod": pod, "profile": {"scorers": [scorer]}})
    assert {k: v[0] for k, v in scores(a).items()} == {"n1": 81.25, "n2": 62.5}
    assert a["pick"] == "n1"


def test_init_containers_and_overhead(core: ModuleType) -> None:
    # requests: max(sum of containers 300m, largest init 1) + overhead 250m = 1250m; the limit
    # (P8): max(sum 2 + 1, largest init 4) + overhead 1 = 5 CPU
    pod = {
        "containers": [
            {"requests": {"cpu": "100m"}, "limits": {"cpu": 2}},
            {"requests": {"cpu": "200m"}, "limits": {"cpu": 1}},
        ],
        "init_containers": [{"requests": {"cpu": 1}, "limits": {"cpu": 4}}],
        "overhead": {"cpu": "250m", "memory": "64Mi"},
    }
    nodes = [{"name": "n", "allocatable": {"cpu": 8, "memory": "8Gi"}}]
    a = advise(
        core, {"nodes": nodes, "pod": pod, "profile": {"scorers": [{"name": "limit-aware", "resources": CPU_ONLY}]}}
    )
    assert a["pod"]["requests"]["cpu_millicores"] == 1250
    assert a["pod"]["limits"]["cpu_millicores"] == 4000 + 250
    assert a["candidates"][0]["scores"][0]["raw"] == (8000 - 4250) * 100 / 8000
    # a node with 1 CPU cannot take it (the init container needs 1 CPU + overhead)
    nodes.append({"name": "small", "allocatable": {"cpu": 1, "memory": "8Gi"}})
    a = advise(core, {"nodes": nodes, "pod": pod, "profile": "spread"})
    assert [c["fits"] for c in a["candidates"]] == [True, False]


def test_weights(core: ModuleType) -> None:
    # P10 custom weights: smallest-node x1 vs largest-node x3 -> the largest wins; flip the weights, the smallest
    nodes = [
        {"name": "s", "allocatable": {"cpu": 2, "memory": "4Gi"}},
        {"name": "l", "allocatable": {"cpu": 16, "memory": "64Gi"}},
    ]

    def pick(w_small: int, w_large: int) -> str:
        profile = {
            "scorers": [{"name": "smallest-node", "weight": w_small}, {"name": "largest-node", "weight": w_large}]
        }
        out: str = advise(core, {"nodes": nodes, "pod": {}, "profile": profile})["pick"]
        return out

    assert pick(1, 3) == "l"
    assert pick(3, 1) == "s"
    # P7 per-resource weights: memory-only least-allocated prefers the node with more free memory
    nodes = [
        {
            "name": "cpu-free",
            "allocatable": {"cpu": 8, "memory": "8Gi"},
            "pods": [{"requests": {"cpu": 0, "memory": "6Gi"}}],
        },
        {
            "name": "mem-free",
            "allocatable": {"cpu": 8, "memory": "8Gi"},
            "pods": [{"requests": {"cpu": 6, "memory": "0"}}],
        },
    ]
    profile = {"scorers": [{"name": "least-allocated", "resources": {"cpu": 0, "memory": 1}}]}
    assert advise(core, {"nodes": nodes, "pod": {}, "profile": profile})["pick"] == "mem-free"
    profile = {"scorers": [{"name": "least-allocated", "resources": {"cpu": 1, "memory": 0}}]}
    assert advise(core, {"nodes": nodes, "pod": {}, "profile": profile})["pick"] == "cpu-free"


# --------------------------------------------------------------------------- compiled vs reference

_values = st.integers(0, 1 << 36)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Any, ...]:
    n = draw(st.integers(1, 12))
    e = draw(st.integers(0, 2))  # extended resources
    alloc_cpu = draw(st.lists(st.integers(0, 64_000), min_size=n, max_size=n))
    alloc_mem = draw(st.lists(st.integers(0, 1 << 38), min_size=n, max_size=n))
    p = draw(st.integers(0, 30))
    pod_node = draw(st.lists(st.integers(0, n - 1), min_size=p, max_size=p))
    cols = [draw(st.lists(st.integers(0, 20_000 if i % 2 == 0 else 1 << 34), min_size=p, max_size=p)) for i in range(6)]
    cols += [draw(st.lists(st.integers(0, 3), min_size=p, max_size=p)) for _ in range(2)]
    pod = (
        *(draw(st.integers(0, 20_000 if i % 2 == 0 else 1 << 34)) for i in range(6)),
        draw(st.integers(0, 3)),
        draw(st.integers(0, 3)),
        *(draw(st.integers(0, 4)) for _ in range(e)),
    )
    ext_alloc = draw(st.lists(st.integers(0, 16), min_size=n * e, max_size=n * e))
    ext_req = draw(st.lists(st.integers(0, 4), min_size=p * e, max_size=p * e))

    @st.composite
    def shapes(draw: st.DrawFn) -> list[int]:
        points = sorted(draw(st.sets(st.integers(0, 100), min_size=1, max_size=5)))
        out: list[int] = []
        for u in points:
            out += [u, draw(st.integers(0, 10)) * 10]
        return out

    scorer = st.tuples(
        st.integers(0, 7),
        st.integers(0, 100),
        st.integers(-1, 1 << 20),
        st.integers(-1, 1 << 20),
        st.integers(-1, 1 << 36),
        st.integers(-1, 1 << 36),
        st.lists(st.integers(-1, 5), min_size=e, max_size=e),
        shapes(),
    )
    scorers = draw(st.lists(scorer, min_size=1, max_size=3))
    return alloc_cpu, alloc_mem, pod_node, *cols, pod, scorers, ext_alloc, ext_req


@pytest.mark.skipif(PURE or compiled() is None, reason="needs the compiled backend")
@settings(max_examples=400, deadline=None)
@given(clusters())
def test_compiled_matches_reference(args: tuple[Any, ...]) -> None:
    module = compiled()
    assert module is not None
    assert module.score_nodes(*args) == REF.score_nodes(*args)


def test_malformed_columns_raise(core: ModuleType) -> None:
    with pytest.raises(ValueError, match="node index"):
        core.score_nodes([1], [1], [3], [0], [0], [0], [0], [0], [0], [0], [0], (0,) * 8, [(0, 1, 1, 1, -1, -1)])
    with pytest.raises(ValueError, match="differ in length"):
        core.score_nodes([1], [1, 2], [], [], [], [], [], [], [], [], [], (0,) * 8, [])
    with pytest.raises(ValueError, match="unknown scorer"):
        core.score_nodes([1], [1], [], [], [], [], [], [], [], [], [], (0,) * 8, [(9, 1, 1, 1, -1, -1)])
