"""Stage composition as Harness CI's source does it (rules H8-H13 of ``docs/stages.md``) on both core
backends: looped steps and groups, non-CI steps, the parallel divisor, no extra, the init container.

Vectors come from harness/harness-core, 332-ci-manager/service/src/main/java/io/harness/ci/execution/
integrationstage/K8InitializeStepUtils.java (getStageRequestWithStrategy, handleParallelStep,
isStepEligibleForExtraResource, getStepContainerResource) and its test
K8InitializeStepUtilsTest.testStepsWithStrategy with the fixtures under
332-ci-manager/service/src/test/resources/strategy/.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ..helpers import examples
from .conftest import PURE, compiled

REF = importlib.import_module("service.core._reference")
STEP, BACKGROUND, PARALLEL, GROUP, LOOP, NON_CI = 0, 1, 2, 3, 4, 5


def S(v: int) -> Any:
    return (STEP, v)


def flat(items: list[Any]) -> tuple[list[int], list[int], list[int]]:
    """Preorder arrays from nested tuples: (STEP|BACKGROUND|NON_CI, value), (PARALLEL|GROUP, [children]),
    (LOOP, max_concurrency, [copies])."""
    kinds: list[int] = []
    counts: list[int] = []
    values: list[int] = []
    todo = list(reversed(items))
    while todo:
        node = todo.pop()
        kinds.append(node[0])
        if node[0] in (STEP, BACKGROUND, NON_CI):
            counts.append(0)
            values.append(node[1])
        else:
            children = node[-1]
            counts.append(len(children))
            values.append(node[1] if node[0] == LOOP else 0)
            todo.extend(reversed(children))
    return kinds, counts, values


def compose(core: ModuleType, items: list[Any], **kw: Any) -> tuple[Any, ...]:
    kinds, counts, values = flat(items)
    return tuple(core.compose_stage(kinds, counts, values, 100, 10, False, **kw))


def step_limits(items: list[Any], limits: list[int]) -> list[int]:
    kinds, _, _ = flat(items)
    return [limit for k, limit in zip(kinds, limits, strict=True) if k in (STEP, BACKGROUND, NON_CI)]


def upstream_strategy_stage(resource: str) -> list[Any]:
    """K8InitializeStepUtilsTest.testStepsWithStrategy: defaults 200m/200Mi (CIExecutionRule);
    run4 repeated 3 times with maxConcurrency 2 (strategy/stepWithStrategy1-3.json); sg looped over
    matrix memory [200Mi, 300Mi, 400Mi] with maxConcurrency 2 (strategy/stepGroupWithStrategy1-3.json),
    each copy a parallel block of run2 with parallelism 3 (memory from the matrix) and run3."""
    run4 = (LOOP, 2, [S(200)] * 3)
    copies = []
    for memory in (200, 300, 400):
        run2 = (LOOP, 3, [S(memory if resource == "memory" else 200)] * 3)
        copies.append((GROUP, [(PARALLEL, [run2, S(200)])]))
    return [run4, (LOOP, 2, copies)]


@pytest.mark.parametrize(("resource", "stage"), [("cpu", 1600), ("memory", 2500)])
def test_upstream_strategy_vector(core: ModuleType, resource: str, stage: int) -> None:
    # H8/H9: the upstream test asserts getStageRequest = (1600, 2500) and 15 step containers
    items = upstream_strategy_stage(resource)
    _, limits, got_stage, container, _, pod_request, _ = compose(core, items, harness=True)
    assert got_stage == stage
    assert container == stage + 100
    assert pod_request == container + 15 * 10  # H6: one 10m/10Mi request per expanded step container
    # H10: the looped steps keep their own limit; run3 gets (room - sum of all 4 members) // 4
    if resource == "cpu":
        run3 = [200 + (1600 - 800) // 4] * 3
        assert step_limits(items, limits) == [200] * 3 + [200, 200, 200, run3[0]] * 3
    else:
        got = step_limits(items, limits)
        assert got[:3] == [200] * 3
        assert got[3:] == [200, 200, 200, 625, 300, 300, 300, 550, 400, 400, 400, 475]


def test_loop_adds_up_the_top_copies_by_request(core: ModuleType) -> None:
    # H9: matrix copies 300, 100, 200 with maxConcurrency 2: 300 + 200; the serial max picks it over a 450 step
    items = [(LOOP, 2, [S(300), S(100), S(200)]), S(450)]
    requests, limits, stage, *_ = compose(core, items, harness=True)
    assert requests[0] == 500
    assert stage == 500
    # H10: a step carrying its own strategy gets nothing back; a plain top-level step gets the stage
    assert step_limits(items, limits) == [300, 100, 200, 500]


def test_parallelism_counts_every_copy(core: ModuleType) -> None:
    # H8: parallelism n has maxConcurrency n: all copies count
    _, _, stage, *_ = compose(core, [(LOOP, 4, [S(250)] * 4)], harness=True)
    assert stage == 1000


def test_parallel_extra_counts_looped_and_non_ci_members(core: ModuleType) -> None:
    # H10/H11: parallel(loop(k=1) of 2 x 100, approval, 100) ; 1000.
    # Request: top 1 of the copies (100) + 0 + 100 = 200; stage = 1000.
    # Extra = max(0, 1000 - (100 + 100 + 0 + 100)) = 700, divided by 4 members (two copies, the
    # approval, the step) = 175: the copies and the approval lose theirs, the step gets 100 + 175.
    items = [(PARALLEL, [(LOOP, 1, [S(100), S(100)]), (NON_CI, 0), S(100)]), S(1000)]
    requests, limits, _stage, *_ = compose(core, items, harness=True)
    assert requests[0] == 200
    assert step_limits(items, limits) == [100, 100, 0, 275, 1000]


def test_steps_inside_a_looped_group_get_the_room(core: ModuleType) -> None:
    # H10: group copies in a sequence each get the enclosing room (here the stage: 2 x 300 = 600)
    items = [(LOOP, 2, [(GROUP, [S(300), S(100)])] * 2)]
    _, limits, stage, *_ = compose(core, items, harness=True)
    assert stage == 600
    assert step_limits(items, limits) == [600, 600, 600, 600]


def test_divisor_by_generation(core: ModuleType) -> None:
    # H5 (doc) counts a group of background steps as a member; H10 (harness) does not
    items = [(PARALLEL, [(GROUP, [(BACKGROUND, 500)]), S(100)]), S(1000)]
    _, doc, *_ = compose(core, items)
    _, harness, *_ = compose(core, items, harness=True)
    assert step_limits(items, doc) == [500, 100 + 900 // 2, 1000]
    assert step_limits(items, harness) == [500, 100 + 900, 1000]


def test_non_ci_steps_take_nothing(core: ModuleType) -> None:
    # H11: an approval between two steps: no request, no container, no limit
    items = [S(400), (NON_CI, 0), S(400)]
    requests, _limits, stage, container, _, pod_request, pod_limit = compose(core, items, harness=True)
    assert requests[1] == 0
    assert stage == 400
    assert pod_request == container + 2 * 10
    assert pod_limit == container + 800


def test_no_extra_keeps_own_limits(core: ModuleType) -> None:
    # H12: CI_DISABLE_RESOURCE_OPTIMIZATION: V4's steps keep 1000/2000/3500, the stage container is unchanged
    items = [(PARALLEL, [S(1000), S(2000)]), S(3500)]
    _, limits, stage, container, *_ = compose(core, items, no_extra=True)
    assert step_limits(items, limits) == [1000, 2000, 3500]
    assert (stage, container) == (3500, 3600)
    _, limits, *_ = compose(core, items)
    assert step_limits(items, limits) == [1250, 2250, 3500]


def test_init_container_raises_the_pod_only_past_the_sum(core: ModuleType) -> None:
    # H13: the pod requests max(sum of containers, largest init container)
    items = [S(100)]
    *_, pod_request, pod_limit = compose(core, items, init=300)
    assert pod_request == 300  # 200 (stage container) + 10 < 300
    assert pod_limit == 300
    *_, pod_request, _ = compose(core, items, init=100)
    assert pod_request == 210


def test_loop_ties_take_the_later_copy(core: ModuleType) -> None:
    # H9: copies whose plain requests tie (100 each) but whose looped insides differ (200 vs 150):
    # with maxConcurrency 1 the later copy is ranked first, as Java's sort leaves the source's comparator
    first = (GROUP, [(LOOP, 2, [S(100), S(100)])])
    second = (GROUP, [(LOOP, 2, [S(100), S(50)])])
    requests, *_ = compose(core, [(LOOP, 1, [first, second])], harness=True)
    assert requests[0] == 150


@pytest.mark.parametrize(
    ("kinds", "counts", "values"),
    [
        ([LOOP, STEP], [1, 0], [0, 1]),  # maxConcurrency 0
        ([LOOP, PARALLEL, STEP], [1, 1, 0], [1, 0, 1]),  # a loop copies steps or groups only
        ([NON_CI], [1], [0]),  # a non-CI step with children
    ],
)
def test_malformed_loops_raise(core: ModuleType, kinds: list[int], counts: list[int], values: list[int]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message names the item
        core.compose_stage(kinds, counts, values, 100, 10, False, harness=True)


# --------------------------------------------------------------------------- compiled vs reference


def _tree(depth: int) -> st.SearchStrategy[Any]:
    leaf = st.tuples(st.sampled_from([STEP, STEP, BACKGROUND, NON_CI]), st.integers(0, 10**9))
    if depth == 0:
        return leaf
    inner = _tree(depth - 1)
    block = st.tuples(st.sampled_from([PARALLEL, GROUP]), st.lists(inner, min_size=1, max_size=4))
    group = st.tuples(st.just(GROUP), st.lists(inner, min_size=1, max_size=3))
    copyable = st.one_of(leaf, group)
    loop = st.tuples(st.just(LOOP), st.integers(1, 5), st.lists(copyable, min_size=1, max_size=5))
    return st.one_of(leaf, block, loop)


@pytest.mark.skipif(PURE or compiled() is None, reason="needs the compiled backend")
@settings(max_examples=examples(500), deadline=None)
@given(
    st.lists(_tree(4), min_size=1, max_size=6),
    st.integers(0, 1000),
    st.booleans(),
    st.integers(0, 5000),
    st.booleans(),
    st.booleans(),
)
def test_compiled_matches_reference(
    items: list[Any], addon: int, conservative: bool, init: int, harness: bool, no_extra: bool
) -> None:
    kinds, counts, values = flat(items)
    compiled_module = compiled()
    assert compiled_module is not None
    kw = {"init": init, "harness": harness, "no_extra": no_extra}
    got = compiled_module.compose_stage(kinds, counts, values, addon, 10, conservative, **kw)
    want = REF.compose_stage(kinds, counts, values, addon, 10, conservative, **kw)
    assert tuple(got) == tuple(want)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_tree(4), min_size=1, max_size=6), st.booleans())
def test_invariants(items: list[Any], harness: bool) -> None:
    # every step keeps at least its own limit; looped steps and non-CI steps get nothing back;
    # with no_extra every limit is the step's own
    kinds, counts, values = flat(items)
    _, lim, stage, container, *_ = REF.compose_stage(kinds, counts, values, 100, 10, False, harness=harness)
    _, own, *_ = REF.compose_stage(kinds, counts, values, 100, 10, False, harness=harness, no_extra=True)
    assert container == stage + 100
    parents = _parents(counts)
    for i, k in enumerate(kinds):
        if k == STEP:
            assert lim[i] >= values[i]
            assert own[i] == values[i]
            if parents[i] >= 0 and kinds[parents[i]] == LOOP:
                assert lim[i] == values[i]
        if k == NON_CI:
            assert lim[i] == 0


def _parents(counts: list[int]) -> list[int]:
    parents = [-1] * len(counts)
    stack: list[list[int]] = []
    for i, c in enumerate(counts):
        if stack:
            parents[i] = stack[-1][0]
            stack[-1][1] -= 1
        if c:
            stack.append([i, c])
        while stack and stack[-1][1] == 0:
            stack.pop()
    return parents
