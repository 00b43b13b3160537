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

from service.placement import service as placement
from service.placement.schemas import PlacementAdvise

from ..helpers import examples
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
CPU_ONLY = {"cpu": 1}  # memory left out: not scored (an explicit 0 would weigh 1 under PK5)


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
    # the built-in spread profile (PK6) weighs memory too: 0 requested of 32Gi = 100 on both nodes
    # -> least-allocated (37+100)//2 = 68 and (25+100)//2 = 62; plus balanced-allocation (1.36, PK4):
    # node1 with the pod 5/8 vs 0 -> int((1-0.3125)*100) = 68, without 4/8 -> 75: 50 + (50+68-75)//2 = 71;
    # node2 6/8 -> 62, without 5/8 -> 68: 50 + (50+62-68)//2 = 72
    a = advise(core, {"nodes": pv5_nodes(), "pod": NEW_POD, "profile": "spread"})
    assert {c["name"]: c["total"] for c in a["candidates"]} == {"node1": 68 + 71, "node2": 62 + 72}


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
    profile = {"scorers": [{"name": "least-allocated", "resources": {"memory": 1}}]}
    assert advise(core, {"nodes": nodes, "pod": {}, "profile": profile})["pick"] == "mem-free"
    profile = {"scorers": [{"name": "least-allocated", "resources": {"cpu": 1}}]}
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
@settings(max_examples=examples(400), deadline=None)
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


# --------------------------------------------------------------------------- PK1-PK7: kube-scheduler's scorers
# Vectors from kubernetes/kubernetes pkg/scheduler/framework/plugins/noderesources/
# requested_to_capacity_ratio_test.go and balanced_allocation_test.go (their pods and nodes as our API writes them).

KUBE_MILLI = {"cpu": "4000", "memory": "10000"}  # st.MakeNode().Capacity: 4000 cores, 10000 bytes


def one(pods: list[dict[str, Any]], name: str, cpu: str | int, memory: str | int, **ext: int) -> dict[str, Any]:
    return {"name": name, "allocatable": {"cpu": cpu, "memory": memory, **ext}, "pods": pods}


def totals_of(a: dict[str, Any]) -> dict[str, int]:
    return {c["name"]: c["total"] for c in a["candidates"]}


RTCR = {
    "name": "requested-to-capacity-ratio",
    "shape": [{"utilization": 0, "score": 10}, {"utilization": 100, "score": 0}],
}


def test_pk1_requested_to_capacity_ratio(core: ModuleType) -> None:
    # PK1, TestRequestedToCapacityRatioScoringStrategy: a pod of two containers (1000+2000 cores,
    # 2000+3000 bytes) on nodes of 4000/6000 cores and 10000 bytes: node1 75 % cpu -> 25, 50 % mem
    # -> 50, round(37.5) = 38; node2 50/50 -> 50. The Go test's pods have no containers (no request
    # at all): an explicit 0 stands for them, since an explicit 0 stays 0 (PK5).
    pod = {
        "containers": [{"requests": {"cpu": "1000", "memory": "2000"}}, {"requests": {"cpu": "2000", "memory": "3000"}}]
    }
    empty = {"requests": {"cpu": 0, "memory": 0}}
    nodes = [one([empty, empty], "node1", "4000", "10000"), one([], "node2", "6000", "10000")]
    a = advise(core, {"nodes": nodes, "pod": pod, "profile": {"scorers": [RTCR]}})
    assert totals_of(a) == {"node1": 38, "node2": 50}
    # same vector, the requests on the nodes instead of on the pod
    used = {"requests": {"cpu": "3000", "memory": "5000"}}
    nodes = [one([used], "node1", "4000", "10000"), one([used], "node2", "6000", "10000")]
    a = advise(core, {"nodes": nodes, "pod": empty, "profile": {"scorers": [RTCR]}})
    assert totals_of(a) == {"node1": 38, "node2": 50}


