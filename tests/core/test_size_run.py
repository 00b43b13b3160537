"""``size_run``: the one home of the sizing policy, per run, on both core backends.

- the efficient policy's rules (E1-E13, docs/sizing.md) worked out by hand;
- the compiled backend gives the reference's answers (hypothesis), for every policy code;
- ``backtest_walk`` scores exactly what ``size_run`` recommends before each run;
- at ``i == n``, ``size_run`` gives what the live ``compute()`` answers for the same history,
  overrides included (the precursor of the HTTP parity test).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.keys import ScopeKey
from service.overrides.service import FIELDS
from service.runs.service import is_oom_suspect
from service.sizing import service as sizing_service
from service.sizing.history import History, HistoryRun
from service.sizing.params import SizingParams

from ..helpers import examples
from .conftest import PURE, compiled

REF = importlib.import_module("service.core._reference")
MIB = 1 << 20
GIB = 1 << 30
CI, FIXED, KRR, VPA, RECORDED, EFFICIENT, GROWTH = 0, 1, 2, 3, 4, 5, 6
KILLED, CLEAN, NEAR = 0, 1, 2
NO_PINS = (-1, -1, -1, -1, 0, 0, 0, 0)
RANK = {"org": 1, "repo": 2, "workflow": 3, "job": 4}
SOURCE = {0: "algorithm", 1: "org", 2: "repo", 3: "workflow", 4: "job"}


def job(
    mem: list[int], *, cpu: list[float] | None = None, clean: list[int] | None = None, oom: list[int] | None = None,
    limit: list[int] | None = None,
) -> dict[str, list[Any]]:  # fmt: skip
    """One container present in every run; all six CPU stats equal."""
    n = len(mem)
    cpu = cpu or [100.0] * n
    return {
        "clean": clean or [CLEAN] * n,
        "present": [1] * n,
        "cpu_stat": cpu,
        "cpu_peak": cpu,
        "cpu_p95": cpu,
        "mem_peak": mem,
        "mem_limit": limit or [-1] * n,
        "oom": oom or [0] * n,
        "pod_peak": mem,
    }


def size(
    core: ModuleType, h: dict[str, list[Any]], policy: int = EFFICIENT, *, i: int | None = None, runs: int = 5,
    buffer: int = 20, guaranteed: bool = True, prior: int = -1, ceiling: int = -1, pins: tuple[int, ...] = NO_PINS,
    seconds: list[float] | None = None,
) -> Any:  # fmt: skip
    n = len(h["clean"])
    return core.size_run(
        n if i is None else i, *h.values(), ceiling, policy, runs, buffer, guaranteed, pins, 64 * GIB, prior, seconds
    )


# --------------------------------------------------------------------------- efficient, by hand


def test_e11_margin_where_the_runs_reserve_little(core: ModuleType) -> None:
    # rule E11: a confident job's margin follows what its runs reserve (need x mean duration), in MiB-seconds
    mem = [90 * MIB, 100 * MIB, 95 * MIB] + [90 * MIB] * 4  # seven samples: E3's 3 % (E13)
    # 100Mi for 1 s: 100 MiB-s, under EFFICIENT_CHEAPEST_MIB_SECONDS (192) -> E3's first-sample 50 %
    assert size(core, job(mem), seconds=[1.0] * 7).memory_limit == 150 * MIB
    # 100Mi for 10 s: 1,000 MiB-s, under EFFICIENT_CHEAP_MIB_SECONDS (2,466) -> E3's learning 20 %
    assert size(core, job(mem), seconds=[5.0, 10.0, 15.0] + [10.0] * 4).memory_limit == 120 * MIB
    # 100Mi for 30 s: 3,000 MiB-s, dear -> E3's 3 %; the same without durations, or with none known
    assert size(core, job(mem), seconds=[30.0] * 7).memory_limit == 103 * MIB
    assert size(core, job(mem)).memory_limit == 103 * MIB
    assert size(core, job(mem), seconds=[-1.0] * 7).memory_limit == 103 * MIB
    # an unknown duration is left out of the mean: 1 s known -> cheapest
    assert size(core, job(mem), seconds=[-1.0, 1.0] + [-1.0] * 5).memory_limit == 150 * MIB
    # with fewer than seven samples a dear job keeps E3's learning 20 % (E13), a cheap one E11's 50 %
    assert size(core, job(mem[:3]), seconds=[30.0] * 3).memory_limit == 120 * MIB
    assert size(core, job(mem[:3]), seconds=[1.0] * 3).memory_limit == 150 * MIB
    # the mean is over the analysed samples only: a long killed run does not make the job dear
    killed = job([90 * MIB, 100 * MIB, 95 * MIB, 80 * MIB, 70 * MIB], clean=[CLEAN, CLEAN, CLEAN, KILLED, CLEAN],
                 oom=[0, 0, 0, 2, 0], limit=[-1, -1, -1, 60 * MIB, -1])  # fmt: skip
    assert size(core, killed, seconds=[1.0, 1.0, 1.0, 9000.0, 1.0]).memory_limit == 150 * MIB
    # learning keeps E3's margins whatever the durations (one sample 50 %, two 20 %)
    assert size(core, job(mem[:2]), seconds=[1.0, 1.0]).memory_limit == 120 * MIB
    # E5 speaks while a kill streak runs: the step is from E3's 3 % limit, as without durations
    streak = job([*mem, 50 * MIB], clean=[CLEAN] * 7 + [KILLED], oom=[0] * 7 + [2], limit=[-1] * 7 + [60 * MIB])
    assert size(core, streak, seconds=[1.0] * 8).memory_limit == size(core, streak).memory_limit
    # the seed policy reads no durations
    assert size(core, job(mem), CI, seconds=[1.0] * 7) == size(core, job(mem), CI)


STEADY = [90 * MIB, 100 * MIB, 95 * MIB, 90 * MIB, 95 * MIB, 90 * MIB, 95 * MIB]  # seven samples (E13)


def test_e3_e8_margin_over_the_highest_peak(core: ModuleType) -> None:
    # rule E3: seven samples, highest 100Mi -> limit 100Mi + 3 % = 103Mi (E8: a whole MiB, no power of two)
    s = size(core, job(STEADY))
    assert (s.phase, s.memory_limit, s.memory_request) == (2, 103 * MIB, 103 * MIB)
    assert s.memory_observed == 100 * MIB
    # burstable (E9): the request is the highest peak itself, the limit keeps the margin
    b = size(core, job(STEADY), guaranteed=False)
    assert (b.memory_request, b.memory_limit) == (100 * MIB, 103 * MIB)
    # the seed would give the next power of two: 128Mi (rule S12)
    assert size(core, job([90 * MIB, 100 * MIB, 95 * MIB]), CI).memory_limit == 128 * MIB


def test_e3_learning_margin(core: ModuleType) -> None:
    # one sample: 50 % (100Mi -> 150Mi); two: 20 % (highest 100Mi -> 120Mi); the seed triples (S8: 300Mi -> 512Mi)
    assert size(core, job([100 * MIB])).memory_limit == 150 * MIB
    assert size(core, job([90 * MIB, 100 * MIB])).memory_limit == 120 * MIB
    assert size(core, job([100 * MIB]), CI).memory_limit == 512 * MIB


def test_e13_learning_margin_until_seven_samples(core: ModuleType) -> None:
    # rule E13: confident from three samples (S4), but E3's learning 20 % holds until the container has
    # EFFICIENT_STEADY_SAMPLES (7) analysed samples: 3 % over the highest of 3-6 bounds the next peak too seldom
    assert core.EFFICIENT_STEADY_SAMPLES == 7
    for n in range(3, 7):
        s = size(core, job([100 * MIB] * n))
        assert (s.phase, s.memory_limit) == (2, 120 * MIB), n
    assert size(core, job([100 * MIB] * 7)).memory_limit == 103 * MIB
    # a container counts the analysed runs it is in (S6): seven samples of the job, six of them with it
    absent = dict(job([100 * MIB] * 7), present=[1, 1, 1, 0, 1, 1, 1])
    assert size(core, absent).memory_limit == 120 * MIB
    # E10's remembered kill gets the same 20 %; E5 steps from it (max(120Mi, 105Mi) x 2)
    killed = job([100 * MIB] * 3 + [105 * MIB, 100 * MIB], clean=[CLEAN] * 3 + [KILLED, CLEAN], oom=[0, 0, 0, 2, 0],
                 limit=[-1, -1, -1, 105 * MIB, 210 * MIB])  # fmt: skip
    assert size(core, killed).memory_limit == 126 * MIB  # 105Mi x 1.2
    assert size(core, killed, i=4).memory_limit == 240 * MIB
    # E11's wider margin for cheap runs still applies (50 %); a dear job keeps E13's 20 %
    assert size(core, job([100 * MIB] * 4), seconds=[1.0] * 4).memory_limit == 150 * MIB
    assert size(core, job([100 * MIB] * 4), seconds=[60.0] * 4).memory_limit == 120 * MIB
    # the growth policy (G8) aims at a typical peak, not the highest: no E13; the seed is unchanged
    assert size(core, job([100 * MIB] * 4), GROWTH).memory_limit == 103 * MIB
    assert size(core, job([100 * MIB] * 4), CI).memory_limit == 128 * MIB


def test_e8_floor(core: ModuleType) -> None:
    # a 3Mi job still gets 32Mi (request and limit)
    s = size(core, job([3 * MIB] * 4), guaranteed=False)
    assert (s.memory_request, s.memory_limit) == (32 * MIB, 32 * MIB)


def test_e1_near_limit_run_is_a_sample(core: ModuleType) -> None:
    # a run at 96 % of its limit is OOM-suspect under S1 (not clean for the seed) but not a kill:
    # the efficient policy counts it as a sample; the seed stays in the learning phase
    h = job([100 * MIB, 100 * MIB, 101 * MIB], clean=[CLEAN, CLEAN, NEAR], oom=[0, 0, 1], limit=[-1, -1, 105 * MIB])
    e = size(core, h)
    assert (e.phase, e.memory_limit, e.consecutive) == (2, 122 * MIB, 0)  # E13, three samples: 101Mi x 1.2 -> 122Mi
    seed = size(core, h, CI)
    assert (seed.phase, seed.consecutive) == (1, 1)


def test_e2_window_is_at_least_30_samples(core: ModuleType) -> None:
    # the highest peak 30 runs back still counts for efficient (window 30), not for the seed (5)
    h = job([200 * MIB] + [100 * MIB] * 29)
    assert size(core, h).memory_observed == 200 * MIB
    assert size(core, h, CI).memory_observed == 100 * MIB
    assert size(core, job([200 * MIB] + [100 * MIB] * 30)).memory_observed == 100 * MIB
    # whatever ``runs`` says below it; above it, ``runs`` rules
    assert size(core, h, runs=20).memory_observed == 200 * MIB
    assert size(core, job([200 * MIB] + [100 * MIB] * 30), runs=31).memory_observed == 200 * MIB


def test_e5_a_kill_doubles_two_kills_reach_the_default(core: ModuleType) -> None:
    base = [100 * MIB] * 7  # seven samples: E3's 3 % (E13), 103Mi, below the 105Mi killed limit
    one = job([*base, 105 * MIB], clean=[CLEAN] * 7 + [KILLED], oom=[0] * 7 + [2], limit=[-1] * 7 + [105 * MIB])
    s = size(core, one)
    assert (s.consecutive, s.backoff_factor, s.memory_limit) == (1, 2, 210 * MIB)
    two = job(
        [*base, 105 * MIB, 210 * MIB], clean=[CLEAN] * 7 + [KILLED, KILLED], oom=[0] * 7 + [2, 2],
        limit=[-1] * 7 + [105 * MIB, 210 * MIB],
    )  # fmt: skip
    s = size(core, two)
    assert (s.consecutive, s.memory_limit) == (2, 4 * GIB)  # 105Mi x 4 = 420Mi, raised to the default


def test_e10_a_kill_is_remembered_after_its_streak(core: ModuleType) -> None:
    # rule E10: killed at 105Mi, then a clean 100Mi run: the need is the 105Mi the run was killed at, not
    # the samples' 100Mi that got it killed (105Mi x 1.03 = 108.15 -> 109Mi, E3 and E8)
    kill = {"clean": [CLEAN] * 7 + [KILLED], "oom": [0] * 7 + [2], "limit": [-1] * 7 + [105 * MIB]}
    h = job([100 * MIB] * 7 + [105 * MIB, 100 * MIB], clean=[*kill["clean"], CLEAN], oom=[*kill["oom"], 0],
            limit=[*kill["limit"], 210 * MIB])  # fmt: skip
    s = size(core, h)
    assert (s.consecutive, s.memory_limit, s.memory_observed) == (0, 109 * MIB, 100 * MIB)
    # the killed run's reported peak may be below the limit it was killed at: the limit counts
    low = dict(h, mem_peak=[100 * MIB] * 7 + [60 * MIB, 100 * MIB])
    assert size(core, low).memory_limit == 109 * MIB
    # only the container that was killed: present elsewhere, absent from the killed run, it is not raised
    absent = dict(h, present=[1] * 7 + [0, 1])
    assert size(core, absent).memory_limit == 103 * MIB
    # the seed is unchanged (S14 after the streak: nothing)
    assert size(core, h, CI).memory_limit == 128 * MIB
    # while the streak runs, E5 alone speaks: 105Mi doubled once, not the killed limit plus a margin doubled
    assert size(core, h, i=8).memory_limit == 210 * MIB
    # a kill older than the oldest analysed sample (E2's 30) is forgotten, as E5's streak would be
    old = job([100 * MIB, 105 * MIB] + [100 * MIB] * 30, clean=[CLEAN, KILLED] + [CLEAN] * 30,
              oom=[0, 2] + [0] * 30, limit=[-1, 105 * MIB] + [-1] * 30)  # fmt: skip
    assert size(core, old).memory_limit == 103 * MIB
    assert size(core, old, i=31).memory_limit == 109 * MIB  # the oldest sample is run 0: the kill is in


def test_e6_first_run_from_the_prior_and_recovery(core: ModuleType) -> None:
    state = core.PRIOR_EMPTY
    assert core.prior_read(state) == -1  # no sampled job: the unknown-phase default
    # rule E6: one sampled job is too little to go on (PRIOR_MIN_JOBS = 2): still the default, however
    # many of that job's runs; two sampled jobs, their highest peak x 1.5; three, + 3 %
    state = core.prior_update(state, 300 * MIB, True)
    assert state == (1, 300 * MIB)
    assert core.prior_read(state) == -1
    for peak, first in ((500 * MIB, False), (100 * MIB, True)):
        state = core.prior_update(state, peak, first)
    assert state == (2, 500 * MIB)
    assert core.prior_read(state) == 750 * MIB
    state = core.prior_update(state, 50 * MIB, True)
    assert state == (3, 500 * MIB)
    prior = core.prior_read(state)
    assert prior == 515 * MIB  # 500Mi + 3 %
    empty = job([])
    s = size(core, empty, prior=prior)
    assert (s.phase, s.memory_limit, s.memory_request, s.cpu_request) == (0, prior, prior, 500)
    assert size(core, empty, CI, prior=prior).memory_limit == 4 * GIB  # the seed ignores the prior
    # killed under the prior: E5 steps from the limit it was killed at like any kill, 2 x 515Mi (not the
    # 4Gi default at once); killed again, two kills in a row reach the default (E5's floor)
    killed = job([prior], clean=[KILLED], oom=[2], limit=[prior])
    s = size(core, killed, prior=prior)
    assert (s.phase, s.consecutive, s.memory_limit) == (0, 1, 1030 * MIB)
    twice = job([prior, 2 * prior], clean=[KILLED, KILLED], oom=[2, 2], limit=[prior, 2 * prior])
    s = size(core, twice, prior=prior)
    assert (s.phase, s.consecutive, s.memory_limit) == (0, 2, 4 * GIB)  # 515Mi x 4 = 2060Mi, raised to 4Gi
    # a run killed under a limit of its own (above the prior) steps from that limit: the need is above it
    own = job([GIB], clean=[KILLED], oom=[2], limit=[GIB])
    assert size(core, own, prior=prior).memory_limit == 2 * GIB
    # with no prior the first run had the 4Gi default: a kill doubles it, as before
    assert size(core, job([4 * GIB], clean=[KILLED], oom=[2], limit=[4 * GIB])).memory_limit == 8 * GIB
    # a huge org peak never puts the prior above the default
    assert core.prior_read((5, 100 * GIB)) == 4 * GIB


def test_e7_cpu_without_buffer_on_the_request(core: ModuleType) -> None:
    s = size(core, job([100 * MIB] * 3, cpu=[400.0, 800.0, 600.0]))
    assert (s.cpu_request, s.cpu_limit, s.cpu_observed) == (800, 1000, 800.0)  # limit: 960m up to 500m steps
    assert size(core, job([100 * MIB] * 3, cpu=[400.0, 800.0, 600.0]), CI).cpu_request == 960


def test_pins_and_ceiling_apply_to_efficient(core: ModuleType) -> None:
    pins = (-1, -1, -1, 64 * MIB, 0, 0, 0, 4)  # memory limit pinned at job scope
    s = size(core, job([100 * MIB] * 3), pins=pins)
    # O3: the computed request (103Mi) is above the pinned limit: the more specific source wins
    assert (s.memory_limit, s.memory_limit_source, s.memory_request, s.memory_request_source) == (
        64 * MIB, 4, 64 * MIB, 4,
    )  # fmt: skip
    s = size(core, job([100 * MIB] * 3), ceiling=80 * MIB)
    assert (s.memory_limit, s.capped) == (80 * MIB, True)


def test_container_outside_the_analysed_runs(core: ModuleType) -> None:
    h = job([100 * MIB] * 3)
    h["present"] = [0, 0, 0]
    assert size(core, h).phase == -1
    assert size(core, h, CI).memory_limit == -1
    assert core.analysed_runs(3, h["clean"], EFFICIENT, 5) == [2, 1, 0]


def test_bad_arguments(core: ModuleType) -> None:
    h = job([MIB])
    with pytest.raises(ValueError, match="outside"):
        size(core, h, i=2)
    with pytest.raises(ValueError, match="unknown policy"):
        size(core, h, 9)
    with pytest.raises(ValueError, match="differ in length"):
        core.size_run(0, [1], [1], [1.0], [1.0], [1.0], [1], [1], [0], [], -1, 0, 5, 20, True, NO_PINS)
    with pytest.raises(ValueError, match="never negative"):
        core.prior_update((0, -1), -1, True)


# --------------------------------------------------------------------------- compiled == reference

_N = st.integers(0, 14)


@st.composite
def columns(draw: st.DrawFn) -> dict[str, list[Any]]:
    n = draw(_N)
    small = st.integers(0, 3 * GIB)
    cpu = st.floats(0, 5000, allow_nan=False)
    return {
        "clean": draw(st.lists(st.sampled_from([KILLED, CLEAN, CLEAN, NEAR]), min_size=n, max_size=n)),
        "present": draw(st.lists(st.sampled_from([0, 1, 1, 1]), min_size=n, max_size=n)),
        "cpu_stat": draw(st.lists(cpu, min_size=n, max_size=n)),
        "cpu_peak": draw(st.lists(cpu, min_size=n, max_size=n)),
        "cpu_p95": draw(st.lists(cpu, min_size=n, max_size=n)),
        "mem_peak": draw(st.lists(small, min_size=n, max_size=n)),
        "mem_limit": draw(st.lists(st.one_of(st.just(-1), small), min_size=n, max_size=n)),
        "oom": draw(st.lists(st.sampled_from([0, 0, 1, 2]), min_size=n, max_size=n)),
        "pod_peak": draw(st.lists(small, min_size=n, max_size=n)),
    }


#: rule E11's durations: unknown (-1), short enough for the cheap margins at the drawn peaks, or any
def test_e12_cpu_request_by_run_time(core: ModuleType) -> None:
    # rule E12: a CPU request is held for a run's whole duration, so the window's highest stats are left out while
    # their runs make up less than EFFICIENT_CPU_TIME_PCT (5 %) of the window's run time; the limit keeps E7's highest
    mem = [100 * MIB] * 4
    cpu = [20.0, 300.0, 25.0, 30.0]  # a short burst (300m for 10 s) among long runs (1,000 s at 20-30m)
    s = size(core, job(mem, cpu=cpu), seconds=[1000.0, 10.0, 1000.0, 1000.0])
    assert (s.cpu_request, s.cpu_limit, s.cpu_observed) == (30, 500, 300.0)  # 10 s of 3,010 s: left out
    # without durations, or with one unknown, E7 as it was: the highest stat
    assert size(core, job(mem, cpu=cpu)).cpu_request == 300
    assert size(core, job(mem, cpu=cpu), seconds=[1000.0, 10.0, -1.0, 1000.0]).cpu_request == 300
    # a run of 5 % of the time or more is kept: four equal runs, each 25 % of the time -> the highest
    assert size(core, job(mem, cpu=cpu), seconds=[10.0] * 4).cpu_request == 300
    # runs are left out highest first while the time they add stays under 5 %: 300m (10 s) and 200m (50 s) are
    # 60 of 1,160 s (5.2 %): only 300m is left out; with the 200m run at 40 s (50 of 1,150 s, 4.3 %) both are
    cpu = [20.0, 300.0, 200.0, 30.0]
    assert size(core, job(mem, cpu=cpu), seconds=[500.0, 10.0, 50.0, 600.0]).cpu_request == 200
    assert size(core, job(mem, cpu=cpu), seconds=[500.0, 10.0, 40.0, 600.0]).cpu_request == 30
    # learning too (a sample's duration is known); a job never seen keeps S7's 500m
    assert size(core, job(mem[:2], cpu=[300.0, 20.0]), seconds=[10.0, 1000.0]).cpu_request == 20
    assert size(core, job([], cpu=[]), seconds=[]).cpu_request == 500
    # the seed policy reads no durations
    assert size(core, job(mem, cpu=cpu), CI, seconds=[500.0, 10.0, 40.0, 600.0]) == size(core, job(mem, cpu=cpu), CI)


_SECONDS = st.one_of(st.just(-1.0), st.floats(0, 4, allow_nan=False), st.floats(0, 20000, allow_nan=False))

_PINS = st.tuples(*(st.integers(-1, 8 * GIB) for _ in range(4)), *(st.integers(0, 4) for _ in range(4))).map(
    lambda p: tuple(v if p[4 + f] > 0 else -1 for f, v in enumerate(p[:4])) + p[4:]
)


@pytest.mark.skipif(PURE or compiled() is None, reason="the compiled backend is not built")
@settings(max_examples=examples(400), deadline=None)
@given(
    h=columns(), data=st.data(), policy=st.sampled_from([CI, FIXED, KRR, VPA, RECORDED, EFFICIENT, GROWTH]),
    runs=st.integers(1, 25), buffer=st.integers(0, 1000), guaranteed=st.booleans(), pins=_PINS,
    ceiling=st.one_of(st.just(-1), st.integers(0, 8 * GIB)), backoff=st.one_of(st.just(-1), st.integers(0, 64 * GIB)),
    prior=st.one_of(st.just(-1), st.integers(32 * MIB, 4 * GIB)),
)  # fmt: skip
def test_size_run_backends_agree(
    h: dict[str, list[Any]], data: st.DataObject, policy: int, runs: int, buffer: int, guaranteed: bool,
    pins: tuple[int, ...], ceiling: int, backoff: int, prior: int,
) -> None:  # fmt: skip
    cy = compiled()
    assert cy is not None
    n = len(h["clean"])
    i = data.draw(st.integers(0, n))
    seconds = data.draw(st.one_of(st.none(), st.lists(_SECONDS, min_size=n, max_size=n)))  # rule E11
    args = (i, *h.values(), ceiling, policy, runs, buffer, guaranteed, pins, backoff, prior, seconds)
    assert tuple(cy.size_run(*args)) == tuple(REF.size_run(*args))
    assert cy.analysed_runs(i, h["clean"], policy, runs) == REF.analysed_runs(i, h["clean"], policy, runs)


@pytest.mark.skipif(PURE or compiled() is None, reason="the compiled backend is not built")
@settings(max_examples=examples(300), deadline=None)
@given(
    n=st.integers(1, 40),
    data=st.data(),
    runs=st.integers(1, 25),
    policy=st.sampled_from([EFFICIENT, GROWTH]),
)
def test_e12_backends_agree(n: int, data: st.DataObject, runs: int, policy: int) -> None:
    # rule E12's ordering: CPU stats from a few values (ties) and durations from a few (sums near the 5 % line)
    cy = compiled()
    assert cy is not None
    cpu = data.draw(st.lists(st.sampled_from([0.0, 10.0, 10.5, 250.0, 800.0]), min_size=n, max_size=n))
    seconds = data.draw(
        st.lists(st.sampled_from([-1.0, 0.0, 0.1, 1.0, 5.0, 19.0, 95.0, 100.0]), min_size=n, max_size=n)
    )
    h = job([100 * MIB] * n, cpu=cpu, clean=data.draw(st.lists(st.sampled_from([CLEAN, CLEAN, NEAR, KILLED]),
            min_size=n, max_size=n)))  # fmt: skip
    h["present"] = data.draw(st.lists(st.sampled_from([0, 1, 1, 1]), min_size=n, max_size=n))
    _agree_before_every_run(cy, h, policy, runs, True, seconds)


def _agree_before_every_run(
    cy: ModuleType, h: dict[str, list[Any]], policy: int, runs: int, guaranteed: bool, seconds: list[float] | None
) -> None:
    """Both cores give the same answer before each run of the history ``h`` (and after its last)."""
    for i in range(len(h["clean"]) + 1):
        args = (i, *h.values(), -1, policy, runs, 20, guaranteed, NO_PINS, 64 * GIB, -1, seconds)
        assert tuple(cy.size_run(*args)) == tuple(REF.size_run(*args))


@pytest.mark.skipif(PURE or compiled() is None, reason="the compiled backend is not built")
@settings(max_examples=examples(300), deadline=None)
@given(
    n=st.integers(1, 12),
    data=st.data(),
    runs=st.integers(1, 8),
    policy=st.sampled_from([EFFICIENT, GROWTH]),
    guaranteed=st.booleans(),
)
def test_e13_backends_agree(n: int, data: st.DataObject, runs: int, policy: int, guaranteed: bool) -> None:
    # rule E13: histories around EFFICIENT_STEADY_SAMPLES (7) samples, with kills, S1-only runs, absent runs and
    # durations on both sides of E11's thresholds, so the sample count, E10, E11 and E5 meet E13 in both cores
    cy = compiled()
    assert cy is not None
    mem = data.draw(st.lists(st.sampled_from([20 * MIB, 100 * MIB, 101 * MIB, 300 * MIB]), min_size=n, max_size=n))
    clean = data.draw(st.lists(st.sampled_from([CLEAN, CLEAN, CLEAN, NEAR, KILLED]), min_size=n, max_size=n))
    h = job(mem, clean=clean, oom=[2 if c == KILLED else 1 if c == NEAR else 0 for c in clean],
            limit=data.draw(st.lists(st.sampled_from([-1, 90 * MIB, 150 * MIB]), min_size=n, max_size=n)))  # fmt: skip
    h["present"] = data.draw(st.lists(st.sampled_from([0, 1, 1, 1]), min_size=n, max_size=n))
    seconds = data.draw(st.one_of(st.none(), st.lists(st.sampled_from([-1.0, 1.0, 20.0, 600.0]), min_size=n,
                                                      max_size=n)))  # fmt: skip
    _agree_before_every_run(cy, h, policy, runs, guaranteed, seconds)


@pytest.mark.skipif(PURE or compiled() is None, reason="the compiled backend is not built")
@settings(max_examples=examples(200), deadline=None)
@given(
    peaks=st.lists(st.tuples(st.integers(0, 64 * GIB), st.booleans()), max_size=30),
)
def test_prior_backends_agree(peaks: list[tuple[int, bool]]) -> None:
    cy = compiled()
    assert cy is not None
    a, b = REF.PRIOR_EMPTY, cy.PRIOR_EMPTY
    for peak, first in peaks:
        a, b = REF.prior_update(a, peak, first), cy.prior_update(b, peak, first)
        assert tuple(a) == tuple(b)
        assert REF.prior_read(a) == cy.prior_read(b)


def test_constants_agree() -> None:
    cy = compiled()
    if cy is None:
        pytest.skip("the compiled backend is not built")
    for name in (
        "POLICY_EFFICIENT", "RUN_KILLED", "RUN_CLEAN", "RUN_NEAR_LIMIT", "OOM_NONE", "OOM_NEAR_LIMIT", "OOM_KILLED",
        "EFFICIENT_MARGIN_PCT", "EFFICIENT_LEARNING_MARGIN_PCT", "EFFICIENT_FIRST_SAMPLE_MARGIN_PCT",
        "EFFICIENT_MIN_WINDOW", "EFFICIENT_CHEAP_MIB_SECONDS", "EFFICIENT_CHEAPEST_MIB_SECONDS", "PRIOR_MIN_JOBS",
        "PRIOR_TWO_JOBS_MARGIN_PCT", "EFFICIENT_CPU_TIME_PCT", "EFFICIENT_STEADY_SAMPLES",
        "PRIOR_EMPTY", "SIZED_FIELDS",
    ):  # fmt: skip
        assert getattr(cy, name) == getattr(REF, name), name
    assert REF.SIZED_FIELDS == REF.Sized._fields


# --------------------------------------------------------------------------- backtest_walk is size_run per run


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    h=columns(), policy=st.sampled_from([CI, FIXED, KRR, VPA, RECORDED, EFFICIENT, GROWTH]), runs=st.integers(1, 8),
    guaranteed=st.booleans(), pins=_PINS,
)  # fmt: skip
def test_backtest_walk_scores_size_run(
    core: ModuleType, h: dict[str, list[Any]], policy: int, runs: int, guaranteed: bool, pins: tuple[int, ...]
) -> None:
    """The walk's totals are those of ``size_run`` before each run: no second copy of the rules."""
    n = len(h["clean"])
    avg = [x / 2 for x in h["cpu_stat"]]
    ceiling = [-1 if k % 3 else 2 * GIB for k in range(n)]
    duration = [60.0 + k for k in range(n)]
    prior = [256 * MIB * (k % 2) - (k % 2 == 0) for k in range(n)]
    seconds = [-1.0 if k % 4 == 3 else k / 8 for k in range(n)]  # rule E11 reads them, unknown ones included
    got = core.backtest_walk(
        h["clean"], h["present"], h["cpu_stat"], h["cpu_peak"], h["cpu_p95"], avg, h["mem_peak"], h["mem_limit"],
        h["oom"], h["pod_peak"], ceiling, duration, policy, runs, 20, guaranteed, pins, 64 * GIB, prior, seconds,
    )  # fmt: skip
    want = [0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0]
    for i in range(n):
        if not h["present"][i]:
            continue
        s = core.size_run(i, *h.values(), ceiling[i], policy, runs, 20, guaranteed, pins, 64 * GIB, prior[i], seconds)
        if s.memory_limit >= 0:
            want[0] += 1
            want[1] += h["mem_peak"][i] > s.memory_limit or (h["oom"][i] != 0 and h["mem_peak"][i] >= s.memory_limit)
            want[5] += max(0, s.memory_request - h["mem_peak"][i]) * duration[i]
            want[7] += s.memory_request * duration[i]
        if s.cpu_request >= 0:
            want[4] += max(0.0, s.cpu_request - avg[i]) * duration[i]
            want[6] += s.cpu_request * duration[i]
        if s.cpu_limit >= 0:
            want[2] += 1
            want[3] += h["cpu_p95"][i] > s.cpu_limit
    assert tuple(got[:4]) == tuple(want[:4])
    for g, w in zip(got[4:], want[4:], strict=True):
        assert g == pytest.approx(w, rel=1e-9, abs=1e-6)


