"""The sizing core on both backends (``core`` fixture): hand-computed values per rule, and
hypothesis checks that the compiled module and the reference give the same answers."""

from __future__ import annotations

import importlib
import math
import random
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ..helpers import examples
from .conftest import PURE, compiled

MIB = 1 << 20
GIB = 1 << 30
REF = importlib.import_module("service.core._reference")
UNKNOWN, LEARNING, CONFIDENT = 0, 1, 2


def size(
    core: ModuleType,
    phase: int,
    cpu: float = 0.0,
    mem: int = 0,
    *,
    pod: int = -1,
    buffer: int = 20,
    k: int = 0,
    streak_limit: int = -1,
    ceiling: int = -1,
    guaranteed: bool = True,
    backoff: int = -1,
) -> tuple[int, int, int, int, bool]:
    return tuple(core.size_container(phase, cpu, mem, pod, buffer, k, streak_limit, ceiling, guaranteed, backoff))  # type: ignore[return-value]


# --------------------------------------------------------------------------- I2: six stats


def test_six_stats_by_hand(core: ModuleType) -> None:
    # rule I2: sorted [1,2,3,4,5.5]; p99 h=3.96 -> 4+0.96*1.5; p95 h=3.8 -> 4+0.8*1.5; p75 h=3; p50 h=2
    peak, p99, p95, p75, p50, avg = core.six_stats([4.0, 1.0, 5.5, 3.0, 2.0])
    assert peak == 5.5
    assert p99 == pytest.approx(5.44, rel=1e-12)
    assert p95 == pytest.approx(5.2, rel=1e-12)
    assert p75 == 4.0
    assert p50 == 3.0
    assert avg == pytest.approx(3.1, rel=1e-12)


def test_six_stats_single_sample(core: ModuleType) -> None:
    # rule I2: with one sample every stat is that sample
    assert tuple(core.six_stats([7.5])) == (7.5, 7.5, 7.5, 7.5, 7.5, 7.5)


def test_six_stats_two_samples_interpolate(core: ModuleType) -> None:
    # rule I2: n=2, p50 h=0.5 -> halfway; p99 h=0.99
    _, p99, _, _, p50, _ = core.six_stats([0.0, 100.0])
    assert p50 == 50.0
    assert p99 == pytest.approx(99.0, rel=1e-12)


def test_six_stats_empty_is_an_error(core: ModuleType) -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        core.six_stats([])


def test_six_stats_accepts_array_and_list(core: ModuleType) -> None:
    from array import array

    values = [3.0, 1.0, 2.0]
    assert tuple(core.six_stats(array("d", values))) == tuple(core.six_stats(values))


@pytest.mark.parametrize(
    "shape",
    ["sorted", "reversed", "equal", "organ-pipe", "two-values", "random"],
)
def test_six_stats_adversarial_orders_match_sorting(core: ModuleType, shape: str) -> None:
    # selection must give exactly what sorting gives, whatever the input order (rule I2)
    n = 10_001
    rng = random.Random(7)
    base = {
        "sorted": [float(i) for i in range(n)],
        "reversed": [float(n - i) for i in range(n)],
        "equal": [5.0] * n,
        "organ-pipe": [float(min(i, n - i)) for i in range(n)],
        "two-values": [float(i % 2) for i in range(n)],
        "random": [rng.random() * 4000 for _ in range(n)],
    }[shape]
    xs = sorted(base)
    expected = [xs[-1]]
    for q in (0.99, 0.95, 0.75, 0.5):
        h = (n - 1) * q
        f = math.floor(h)
        expected.append(xs[f] + (h - f) * (xs[f + 1] - xs[f]))
    got = core.six_stats(base)
    assert list(got[:5]) == pytest.approx(expected, rel=1e-12)
    assert got[5] == pytest.approx(sum(base) / n, rel=1e-12)


samples = st.lists(
    st.one_of(
        st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False),
        st.integers(min_value=0, max_value=4000).map(float),
    ),
    min_size=1,
    max_size=3000,
)