def test_pk1_broken_linear_function(core: ModuleType) -> None:
    # TestBrokenLinearFunction's points (10, 1), (90, 9), scaled x10 before the function is built
    # (requestedToCapacityRatioScorer: MaxNodeScore / MaxCustomPriorityScore): below the first point
    # the first score, above the last the last, integer interpolation in between
    shape = [{"utilization": 10, "score": 1}, {"utilization": 90, "score": 9}]
    for used, expected in ((0, 10), (10, 10), (19, 19), (89, 89), (90, 90), (100, 90)):
        nodes = [one([{"requests": {"cpu": f"{used}m", "memory": 0}}], "n", "100m", "1Gi")]
        scorer = {"name": "requested-to-capacity-ratio", "shape": shape, "resources": {"cpu": 1}}
        a = advise(
            core, {"nodes": nodes, "pod": {"requests": {"cpu": 0, "memory": 0}}, "profile": {"scorers": [scorer]}}
        )
        assert a["candidates"][0]["total"] == expected, used
    # case 2, a decreasing segment: (0, 2), (40, 10), (100, 0) -> 70 % scores 50; at 71 % Go's
    # division truncates toward zero: 100 + (-100 * 31) / 60 = 100 - 51 = 49 (flooring would give 48)
    shape = [{"utilization": 0, "score": 2}, {"utilization": 40, "score": 10}, {"utilization": 100, "score": 0}]
    scorer = {"name": "requested-to-capacity-ratio", "shape": shape, "resources": {"cpu": 1}}
    for used, expected in ((70, 50), (71, 49)):
        nodes = [one([{"requests": {"cpu": f"{used}m", "memory": 0}}], "n", "100m", "1Gi")]
        a = advise(
            core, {"nodes": nodes, "pod": {"requests": {"cpu": 0, "memory": 0}}, "profile": {"scorers": [scorer]}}
        )
        assert a["candidates"][0]["total"] == expected


def test_pk1_extended_resources(core: ModuleType) -> None:
    # TestResourceBinPackingSingleExtended / MultipleExtended: shape (0, 0), (100, 1); a pod that does
    # not request intel.com/foo scores 0 (PK2: the resource is skipped, nothing is left); 2 of 8 -> 2,
    # 2 of 4 -> 5; with weights foo 3, bar 5: (2*3 + 5*5)/8 -> round(3.875) = 4 and (5*3 + 2*5)/8 -> 3
    shape = [{"utilization": 0, "score": 0}, {"utilization": 100, "score": 1}]
    scorer = {"name": "requested-to-capacity-ratio", "shape": shape, "resources": {"intel.com/foo": 1}}
    nodes = [
        one([], "node1", "4000m", "10000Mi", **{"intel.com/foo": 8}),
        one([], "node2", "4000m", "10000Mi", **{"intel.com/foo": 4}),
    ]
    a = advise(core, {"nodes": nodes, "pod": {"requests": {"cpu": 0}}, "profile": {"scorers": [scorer]}})
    assert totals_of(a) == {"node1": 0, "node2": 0}
    a = advise(core, {"nodes": nodes, "pod": {"requests": {"intel.com/foo": 2}}, "profile": {"scorers": [scorer]}})
    assert totals_of(a) == {"node1": 2, "node2": 5}
    nodes[1]["pods"] = [{"requests": {"intel.com/foo": 2}}]
    a = advise(core, {"nodes": nodes, "pod": {"requests": {"intel.com/foo": 2}}, "profile": {"scorers": [scorer]}})
    assert totals_of(a) == {"node1": 2, "node2": 10}
    scorer = {**scorer, "resources": {"intel.com/foo": 3, "intel.com/bar": 5}}
    nodes = [
        one([], "node1", "4000m", "10000Mi", **{"intel.com/foo": 8, "intel.com/bar": 4}),
        one([], "node2", "4000m", "10000Mi", **{"intel.com/foo": 4, "intel.com/bar": 8}),
    ]
    pod = {"requests": {"intel.com/foo": 2, "intel.com/bar": 2}}
    a = advise(core, {"nodes": nodes, "pod": pod, "profile": {"scorers": [scorer]}})
    assert totals_of(a) == {"node1": 4, "node2": 3}
    # the fit filter counts extended resources: 9 of foo fits nowhere
    a = advise(core, {"nodes": nodes, "pod": {"requests": {"intel.com/foo": 9}}, "profile": {"scorers": [scorer]}})
    assert (a["decision"], a["nodes_fit"]) == ("wait", 0)
    assert "9 intel.com/foo" in a["reason"]