# --------------------------------------------------------------------------- live compute() == size_run at i == n


@dataclass
class RawContainer:
    name: str
    stats: tuple[float, float, float, float, float, float]  # peak, p99, p95, p75, p50, avg
    mem: int
    limit: int | None
    oom_killed: bool | None
    events: int | None

    @property
    def suspect(self) -> bool:
        return is_oom_suspect(
            memory_peak_bytes=self.mem, memory_limit_bytes=self.limit, oom_killed=self.oom_killed,
            oom_kill_events=self.events,
        )  # fmt: skip

    @property
    def killed(self) -> bool:
        """Rule E1: a kill event the collector reports, or a peak above the limit."""
        return bool(self.oom_killed) or (self.events or 0) > 0 or (self.limit is not None and self.mem > self.limit)


@dataclass
class RawRun:
    containers: list[RawContainer]
    pod: int | None
    node: int | None

    @property
    def clean(self) -> bool:
        return not any(c.suspect for c in self.containers)  # rule S2

    def pod_peak(self) -> int:
        return self.pod if self.pod is not None else sum(c.mem for c in self.containers)


_STAT_NAMES = ("cpu_peak", "cpu_p99", "cpu_p95", "cpu_p75", "cpu_p50", "cpu_avg")


@st.composite
def raw_container(draw: st.DrawFn, name: str) -> RawContainer:
    xs = sorted(draw(st.lists(st.floats(0, 4000, allow_nan=False), min_size=5, max_size=5)), reverse=True)
    avg = draw(st.floats(0, xs[0], allow_nan=False))
    mem = draw(st.integers(1, 6 * GIB))
    limit = draw(st.one_of(st.none(), st.integers(mem // 2, 2 * mem + 1)))
    return RawContainer(
        name, (xs[0], xs[1], xs[2], xs[3], xs[4], avg), mem, limit,
        draw(st.one_of(st.none(), st.booleans())), draw(st.one_of(st.none(), st.integers(0, 2))),
    )  # fmt: skip


@st.composite
def raw_run(draw: st.DrawFn) -> RawRun:
    names = draw(st.lists(st.sampled_from(["build", "db", "cache"]), min_size=1, max_size=3, unique=True))
    return RawRun(
        [draw(raw_container(n)) for n in names],
        draw(st.one_of(st.none(), st.integers(1, 12 * GIB))),
        draw(st.one_of(st.none(), st.integers(GIB, 64 * GIB))),
    )


def history_of(runs: list[RawRun], params: SizingParams) -> History:
    """What ``load_history`` reads from the database for these runs (rule S3, S5)."""
    h = History(clean_samples=sum(r.clean for r in runs))
    h.newest_node_memory_bytes = next((r.node for r in reversed(runs) if r.node is not None), None)
    start = 0
    if h.clean_samples:
        clean_idx = [k for k, r in enumerate(runs) if r.clean]
        reach = max(params.runs, 3)  # load_history reaches back far enough to tell the phase (S4)
        start = clean_idx[-reach] if len(clean_idx) >= reach else clean_idx[0]
    for k in range(len(runs) - 1, start - 1, -1):
        r = runs[k]
        hr = HistoryRun(id=k, clean=r.clean, pod_memory_peak_bytes=r.pod)
        for c in r.containers:
            hr.containers[c.name] = SimpleNamespace(
                **dict(zip(_STAT_NAMES, c.stats, strict=True)), memory_peak_bytes=c.mem, memory_limit_bytes=c.limit,
                oom_suspect=c.suspect,
            )  # fmt: skip
        h.window.append(hr)
    return h


def answer_via_core(
    core: ModuleType, runs: list[RawRun], pins: dict[str, Any], params: SizingParams,
    policy: sizing_service.Policy, code: int = CI,
) -> tuple[int, list[tuple[str, Any]]]:  # fmt: skip
    """The design note's adapter: the live answer's containers from ``size_run`` at ``i == n``."""
    n = len(runs)
    clean = [
        CLEAN if r.clean else KILLED if any(c.killed for c in r.containers) else NEAR for r in runs
    ]  # fmt: skip
    analysed = core.analysed_runs(n, clean, code, params.runs)
    names: dict[str, None] = {}
    for k in analysed or range(n - 1, -1, -1):  # S6: the analysed runs, newest first; unknown: every run
        for c in runs[k].containers:
            names.setdefault(c.name, None)
    if policy.max_memory is not None:
        ceiling = policy.max_memory
    else:
        node = next((r.node for r in reversed(runs) if r.node is not None), None)
        ceiling = -1 if node is None else node * 9 // (10 * MIB) * MIB
    pin_values, pin_ranks = [-1] * 4, [0] * 4
    for f, column in enumerate(FIELDS):
        for scope in ("job", "workflow", "repo", "org"):
            o = pins.get(scope)
            if o is not None and getattr(o, column) is not None:
                pin_values[f], pin_ranks[f] = int(getattr(o, column)), RANK[scope]
                break
    stat = _STAT_NAMES.index(f"cpu_{params.cpu_percentile}")
    out = []
    phase = 0
    for name in names or {"*": None}:
        rows = [next((c for c in r.containers if c.name == name), None) for r in runs]
        s = core.size_run(
            n, clean, [int(c is not None) for c in rows],
            [c.stats[stat] if c else 0.0 for c in rows], [c.stats[0] if c else 0.0 for c in rows],
            [c.stats[2] if c else 0.0 for c in rows], [c.mem if c else 0 for c in rows],
            [-1 if c is None or c.limit is None else c.limit for c in rows],
            [0 if c is None else 2 if c.killed else int(c.suspect) for c in rows],
            [r.pod_peak() for r in runs], ceiling, code, params.runs, params.buffer,
            policy.memory_qos == "guaranteed", (*pin_values, *pin_ranks), policy.max_backoff_memory, -1,
        )  # fmt: skip
        assert s.phase >= 0, name  # every listed container has a recommendation
        phase = s.phase
        out.append((name, s))
    return phase, out


_PIN = st.one_of(st.none(), st.integers(1, 8 * GIB))


@st.composite
def pin_rows(draw: st.DrawFn) -> dict[str, Any]:
    rows = {}
    for scope in draw(st.lists(st.sampled_from(["org", "repo", "workflow", "job"]), unique=True, max_size=4)):
        values = [draw(st.one_of(st.none(), st.integers(1, 4000))) for _ in range(2)] + [draw(_PIN) for _ in range(2)]
        rows[scope] = SimpleNamespace(**dict(zip(FIELDS, values, strict=True)), expires_at=None)
    return rows


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    runs=st.lists(raw_run(), max_size=12), pins=pin_rows(), n_runs=st.integers(1, 6), buffer=st.integers(0, 300),
    percentile=st.sampled_from(["peak", "p99", "p95", "p75", "p50", "avg"]),
    qos=st.sampled_from(["guaranteed", "burstable"]), max_memory=st.one_of(st.none(), st.integers(GIB, 32 * GIB)),
    max_backoff=st.integers(GIB, 128 * GIB),
)  # fmt: skip
def test_size_run_at_n_is_the_live_answer(
    core: ModuleType, runs: list[RawRun], pins: dict[str, Any], n_runs: int, buffer: int, percentile: str, qos: Any,
    max_memory: int | None, max_backoff: int,
) -> None:  # fmt: skip
    """Rules S3-S17 and O2-O3: today's ``compute()`` and ``size_run(i = n)`` agree container by
    container: values, sources, observed use, the OOM streak, the backoff factor and capped."""
    params = SizingParams(runs=n_runs, buffer=buffer, cpu_percentile=percentile)
    policy = sizing_service.Policy(memory_qos=qos, max_memory=max_memory, max_backoff_memory=max_backoff)
    key = ScopeKey("o", "r", "w", "j")
    # the wire shape: the typed answer as the API renders it
    answer = sizing_service.compute(
        key=key, history=history_of(runs, params), pins=pins, params=params, policy=policy
    ).as_dict()
    phase, got = answer_via_core(core, runs, pins, params, policy)
    assert ["unknown", "learning", "confident"][phase] == answer["meta"]["phase"]
    assert [name for name, _ in got] == [c["name"] for c in answer["containers"]]
    for (_, s), c in zip(got, answer["containers"], strict=True):
        assert (s.cpu_request, s.cpu_limit) == (c["cpu"]["request_millicores"], c["cpu"]["limit_millicores"])
        assert (s.memory_request, s.memory_limit) == (c["memory"]["request_bytes"], c["memory"]["limit_bytes"])
        assert (SOURCE[s.cpu_request_source], SOURCE[s.cpu_limit_source]) == (
            c["cpu"]["source"]["request"], c["cpu"]["source"]["limit"],
        )  # fmt: skip
        assert (SOURCE[s.memory_request_source], SOURCE[s.memory_limit_source]) == (
            c["memory"]["source"]["request"], c["memory"]["source"]["limit"],
        )  # fmt: skip
        assert (None if s.cpu_observed < 0 else s.cpu_observed) == c["observed"]["cpu_millicores"]
        assert (None if s.memory_observed < 0 else s.memory_observed) == c["observed"]["memory_bytes"]
        assert (s.consecutive, s.backoff_factor, s.capped) == (
            c["oom"]["consecutive"], c["oom"]["backoff_factor"], c["oom"]["capped"],
        )  # fmt: skip
