"""Stage composition (``shared/spec/stage.md``, rules H2-H6) on both core backends: the vectors,
hand-worked edge cases, and hypothesis checks that the compiled module and the reference agree."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.stages import service as stages
from service.stages.flatten import flatten
from service.stages.schemas import StageCompute

from ..helpers import examples
from ..stage_vectors import VECTORS
from .conftest import PURE, compiled

REF = importlib.import_module("service.core._reference")
STEP, BACKGROUND, PARALLEL, GROUP = 0, 1, 2, 3
MIB = 1 << 20


def answer(core: ModuleType, body: dict[str, Any]) -> dict[str, Any]:
    parsed = StageCompute.model_validate(body)
    return stages.compose(parsed, flatten(parsed.stage), {}, composer=core.compose_stage)


def limits(a: dict[str, Any]) -> list[tuple[int, int]]:
    return [(s["cpu"]["limit_millicores"], s["memory"]["limit_bytes"] // MIB) for s in a["steps"]]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_vectors(core: ModuleType, vector: dict[str, Any]) -> None:
    # rules H1-H5, vectors V1-V7
    a = answer(core, vector["body"])
    sc = a["stage_container"]
    assert (sc["cpu"]["limit_millicores"], sc["memory"]["limit_bytes"] // MIB) == vector["container"]
    assert (sc["cpu"]["request_millicores"], sc["memory"]["request_bytes"] // MIB) == vector["container"]  # H3
    bg = a["total_with_background"]
    assert (bg["cpu_millicores"], bg["memory_bytes"] // MIB) == vector["with_background"]  # H4
    assert limits(a) == vector["limits"]  # H5


def test_pod_request_and_limits_v6(core: ModuleType) -> None:
    # rule H6 on V6: 3 step containers at 10m/10Mi, the background container at 3000m/900Mi
    a = answer(core, next(v for v in VECTORS if v["id"] == "V6")["body"])
    assert a["pod"]["request"]["cpu_millicores"] == 900 + 3 * 10 + 3000
    assert a["pod"]["request"]["memory_bytes"] == (1100 + 3 * 10 + 900) * MIB
    # sum of limits: container + steps' final limits (400+400+800, 500+500+1000) + background
    assert a["pod"]["limit"]["cpu_millicores"] == 900 + 1600 + 3000
    assert a["pod"]["limit"]["memory_bytes"] == (1100 + 2000 + 900) * MIB


def test_conservative_addon_is_flat(core: ModuleType) -> None:
    # rule H3: with conservative_addon_limits the stage container is 100m/100Mi whatever the steps
    a = answer(core, {"stage": [{"cpu": "4", "memory": "8Gi"}], "options": {"conservative_addon_limits": True}})
    sc = a["stage_container"]
    assert (sc["cpu"]["limit"], sc["memory"]["limit"]) == ("100m", "100Mi")
    assert limits(a) == [(4000, 8192)]  # the step still gets its own limit


def test_background_steps_ignore_increase_default(core: ModuleType) -> None:
    # rule H4: a background step without limits is 400m/500Mi even with increase_default_resources
    a = answer(core, {"stage": [{"background": True}, {}], "options": {"increase_default_resources": True}})
    assert limits(a) == [(400, 500), (1000, 3000)]
    bg = a["total_with_background"]
    assert (bg["cpu_millicores"], bg["memory_bytes"] // MIB) == (1100 + 400, 3100 + 500)


def test_integer_division_remainder(core: ModuleType) -> None:
    # rule H5: room 1000m, three 100m children: spare 700 // 3 = 233 each, 1m left unassigned;
    # memory: room 1000Mi, children 100+100+101 -> spare 699 // 3 = 233
    a = answer(
        core,
        {
            "stage": [
                {"parallel": [{"cpu": "100m", "memory": "100Mi"}] * 2 + [{"cpu": "100m", "memory": "101Mi"}]},
                {"cpu": "1", "memory": "1000Mi"},
            ]
        },
    )
    assert limits(a) == [(333, 333), (333, 333), (333, 334), (1000, 1000)]


def test_groups_inside_parallel_get_their_share(core: ModuleType) -> None:
    # H5: parallel(group(200m ; 300m), 100m) ; 1000m. Parallel room 1000, requests: group = max = 300,
    # step 100 -> sum 400, spare 600 // 2 = 300: the group's room is 600 (both its steps get 600),
    # the lone step 400. Memory all defaults: group 500, step 500, sum 1000, room 1000 -> no spare.
    a = answer(
        core,
        {
            "stage": [
                {"parallel": [{"group": [{"cpu": "200m"}, {"cpu": "300m"}]}, {"cpu": "100m"}]},
                {"cpu": "1"},
            ]
        },
    )
    assert limits(a) == [(600, 500), (600, 500), (400, 500), (1000, 1000)]


def test_parallel_of_only_background_children(core: ModuleType) -> None:
    # H2: background children contribute 0, so the block requests 0 and hands nothing out (no n=0 division)
    a = answer(core, {"stage": [{"parallel": [{"background": True}, {"background": True, "cpu": "2"}]}, {}]})
    assert limits(a) == [(400, 500), (2000, 500), (400, 500)]
    sc = a["stage_container"]
    assert (sc["cpu"]["limit_millicores"], sc["memory"]["limit_bytes"] // MIB) == (500, 600)
    assert a["total_with_background"]["cpu_millicores"] == 500 + 400 + 2000
    assert a["decided_by"]["cpu"]["path"] == "/stage/1"


def test_only_background_steps(core: ModuleType) -> None:
    # a stage of background steps only: the stage value is 0, the container the add-on alone
    a = answer(core, {"stage": [{"background": True}]})
    sc = a["stage_container"]
    assert (sc["cpu"]["limit"], sc["memory"]["limit"]) == ("100m", "100Mi")
    assert a["decided_by"]["cpu"]["path"] is None


def test_deep_nesting(core: ModuleType) -> None:
    # 30 levels alternating parallel/group, each level adding a 100m sibling step after the inner item.
    # Requests from the inside out: a parallel level adds 100m, a group level keeps the max. Every
    # block's room equals its request (the outermost item is the stage value), so nothing is spare:
    # a parallel's sibling keeps 100m, a group's sibling gets the group's room = its request.
    item: dict[str, Any] = {"cpu": "100m", "memory": "100Mi"}
    request = 100
    expected = [100]  # preorder: the innermost step first, then each level's sibling
    for level in range(30):
        sibling = {"cpu": "100m", "memory": "100Mi"}
        if level % 2 == 0:
            item = {"parallel": [item, sibling]}
            request += 100
            expected.append(100)
        else:
            item = {"group": [item, sibling]}
            expected.append(request)
    a = answer(core, {"stage": [item]})
    assert request == 1600
    assert a["stage_container"]["cpu"]["limit_millicores"] == request + 100
    assert [s["cpu"]["limit_millicores"] for s in a["steps"]] == expected
    assert a["steps"][0]["path"] == "/stage/0" + "/group/0/parallel/0" * 15


def test_decider_names_the_item(core: ModuleType) -> None:
    # V4: CPU decided by the sequential step (3500m), memory by the parallel block (3500Mi)
    body = next(v for v in VECTORS if v["id"] == "V4")["body"]
    a = answer(core, body)
    assert a["decided_by"]["cpu"]["path"] == "/stage/1"
    assert a["decided_by"]["memory"]["path"] == "/stage/0"
    assert "3500m" in a["decided_by"]["cpu"]["explanation"]
    assert "parallel block" in a["decided_by"]["memory"]["explanation"]


@pytest.mark.parametrize(
    ("kinds", "counts", "values"),
    [
        ([PARALLEL], [1], [0]),  # a block without its children
        ([GROUP, STEP], [0, 0], [0, 1]),  # an empty block
        ([STEP], [1], [1]),  # a step with children
        ([STEP], [0], [-1]),  # a negative value
        ([7], [0], [1]),  # an unknown kind
        ([STEP, STEP], [0], [1, 1]),  # lengths differ
    ],
)
def test_malformed_arrays_raise(core: ModuleType, kinds: list[int], counts: list[int], values: list[int]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message names the item; any ValueError is right
        core.compose_stage(kinds, counts, values, 100, 10, False)


# --------------------------------------------------------------------------- compiled vs reference


def _tree(depth: int) -> st.SearchStrategy[Any]:
    leaf = st.tuples(st.sampled_from([STEP, STEP, BACKGROUND]), st.integers(0, 10**9))
    if depth == 0:
        return leaf
    block = st.tuples(st.sampled_from([PARALLEL, GROUP]), st.lists(_tree(depth - 1), min_size=1, max_size=4))
    return st.one_of(leaf, block)


def _flat(items: list[Any]) -> tuple[list[int], list[int], list[int]]:
    kinds: list[int] = []
    counts: list[int] = []
    values: list[int] = []
    todo = list(reversed(items))
    while todo:
        kind, payload = todo.pop()
        kinds.append(kind)
        if kind in (STEP, BACKGROUND):
            counts.append(0)
            values.append(payload)
        else:
            counts.append(len(payload))
            values.append(0)
            todo.extend(reversed(payload))
    return kinds, counts, values


@pytest.mark.skipif(PURE or compiled() is None, reason="needs the compiled backend")
@settings(max_examples=examples(400), deadline=None)
@given(st.lists(_tree(4), min_size=1, max_size=6), st.integers(0, 1000), st.integers(0, 100), st.booleans())
def test_compiled_matches_reference(items: list[Any], addon: int, step_request: int, conservative: bool) -> None:
    kinds, counts, values = _flat(items)
    compiled_module = compiled()
    assert compiled_module is not None
    got = compiled_module.compose_stage(kinds, counts, values, addon, step_request, conservative)
    want = REF.compose_stage(kinds, counts, values, addon, step_request, conservative)
    assert tuple(got) == tuple(want)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_tree(4), min_size=1, max_size=6))
def test_invariants(items: list[Any]) -> None:
    # H2/H5 on the reference: no step loses room, the stage container covers every top-level
    # item, and no parallel block hands out more than its room
    kinds, counts, values = _flat(items)
    req, lim, stage, container, _, _, _ = REF.compose_stage(kinds, counts, values, 100, 10, False)
    assert container == stage + 100
    for i, k in enumerate(kinds):
        if k == STEP:
            assert lim[i] >= values[i]
        if k == BACKGROUND:
            assert lim[i] == values[i]
    # each parallel block: the final limits (rooms) of its children sum to at most its room
    for i, k in enumerate(kinds):
        if k != PARALLEL:
            continue
        j, children = i + 1, []
        for _ in range(counts[i]):
            children.append(j)
            pending = counts[j]
            j += 1
            while pending:
                pending += counts[j] - 1
                j += 1
        fg = [c for c in children if kinds[c] != BACKGROUND]
        assert sum(lim[c] for c in fg) <= max(lim[i], req[i])