CPU_ONLY_POD = {
    "containers": [{"requests": {"cpu": "1000m", "memory": "0"}}, {"requests": {"cpu": "2000m", "memory": "0"}}]
}
CPU_AND_MEMORY = {
    "containers": [{"requests": {"cpu": "1000m", "memory": "2000"}}, {"requests": {"cpu": "2000m", "memory": "3000"}}]
}
BALANCED_135 = {"name": "balanced-allocation", "kubernetes": "1.35"}


def test_pk3_balanced_allocation_classic(core: ModuleType) -> None:
    # PK3, TestNodeResourcesBalancedAllocation: 75 % / 50 % -> std 0.125 -> 87; 50/50 -> 100
    nodes = [one([], "node1", "4000m", "10000"), one([], "node2", "6000m", "10000")]
    a = advise(core, {"nodes": nodes, "pod": CPU_AND_MEMORY, "profile": {"scorers": [BALANCED_135]}})
    assert totals_of(a) == {"node1": 87, "node2": 100}
    # "resources requested, pods scheduled with resources": 60/25 -> 82; 60/50 -> 95
    nodes = [one([CPU_ONLY_POD], "node1", "10000m", "20000"), one([CPU_AND_MEMORY], "node2", "10000m", "20000")]
    a = advise(core, {"nodes": nodes, "pod": CPU_AND_MEMORY, "profile": {"scorers": [BALANCED_135]}})
    assert totals_of(a) == {"node1": 82, "node2": 95}
    # a best-effort pod is skipped (PreScore returns Skip): every node scores 0
    a = advise(
        core, {"nodes": nodes, "pod": {"requests": {"cpu": 0, "memory": 0}}, "profile": {"scorers": [BALANCED_135]}}
    )
    assert set(totals_of(a).values()) == {0}
    # no 100m/200Mi defaults: a pod with no requests at all is best-effort too
    a = advise(core, {"nodes": nodes, "pod": {}, "profile": {"scorers": [BALANCED_135]}})
    assert set(totals_of(a).values()) == {0}


def test_pk3_balanced_allocation_extended(core: ModuleType) -> None:
    # "include scalar resource on a node": three fractions, population std -> 70 and 65;
    # "node without the scalar resource should skip the scalar resource" (PK2): 63 and 63
    gpu = {
        "containers": [
            {"requests": {"cpu": "1000m", "memory": "2000"}},
            {"requests": {"cpu": "2000m", "memory": "3000", "nvidia.com/gpu": 3}},
        ]
    }
    scorer = {**BALANCED_135, "resources": {"cpu": 1, "memory": 1, "nvidia.com/gpu": 1}}
    nodes = [
        one([gpu], "node1", "3500m", "40000", **{"nvidia.com/gpu": 8}),
        one([CPU_AND_MEMORY], "node2", "3500m", "40000", **{"nvidia.com/gpu": 8}),
    ]
    pod = {"requests": {"memory": "0", "nvidia.com/gpu": 1}}
    assert totals_of(advise(core, {"nodes": nodes, "pod": pod, "profile": {"scorers": [scorer]}})) == {
        "node1": 70,
        "node2": 65,
    }
    nodes = [one([], "node1", "3500m", "40000", **{"nvidia.com/gpu": 8}), one([], "node2", "3500m", "40000")]
    a = advise(core, {"nodes": nodes, "pod": CPU_AND_MEMORY, "profile": {"scorers": [scorer]}})
    assert totals_of(a) == {"node1": 63, "node2": 63}