def _same(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


@pytest.mark.skipif(PURE or compiled() is None, reason="needs the compiled backend")
@settings(max_examples=examples(300), deadline=None)
@given(samples)
def test_six_stats_backends_agree(values: list[float]) -> None:
    cy = compiled()
    assert cy is not None
    got, want = cy.six_stats(values), REF.six_stats(values)
    assert all(_same(a, b) for a, b in zip(got, want, strict=True)), (got, want)


# 64 samples and more take the compiled bucket-histogram path: clusters of equal values, spikes,
# negative values, huge ranges and ranges too narrow to bucket (denormals) must all select exactly.
_clustered = st.lists(
    st.one_of(
        st.sampled_from([0.0, 0.5, 1000.0, 1000.0000000000001, 4000.0]),
        st.floats(min_value=-1e300, max_value=1e300, allow_nan=False, allow_infinity=False),
        st.floats(min_value=0, max_value=1e-300, allow_nan=False, allow_subnormal=True),
        st.integers(min_value=0, max_value=64).map(float),
    ),
    min_size=64,
    max_size=5000,
)


@pytest.mark.skipif(PURE or compiled() is None, reason="needs the compiled backend")
@settings(max_examples=examples(300), deadline=None)
@given(_clustered)
def test_six_stats_bucket_path_agrees(values: list[float]) -> None:
    cy = compiled()
    assert cy is not None
    got, want = cy.six_stats(values), REF.six_stats(values)
    # the order statistics are exact; only the average may differ by summation rounding
    assert tuple(got[:5]) == tuple(want[:5]), (got, want)
    assert _same(got[5], want[5]) or not math.isfinite(want[5]), (got, want)


# --------------------------------------------------------------------------- S7-S16: arithmetic


def test_unknown_phase_defaults(core: ModuleType) -> None:
    # rule S7
    assert size(core, UNKNOWN) == (500, 500, 4 * GIB, 4 * GIB, False)


def test_learning_triples_the_peak(core: ModuleType) -> None:
    # rule S8: CPU 3 x 300m = 900m (limit 1); memory 3 x 100Mi = 300Mi -> limit 512Mi; no buffer
    assert size(core, LEARNING, 300.0, 100 * MIB, guaranteed=False, buffer=500) == (
        900,
        1000,
        300 * MIB,
        512 * MIB,
        False,
    )
    # rule S16: guaranteed makes the request the limit
    assert size(core, LEARNING, 300.0, 100 * MIB) == (
        900,
        1000,
        512 * MIB,
        512 * MIB,
        False,
    )


def test_learning_has_no_pod_ceiling(core: ModuleType) -> None:
    # rule S8/S11: the pod ceiling applies in the confident phase only
    assert size(core, LEARNING, 100.0, 1000 * MIB, pod=10 * MIB, guaranteed=False)[2] == 3000 * MIB


def test_confident_cpu_buffer_is_exact(core: ModuleType) -> None:
    # rule S12: 800m x 1.2 is 960m, not 961m
    assert size(core, CONFIDENT, 800.0, 100 * MIB)[:2] == (960, 1000)
    # and a real fraction still rounds up
    assert size(core, CONFIDENT, 800.5, 100 * MIB)[0] == 961


@pytest.mark.parametrize(
    ("observed", "request_mib"),
    [
        (GIB - 1, 1229),  # < 1 GiB: +20% -> 1228.8 MiB -> 1229
        (GIB, 1127),  # exactly 1 GiB: +10% -> 1126.4 -> 1127
        (4 * GIB, 4506),  # exactly 4 GiB: +10% -> 4505.6 -> 4506
        (4 * GIB + 1, 4301),  # above 4 GiB: +5% -> 4300.8 -> 4301
    ],
)
def test_memory_staircase_boundaries(core: ModuleType, observed: int, request_mib: int) -> None:
    # rule S9 (staircase) and S12 (request rounded up to a whole MiB)
    _, _, req, _, _ = size(core, CONFIDENT, 100.0, observed, guaranteed=False)
    assert req == request_mib * MIB


def test_floors(core: ModuleType) -> None:
    # rule S10: CPU request >= 10m, memory request >= 32Mi; S12 limit floors 500m and 128Mi
    assert size(core, CONFIDENT, 1.0, 1 * MIB, guaranteed=False) == (
        10,
        500,
        32 * MIB,
        128 * MIB,
        False,
    )
    assert size(core, LEARNING, 0.0, 0, guaranteed=False) == (
        10,
        500,
        32 * MIB,
        128 * MIB,
        False,
    )


def test_pod_ceiling_clips_the_request(core: ModuleType) -> None:
    # rule S11: 2 GiB x 1.1 = 2252.8 MiB, but the pod peaked at 1.5 GiB -> 1.5 GiB x 1.1 = 1689.6 MiB
    _, _, req, lim, _ = size(core, CONFIDENT, 100.0, 2 * GIB, pod=3 * GIB // 2, guaranteed=False)
    assert req == 1690 * MIB
    assert lim == 2048 * MIB


@pytest.mark.parametrize(
    ("mib", "limit_mib"),
    [(1024, 1024), (600, 1024), (1025, 2048), (1, 128), (128, 128), (129, 256)],
)
def test_memory_limit_power_of_two(core: ModuleType, mib: int, limit_mib: int) -> None:
    # rule S12: 1024Mi stays 1024Mi, 600Mi becomes 1024Mi, at least 128Mi
    assert core.memory_limit_for(mib * MIB) == limit_mib * MIB


@pytest.mark.parametrize(("m", "limit"), [(1, 500), (500, 500), (501, 1000), (960, 1000), (1001, 1500)])
def test_cpu_limit_steps(core: ModuleType, m: int, limit: int) -> None:
    # rule S12: CPU limit = request rounded up to a multiple of 500m, at least 500m
    assert core.cpu_limit_for(m) == limit


def test_ceil_tolerant(core: ModuleType) -> None:
    # rule S12: a binary hair above an integer is that integer; a real fraction rounds up
    assert core.ceil_tolerant(800 * 1.2) == 960
    assert core.ceil_tolerant(960.5) == 961
    assert core.ceil_tolerant(0.0) == 0
    assert core.ceil_tolerant(1e-12) == 0


def test_oom_backoff_uses_the_larger_base(core: ModuleType) -> None:
    # rule S14: computed limit 1024Mi; streak's oldest run reported 1.5 GiB -> base 1.5 GiB x 2^2
    assert size(core, LEARNING, 100.0, 200 * MIB, k=2, streak_limit=3 * GIB // 2)[3] == 6 * GIB
    # the computed limit wins when it is larger
    assert size(core, LEARNING, 100.0, 200 * MIB, k=2, streak_limit=100 * MIB)[3] == 4 * GIB


def test_node_ceiling_clips_backoff(core: ModuleType) -> None:
    # rule S15: 1024Mi x 2^3 = 8 GiB, clipped to a 5 GiB ceiling and flagged
    _, _, req, lim, capped = size(core, LEARNING, 100.0, 200 * MIB, k=3, ceiling=5 * GIB)
    assert (lim, capped, req) == (5 * GIB, True, 5 * GIB)
    # a ceiling above the limit changes nothing
    assert size(core, LEARNING, 100.0, 200 * MIB, k=3, ceiling=9 * GIB)[3:] == (
        8 * GIB,
        False,
    )


def test_unknown_phase_backoff_and_ceiling(core: ModuleType) -> None:
    # rules S7, S14, S15 in the unknown phase: 4 GiB x 2 = 8 GiB, clipped to 6 GiB
    assert size(core, UNKNOWN, k=1, ceiling=6 * GIB) == (
        500,
        500,
        6 * GIB,
        6 * GIB,
        True,
    )


def test_burstable_request_never_above_limit(core: ModuleType) -> None:
    # rule S16: burstable keeps the computed request, but a ceiling below it pulls it down
    assert size(core, CONFIDENT, 100.0, 3 * GIB, guaranteed=False, ceiling=2 * GIB)[2:4] == (2 * GIB, 2 * GIB)


def test_backoff_doubles_at_most_ten_times(core: ModuleType) -> None:
    # rule S14, capped: 2**k for a long streak overflowed the JSON encoder (64 runs: a 500)
    assert core.MAX_BACKOFF_DOUBLINGS == REF.MAX_BACKOFF_DOUBLINGS == 10
    # 1024Mi x 2^10 = 1Ti is what S14 says for a streak of 10: not capped
    assert size(core, LEARNING, 100.0, 200 * MIB, k=10)[3:] == (1024 * GIB, False)
    # a longer streak doubles no further, and the answer says the limit was capped
    for k in (11, 64, 200, 100_000):
        assert size(core, LEARNING, 100.0, 200 * MIB, k=k)[3:] == (1024 * GIB, True)


def test_backoff_saturates_instead_of_overflowing(core: ModuleType) -> None:
    # rule S14 from a base past 2^53: ten doublings would pass 2^63; the limit saturates, capped
    assert size(core, LEARNING, 100.0, 200 * MIB, k=10, streak_limit=(1 << 53) + 1)[3:] == (REF.MAX_BYTES, True)


def test_backoff_ceiling_without_a_node_ceiling(core: ModuleType) -> None:
    # rules S14/S15: a 3 GiB job (3Gi x 1.1 -> 3380Mi -> 4Gi) after 10 OOM-suspect runs and no node
    # ceiling known was told 4096Gi; the backoff ceiling (CI_SIZER_MAX_BACKOFF_MEMORY) clips it
    assert size(core, CONFIDENT, 100.0, 3 * GIB, k=10)[3] == 4096 * GIB
    assert size(core, CONFIDENT, 100.0, 3 * GIB, k=10, backoff=64 * GIB)[2:] == (64 * GIB, 64 * GIB, True)
    # below it nothing changes
    assert size(core, CONFIDENT, 100.0, 3 * GIB, k=3, backoff=64 * GIB)[3:] == (32 * GIB, False)
    # a base already above it is kept (not lowered, not doubled)
    assert size(core, CONFIDENT, 100.0, 3 * GIB, k=2, streak_limit=100 * GIB, backoff=64 * GIB)[3:] == (
        100 * GIB,
        True,
    )
    # a node ceiling, when one is known, is the bound instead (rule S15)
    assert size(core, CONFIDENT, 100.0, 3 * GIB, k=10, ceiling=200 * GIB, backoff=64 * GIB)[3:] == (200 * GIB, True)
    # no streak: the backoff ceiling bounds nothing
    assert size(core, LEARNING, 100.0, 30 * GIB, backoff=64 * GIB)[3:] == (128 * GIB, False)


@pytest.mark.skipif(PURE or compiled() is None, reason="needs the compiled backend")
@settings(max_examples=examples(500), deadline=None)
@given(
    phase=st.integers(0, 2),
    cpu=st.one_of(st.floats(0, 1e9, allow_nan=False), st.integers(0, 100_000).map(float)),
    mem=st.integers(0, 1 << 50),
    pod=st.one_of(st.just(-1), st.integers(0, 1 << 56)),
    buffer=st.integers(0, 1000),
    k=st.integers(0, 70),
    streak_limit=st.one_of(st.just(-1), st.integers(1, 1 << 50)),
    ceiling=st.one_of(st.just(-1), st.integers(1, 1 << 52)),
    guaranteed=st.booleans(),
    backoff=st.one_of(st.just(-1), st.integers(1, 1 << 52)),
)
def test_size_container_backends_agree(
    phase: int,
    cpu: float,
    mem: int,
    pod: int,
    buffer: int,
    k: int,
    streak_limit: int,
    ceiling: int,
    guaranteed: bool,
    backoff: int,
) -> None:
    cy = compiled()
    assert cy is not None
    args = (phase, cpu, mem, pod, buffer, k, streak_limit, ceiling, guaranteed, backoff)
    assert tuple(cy.size_container(*args)) == tuple(REF.size_container(*args))


@pytest.mark.skipif(PURE or compiled() is None, reason="needs the compiled backend")
@settings(max_examples=examples(300), deadline=None)
@given(
    st.floats(0, 1e12, allow_nan=False),
    st.integers(0, 1 << 56),
    st.integers(0, 1 << 40),
)
def test_helpers_backends_agree(x: float, mem: int, m: int) -> None:
    cy = compiled()
    assert cy is not None
    assert cy.ceil_tolerant(x) == REF.ceil_tolerant(x)
    assert cy.memory_buffer_percent(mem) == REF.memory_buffer_percent(mem)
    assert cy.memory_limit_for(mem) == REF.memory_limit_for(mem)
    assert cy.cpu_limit_for(m) == REF.cpu_limit_for(m)


def test_backend_switch_is_honoured() -> None:
    import service.core as live

    assert live.BACKEND == ("python" if PURE or compiled() is None else "cython")
