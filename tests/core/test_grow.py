"""Growth in the core (issue 40, docs/sizing.md): the ``grow`` block's arithmetic (rules G3-G5,
``size_grow``), the window it reads (G3's P, ``window_peak``) and the growth policy (G8,
``POLICY_GROWTH``), worked by hand on both backends, and the compiled backend against the reference
under hypothesis."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ..helpers import examples
from .conftest import PURE, compiled
from .test_size_run import _PINS, CI, CLEAN, EFFICIENT, GIB, KILLED, MIB, NEAR, columns, job, size

REF = importlib.import_module("service.core._reference")
GROWTH = 6


# --------------------------------------------------------------------------- G3-G5 by hand


def test_g3_max_is_twice_the_larger_of_limit_and_peak_at_least_4gi(core: ModuleType) -> None:
    # rule G3: a 3Gi limit over a window whose highest peak was 2.5Gi may grow to 2 x 3Gi
    assert core.size_grow(3 * GIB, 2560 * MIB, 64 * GIB)[0] == 6 * GIB
    # a peak above the limit (the growth policy's limit at a typical peak) sets the maximum: 2 x 5Gi
    assert core.size_grow(3 * GIB, 5 * GIB, 64 * GIB)[0] == 10 * GIB
    # up to a whole MiB: 2 x (3Gi + 0.5 MiB) = 3Gi x 2 + 1Mi
    assert core.size_grow(3 * GIB, 3 * GIB + MIB // 2, 64 * GIB)[0] == 6 * GIB + MIB
    # at least the 4Gi a job never seen is given (S7): a 1Gi limit, an 800Mi peak
    assert core.size_grow(GIB, 800 * MIB, 64 * GIB)[0] == 4 * GIB
    assert core.size_grow(32 * MIB, 3 * MIB, 64 * GIB)[0] == 4 * GIB
    # rule G2's bound wins: a node ceiling of 1843Mi
    assert core.size_grow(GIB, 800 * MIB, 1843 * MIB)[0] == 1843 * MIB
    # no bound (-1): the rule alone, saturating far above any node
    assert core.size_grow(3 * GIB, -1, -1)[0] == 6 * GIB
    assert core.size_grow((1 << 61) + 1, -1, -1)[0] == 1 << 62
    assert core.size_grow(1 << 62, -1, -1) == core.NO_GROW  # saturated: nothing above it


def test_g1_no_growth_when_the_maximum_does_not_exceed_the_limit(core: ModuleType) -> None:
    # rule G1: a bound at or under the limit (a runner ceiling that capped it, a node ceiling that clipped it)
    assert core.size_grow(GIB, 800 * MIB, GIB) == core.NO_GROW == (-1, 0, 0)
    assert core.size_grow(GIB, 800 * MIB, 512 * MIB) == core.NO_GROW
    # no recommendation, no growth
    assert core.size_grow(-1, 800 * MIB, 64 * GIB) == core.NO_GROW
    assert core.size_grow(0, -1, 64 * GIB) == core.NO_GROW


@pytest.mark.parametrize(
    ("limit", "peak", "threshold"),
    [
        (GIB, -1, 90),  # no peak known: 90
        (GIB, 800 * MIB, 90),  # the window used 78 %: at least 90
        (1000 * MIB, 899 * MIB, 90),  # floor(89.9) + 1
        (1000 * MIB, 930 * MIB, 94),  # just above what the window's runs used: they do not grow
        (1000 * MIB, 950 * MIB, 95),  # 96, at most 95: 5 % left to react in
        (105 * MIB, 100 * MIB, 95),  # a 5 % margin: 95
        (103 * MIB, 100 * MIB, 95),  # efficient's 3 % margin (E3): 98, at most 95
        (499 * MIB, 1000 * MIB, 95),  # the growth policy's limit under the window's highest peak
        (64 * GIB, 64 * GIB - 1, 95),
    ],
)
def test_g4_threshold_just_above_the_window_within_90_95(
    core: ModuleType, limit: int, peak: int, threshold: int
) -> None:
    assert core.size_grow(limit, peak, -1)[1] == threshold


def test_g5_step_a_quarter_of_the_limit_at_least_64mi_at_most_to_the_maximum(core: ModuleType) -> None:
    assert core.size_grow(GIB, -1, -1)[2] == 256 * MIB  # a quarter
    assert core.size_grow(128 * MIB, -1, -1)[2] == 64 * MIB  # 32Mi, raised to 64Mi
    assert core.size_grow(1000 * MIB + 1, -1, -1)[2] == 251 * MIB  # a quarter, up to a whole MiB
    assert core.size_grow(GIB, -1, GIB + 100 * MIB)[2] == 100 * MIB  # never past the maximum
    assert core.size_grow(GIB, -1, GIB + 100 * MIB)[0] == GIB + 100 * MIB
    # the worked example of docs/sizing.md (seed, confident, 900Mi peak -> 2Gi limit, 16 GiB node)
    assert core.size_grow(2 * GIB, 900 * MIB, 14745 * MIB) == (4 * GIB, 90, 512 * MIB)


# --------------------------------------------------------------------------- G3's P: the window


def test_window_peak_reads_the_runs_the_streak_is_counted_over(core: ModuleType) -> None:
    # seed, runs=2: the window starts at the oldest of the newest two clean runs (index 2)
    clean = [CLEAN, CLEAN, CLEAN, KILLED, CLEAN]
    mem = [900 * MIB, 100 * MIB, 200 * MIB, 700 * MIB, 300 * MIB]
    present = [1] * 5
    assert core.window_peak(5, clean, present, mem, CI, 2) == 700 * MIB  # the killed run counts
    assert core.window_peak(5, clean, present, mem, CI, 5) == 900 * MIB
    # before run 3: the window is runs 1-2
    assert core.window_peak(3, clean, present, mem, CI, 2) == 200 * MIB
    # a container absent from a run: that run's peak does not count
    assert core.window_peak(5, clean, [1, 1, 1, 0, 1], mem, CI, 2) == 300 * MIB
    # no sample at all: every run before i (the unknown phase's kills)
    assert core.window_peak(2, [KILLED, KILLED], [1, 1], [400 * MIB, 600 * MIB], CI, 5) == 600 * MIB
    assert core.window_peak(0, [], [], [], CI, 5) == -1
    # efficient (and growth): a near-limit run is a sample (E1), and the window is 30 samples (E2)
    h = [NEAR] + [CLEAN] * 30
    peaks = [950 * MIB] + [100 * MIB] * 30
    assert core.window_peak(31, h, [1] * 31, peaks, CI, 5) == 100 * MIB
    assert core.window_peak(31, h, [1] * 31, peaks, EFFICIENT, 5) == 100 * MIB
    assert core.window_peak(31, [CLEAN] * 31, [1] * 31, [950 * MIB] + [100 * MIB] * 30, GROWTH, 5) == 100 * MIB
    assert core.window_peak(30, h[:30], [1] * 30, peaks[:30], GROWTH, 5) == 950 * MIB


def test_window_peak_bad_arguments(core: ModuleType) -> None:
    with pytest.raises(ValueError, match="outside"):
        core.window_peak(2, [1], [1], [1], CI, 5)
    with pytest.raises(ValueError, match="differ in length"):
        core.window_peak(1, [1], [1, 1], [1], CI, 5)
    with pytest.raises(ValueError, match="at least 1"):
        core.window_peak(1, [1], [1], [1], CI, 0)


# --------------------------------------------------------------------------- G8: the growth policy


def test_g8_confident_limit_at_the_p75_of_the_window(core: ModuleType) -> None:
    # four samples 100, 200, 300, 1000 Mi: p75 (I2) = 300 + 0.25 x 700 = 475Mi; limit + 3 % = 489.25 -> 490Mi
    h = job([100 * MIB, 1000 * MIB, 200 * MIB, 300 * MIB])
    g = size(core, h, GROWTH)
    assert (g.phase, g.memory_limit, g.memory_request) == (2, 490 * MIB, 490 * MIB)
    assert g.memory_observed == 1000 * MIB  # what was observed is still the highest peak
    b = size(core, h, GROWTH, guaranteed=False)
    assert (b.memory_request, b.memory_limit) == (475 * MIB, 490 * MIB)
    # efficient aims at the highest peak (E3), with E13's 20 % at four samples: 1200Mi (G8 has no E13)
    assert size(core, h, EFFICIENT).memory_limit == 1200 * MIB


def test_g8_learning_kills_cpu_and_pins_as_efficient(core: ModuleType) -> None:
    # learning (1-2 samples): E3's highest + 20 %, as efficient
    assert size(core, job([100 * MIB, 300 * MIB]), GROWTH).memory_limit == 360 * MIB
    # a kill doubles (E5) and two kills reach the default, as efficient
    base = [100 * MIB] * 7  # seven samples: E3's 3 % for efficient too (E13)
    one = job([*base, 105 * MIB], clean=[CLEAN] * 7 + [KILLED], oom=[0] * 7 + [2], limit=[-1] * 7 + [105 * MIB])
    g, e = size(core, one, GROWTH), size(core, one, EFFICIENT)
    assert (g.consecutive, g.memory_limit) == (e.consecutive, e.memory_limit) == (1, 210 * MIB)
    # CPU is efficient's (E7)
    h = job([100 * MIB] * 3, cpu=[400.0, 800.0, 600.0])
    assert size(core, h, GROWTH)[1:3] == size(core, h, EFFICIENT)[1:3] == (800, 1000)
    # the p75 of equal peaks is the peak: the same answer as efficient
    assert tuple(size(core, job([100 * MIB] * 7), GROWTH)) == tuple(size(core, job([100 * MIB] * 7), EFFICIENT))
    assert core.analysed_runs(3, [CLEAN, NEAR, CLEAN], GROWTH, 5) == [2, 1, 0]


def test_g8_quantile_in_integers() -> None:
    # I2's interpolation, rounded up to a whole byte: p75 of [0, 3] is 2.25 -> 3
    assert REF._quarter_quantile([3, 0]) == 3
    assert REF._quarter_quantile([7]) == 7
    assert REF._quarter_quantile([1, 2, 3, 4, 5]) == 4  # h = 3 exactly


# --------------------------------------------------------------------------- compiled == reference

needs_compiled = pytest.mark.skipif(PURE or compiled() is None, reason="the compiled backend is not built")
_BYTES = st.integers(-1, 1 << 62)


@needs_compiled
@settings(max_examples=examples(500), deadline=None)
@given(
    limit=st.one_of(st.integers(-1, 64 * GIB), _BYTES),
    peak=st.one_of(st.integers(-1, 64 * GIB), _BYTES),
    bound=st.one_of(st.just(-1), st.integers(0, 128 * GIB), _BYTES),
)
def test_size_grow_backends_agree(limit: int, peak: int, bound: int) -> None:
    cy = compiled()
    assert cy is not None
    got = cy.size_grow(limit, peak, bound)
    assert tuple(got) == tuple(REF.size_grow(limit, peak, bound))
    most, threshold, step = got
    if most >= 0:  # the wire contract (GROWTH-CONTRACT.md section 1) holds for any input
        assert most > limit
        assert 50 <= threshold <= 99
        assert 0 < step <= most - limit


@needs_compiled
@settings(max_examples=examples(400), deadline=None)
@given(h=columns(), data=st.data(), policy=st.sampled_from([CI, EFFICIENT, GROWTH]), runs=st.integers(1, 25))
def test_window_peak_backends_agree(h: dict[str, list[Any]], data: st.DataObject, policy: int, runs: int) -> None:
    cy = compiled()
    assert cy is not None
    i = data.draw(st.integers(0, len(h["clean"])))
    args = (i, h["clean"], h["present"], h["mem_peak"], policy, runs)
    assert cy.window_peak(*args) == REF.window_peak(*args)


@needs_compiled
@settings(max_examples=examples(400), deadline=None)
@given(
    h=columns(), data=st.data(), runs=st.integers(1, 25), buffer=st.integers(0, 1000), guaranteed=st.booleans(),
    pins=_PINS, ceiling=st.one_of(st.just(-1), st.integers(0, 8 * GIB)),
    backoff=st.one_of(st.just(-1), st.integers(0, 64 * GIB)), prior=st.one_of(st.just(-1), st.integers(32 * MIB, 4 * GIB)),
)  # fmt: skip
def test_growth_policy_backends_agree(
    h: dict[str, list[Any]], data: st.DataObject, runs: int, buffer: int, guaranteed: bool, pins: tuple[int, ...],
    ceiling: int, backoff: int, prior: int,
) -> None:  # fmt: skip
    cy = compiled()
    assert cy is not None
    i = data.draw(st.integers(0, len(h["clean"])))
    args = (i, *h.values(), ceiling, GROWTH, runs, buffer, guaranteed, pins, backoff, prior)
    assert tuple(cy.size_run(*args)) == tuple(REF.size_run(*args))
    n = len(h["clean"])
    walk = (
        h["clean"], h["present"], h["cpu_stat"], h["cpu_peak"], h["cpu_p95"], h["cpu_stat"], h["mem_peak"],
        h["mem_limit"], h["oom"], h["pod_peak"], [ceiling] * n, [60.0] * n, GROWTH, runs, buffer, guaranteed, pins,
        backoff, [prior] * n,
    )  # fmt: skip
    got, want = cy.backtest_walk(*walk), REF.backtest_walk(*walk)
    assert tuple(got[:4]) == tuple(want[:4])
    assert got[4:] == pytest.approx(want[4:], rel=1e-9, abs=1e-6)


def test_growth_constants_agree() -> None:
    cy = compiled()
    if cy is None:
        pytest.skip("the compiled backend is not built")
    for name in (
        "POLICY_GROWTH", "GROWTH_QUANTILE_QUARTERS", "GROW_FACTOR", "GROW_MIN_BYTES", "GROW_THRESHOLD_MIN",
        "GROW_THRESHOLD_MAX", "GROW_STEP_DIVISOR", "NO_GROW",
    ):  # fmt: skip
        assert getattr(cy, name) == getattr(REF, name), name