def test_pk4_balanced_allocation_change(core: ModuleType) -> None:
    # PK4 (kubernetes PR 135573, 1.36): 50 + (50 + with - without) // 2. No change in balance -> 75;
    # perfectly balanced to fully unbalanced -> 50; the reverse -> 100 (the PR's own anchors).
    scorer = {"name": "balanced-allocation", "kubernetes": "1.36"}
    nodes = [
        one([{"requests": {"cpu": 2, "memory": "4Gi"}}], "same", 8, "16Gi"),  # 25/25 -> 50/50: 100 -> 100
        one([], "tilts", 4, "16Gi"),  # 0/0 -> 100 % cpu, 0 % mem... see below
    ]
    pod = {"requests": {"cpu": 2, "memory": "4Gi"}}
    a = advise(core, {"nodes": nodes, "pod": pod, "profile": {"scorers": [scorer]}})
    # tilts: 2/4 = 0.5 and 4/16 = 0.25 -> int((1 - 0.125) * 100) = 87, from 100 empty: 50 + (50 + 87 - 100) // 2 = 68
    assert totals_of(a) == {"same": 75, "tilts": 68}
    nodes = [one([{"requests": {"cpu": 0, "memory": "8Gi"}}], "fills", 4, "8Gi"), one([], "empty", 4, "8Gi")]
    a = advise(core, {"nodes": nodes, "pod": {"requests": {"cpu": 4, "memory": 0}}, "profile": {"scorers": [scorer]}})
    # fills: 0/100 % (std .5 -> 50) becomes 100/100 % (100): 50 + (50 + 100 - 50) // 2 = 100;
    # empty: 0/0 (100) becomes 100/0 (50): 50 + (50 + 50 - 100) // 2 = 50
    assert totals_of(a) == {"fills": 100, "empty": 50}
    # where the two forms part: a node already tilted to memory (0 % cpu, 50 % mem) and an empty one,
    # for a CPU-only pod of 25 %. 1.35 ties them at 87 (both end 25/50 or 25/0 apart by .125 std);
    # 1.36 rewards the node whose balance improves: 50 + (50 + 87 - 75) // 2 = 81 vs 50 + (50 + 87 - 100) // 2 = 68
    nodes = [one([{"requests": {"cpu": 0, "memory": "4Gi"}}], "tilted", 4, "8Gi"), one([], "empty", 4, "8Gi")]
    pod = {"requests": {"cpu": 1, "memory": 0}}
    assert totals_of(advise(core, {"nodes": nodes, "pod": pod, "profile": {"scorers": [BALANCED_135]}})) == {
        "tilted": 87,
        "empty": 87,
    }
    assert totals_of(advise(core, {"nodes": nodes, "pod": pod, "profile": {"scorers": [scorer]}})) == {
        "tilted": 81,
        "empty": 68,
    }


def test_pk5_common_rules(core: ModuleType) -> None:
    # PK5: a weight of 0 means 1 (SetDefaults_NodeResourcesFitArgs); a resource left out is not scored
    nodes = pv5_nodes()
    zero = advise(
        core,
        {
            "nodes": nodes,
            "pod": NEW_POD,
            "profile": {"scorers": [{"name": "least-allocated", "resources": {"cpu": 1, "memory": 0}}]},
        },
    )
    both = advise(core, {"nodes": nodes, "pod": NEW_POD, "profile": {"scorers": [{"name": "least-allocated"}]}})
    assert totals_of(zero) == totals_of(both) == {"node1": 68, "node2": 62}
    # a resource whose allocatable is 0 is skipped, its weight too: a node with 0 memory
    # allocatable scores on CPU alone (37, not (37 + 0) // 2)
    nodes = [{"name": "n", "allocatable": {"cpu": 8, "memory": 0}, "pods": [{"requests": {"cpu": 4, "memory": 0}}]}]
    a = advise(core, {"nodes": nodes, "pod": NEW_POD, "profile": {"scorers": [{"name": "least-allocated"}]}})
    assert a["candidates"][0]["total"] == 37
    # the Fit scorers give a missing request 100m/200Mi, an explicit 0 stays 0
    nodes = [{"name": "n", "allocatable": {"cpu": 1, "memory": "1Gi"}}]
    profile = {"scorers": [{"name": "most-allocated", "resources": {"cpu": 1}}]}
    assert advise(core, {"nodes": nodes, "pod": {}, "profile": profile})["candidates"][0]["total"] == 10
    assert (
        advise(core, {"nodes": nodes, "pod": {"requests": {"cpu": 0}}, "profile": profile})["candidates"][0]["total"]
        == 0
    )


def test_pk7_pod_requests_with_sidecars(core: ModuleType) -> None:
    # PK7, AggregateContainerRequests (k8s.io/component-helpers/resource/helpers.go): containers
    # 1 + 1 = 2 CPU; sidecar s1 (1) adds to the sum (3) and to the running sidecars; init i1 (2)
    # counts 2 + 1 = 3; sidecar s2 (1) -> sum 4, sidecars 2; init i2 (3) counts 3 + 2 = 5:
    # max(4, 5) + overhead 500m = 5500m
    pod = {
        "containers": [{"requests": {"cpu": 1}}, {"requests": {"cpu": 1}}],
        "init_containers": [
            {"requests": {"cpu": 1}, "restart_policy": "Always"},
            {"requests": {"cpu": 2}},
            {"requests": {"cpu": 1}, "restart_policy": "Always"},
            {"requests": {"cpu": 3}},
        ],
        "overhead": {"cpu": "500m"},
    }
    nodes = [{"name": "n", "allocatable": {"cpu": 8, "memory": "8Gi"}}]
    a = advise(core, {"nodes": nodes, "pod": pod, "profile": "spread"})
    assert a["pod"]["requests"]["cpu_millicores"] == 5500
    # without the last init container the sum wins: 4 + 0.5
    pod["init_containers"] = pod["init_containers"][:3]
    assert advise(core, {"nodes": nodes, "pod": pod, "profile": "spread"})["pod"]["requests"]["cpu_millicores"] == 4500
    # a limit without a request is the request, per resource (SetDefaults_Pod): a CPU-only limit
    # leaves memory unrequested, so NodeResourcesFit counts 200Mi for it
    pod = {"limits": {"cpu": 2}}
    a = advise(core, {"nodes": nodes, "pod": pod, "profile": {"scorers": [{"name": "most-allocated"}]}})
    assert (a["pod"]["requests"]["cpu_millicores"], a["pod"]["requests"]["memory_bytes"]) == (2000, 0)
    # cpu 2000/8000 -> 25, memory 200Mi/8Gi -> 2: (25 + 2) // 2 = 13
    assert a["candidates"][0]["total"] == 13


def test_pk6_spread_is_the_default_profile(core: ModuleType) -> None:
    # PK6 (default_plugins.go): NodeResourcesFit (LeastAllocated) and NodeResourcesBalancedAllocation, weight 1 each
    a = advise(core, {"nodes": pv5_nodes(), "pod": NEW_POD, "profile": "spread"})
    assert [(s["name"], s["weight"]) for s in a["profile"]] == [("least-allocated", 1), ("balanced-allocation", 1)]
    assert [s["scorer"] for s in a["candidates"][0]["scores"]] == ["least-allocated", "balanced-allocation"]


# --------------------------------------------------------------------------- PC1-PC8: Concourse by generation
# concourse/concourse atc/worker/placement.go at v7.0.0 and at HEAD, atc/engine/task_delegate.go at v7.0.0,
# atc/worker/pool.go and atc/engine/step_factory.go at HEAD.


def chain_of(generation: str, strategies: Any, **kw: Any) -> dict[str, Any]:
    return {"strategies": strategies, "generation": generation, **kw}


def test_pc1_v70_empty_set_fails_the_step(core: ModuleType) -> None:
    # PC1: v7.0 errors with NoWorkerFitContainerPlacementStrategyError{Strategy: name}; doc waits
    nodes = [worker("w1", containers=5), worker("w2", containers=6)]
    body = {
        "nodes": nodes,
        "pod": {},
        "chain": chain_of("v7.0", ["limit-active-containers"], max_active_containers_per_worker=4),
    }
    a = advise(core, body)
    assert (a["decision"], a["pick"]) == ("fail", None)
    assert "no worker fit container placement strategy: limit-active-containers" in a["reason"]
    body["chain"]["generation"] = "doc"
    assert advise(core, body)["decision"] == "wait"
    # <= max keeps a worker at exactly the max, as in doc
    body["chain"] = chain_of("v7.0", ["limit-active-containers"], max_active_containers_per_worker=5)
    assert advise(core, body)["pick"] == "w1"
    # PV1's chain gives the same pick in v7.0
    a = advise(core, {"nodes": pv1_workers(), "pod": {"inputs": INPUTS}, "chain": {**PV1_CHAIN, "generation": "v7.0"}})
    assert a["pick"] == "w4"


def test_pc2_v70_only_limit_active_tasks_waits(core: ModuleType) -> None:
    # PC2: task_delegate.go waits on NoWorkerFit...{Strategy: "limit-active-tasks"} only; < max
    nodes = [worker("w1", active_tasks=1), worker("w2", active_tasks=2)]
    body = {
        "nodes": nodes,
        "pod": {"step_type": "task"},
        "chain": chain_of("v7.0", ["limit-active-tasks"], max_active_tasks_per_worker=1),
    }
    assert advise(core, body)["decision"] == "wait"
    body["chain"]["max_active_tasks_per_worker"] = 2
    assert advise(core, body)["pick"] == "w1"  # w2 at 2 >= 2 is dropped, w1 has the fewest
    # the same empty set from volume-locality's successor fails instead
    body["chain"] = chain_of(
        "v7.0", ["fewest-build-containers", "limit-active-volumes"], max_active_volumes_per_worker=1
    )
    nodes[0]["volumes"] = nodes[1]["volumes"] = 2
    assert advise(core, body)["decision"] == "fail"


def test_pc3_v70_checks_go_to_a_random_worker(core: ModuleType) -> None:
    # PC3: step_factory.go v7.0.0 builds check steps with NewRandomPlacementStrategy()
    nodes = [worker("w1", containers=50), worker("w2", containers=1)]
    chain = chain_of("v7.0", ["limit-active-containers"], max_active_containers_per_worker=10)
    picks = {
        advise(core, {"nodes": nodes, "pod": {"step_type": "check"}, "chain": chain, "seed": s})["pick"]
        for s in range(30)
    }
    assert picks == {"w1", "w2"}
    assert advise(core, {"nodes": nodes, "pod": {"step_type": "task"}, "chain": chain})["pick"] == "w2"


def test_pc4_head_orders_by_the_first_strategy_first(core: ModuleType) -> None:
    # PC4: stable sorts applied from the last strategy to the first, so fewest-build-containers is
    # the primary key and volume-locality breaks its ties; PC5: the first approved worker wins
    nodes = [worker("w1", local=3, builds=5), worker("w2", local=0, builds=1), worker("w3", local=2, builds=1)]
    chain = chain_of("head", ["fewest-build-containers", "volume-locality"])
    for seed in range(10):
        a = advise(core, {"nodes": nodes, "pod": {"inputs": INPUTS}, "chain": chain, "seed": seed})
        assert a["pick"] == "w3"
        assert a["survivors"] == ["w3", "w2", "w1"]
    # the other order: volume-locality first
    chain = chain_of("head", ["volume-locality", "fewest-build-containers"])
    assert advise(core, {"nodes": nodes, "pod": {"inputs": INPUTS}, "chain": chain})["pick"] == "w1"


def test_pc5_pc6_head_approves_below_the_max_or_waits(core: ModuleType) -> None:
    # PC6: limit-active-containers/-volumes approve < max (v7.0 kept <= max); none approved: wait
    nodes = [worker("w1", containers=5), worker("w2", containers=4)]
    chain = chain_of("head", ["limit-active-containers"], max_active_containers_per_worker=5)
    a = advise(core, {"nodes": nodes, "pod": {}, "chain": chain})
    assert a["pick"] == "w2"
    nodes[1]["containers"] = 5
    a = advise(core, {"nodes": nodes, "pod": {}, "chain": chain})
    assert (a["decision"], a["pick"]) == ("wait", None)
    assert {d["name"] for d in a["chain"][-1]["dropped"]} == {"w1", "w2"}


def test_pc7_head_worker_max_active_tasks(core: ModuleType) -> None:
    # PC7: limitActiveTasksStrategy.Approve: a worker's own MaxActiveTasks > 0 replaces the global
    # max (higher or lower), and is ignored when the global max is 0; gets are never limited
    nodes = [worker("w1", active_tasks=3, max_active_tasks=5), worker("w2", active_tasks=1, max_active_tasks=1)]
    chain = chain_of("head", ["limit-active-tasks"], max_active_tasks_per_worker=2)
    # ordered by active tasks: w2 (1) first, but its own max 1 refuses it; w1 (3) is below its own 5
    a = advise(core, {"nodes": nodes, "pod": {"step_type": "task"}, "chain": chain})
    assert a["pick"] == "w1"
    chain["max_active_tasks_per_worker"] = 0
    assert advise(core, {"nodes": nodes, "pod": {"step_type": "task"}, "chain": chain})["pick"] == "w2"
    # a get step is neither ordered nor limited by it: both workers may be picked
    chain["max_active_tasks_per_worker"] = 1
    picks = {
        advise(core, {"nodes": nodes, "pod": {"step_type": "get"}, "chain": chain, "seed": s})["pick"]
        for s in range(30)
    }
    assert picks == {"w1", "w2"}


def test_pc8_head_chains_by_step_type(core: ModuleType) -> None:
    # PC8: tasks and puts use the main chain, gets and in-build checks the no-input chain (default
    # the main one), resource checks the check chain (default random)
    nodes = [worker("w1", local=3, builds=9), worker("w2", local=0, builds=0)]
    chain = chain_of("head", ["volume-locality"], no_input_strategies="fewest-build-containers")
    pod = {"inputs": INPUTS}
    assert advise(core, {"nodes": nodes, "pod": {**pod, "step_type": "put"}, "chain": chain})["pick"] == "w1"
    assert advise(core, {"nodes": nodes, "pod": {**pod, "step_type": "get"}, "chain": chain})["pick"] == "w2"
    assert advise(core, {"nodes": nodes, "pod": {**pod, "step_type": "check"}, "chain": chain})["pick"] == "w2"
    del chain["no_input_strategies"]
    assert advise(core, {"nodes": nodes, "pod": {**pod, "step_type": "get"}, "chain": chain})["pick"] == "w1"
    picks = {
        advise(core, {"nodes": nodes, "pod": {**pod, "step_type": "resource-check"}, "chain": chain, "seed": s})["pick"]
        for s in range(30)
    }
    assert picks == {"w1", "w2"}
    # the no-input chain may not name volume-locality (its flag's choices leave it out)
    with pytest.raises(ValueError, match="no_input_strategies"):
        PlacementAdvise.model_validate(
            {"nodes": nodes, "pod": {}, "chain": {**chain, "no_input_strategies": ["volume-locality"]}}
        )
