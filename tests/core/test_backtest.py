"""The backtest walk (``backtest_walk``) on both core backends: constructed histories whose figures
are worked out by hand, and hypothesis checks that the compiled walk gives the reference's answers."""

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
MIB = 1 << 20
GIB = 1 << 30
CI, FIXED, KRR, VPA, RECORDED = 0, 1, 2, 3, 4
NO_PINS = (-1, -1, -1, -1, 0, 0, 0, 0)
SCORED, OOM, CPU_SCORED, THROTTLED, CPU_WASTE, MEM_WASTE, CPU_REQ, MEM_REQ = range(8)


def history(
    cpu: list[float], mem: list[int], *, clean: list[int] | None = None, oom: list[int] | None = None,
    limit: list[int] | None = None, duration: float = 600.0,
) -> dict[str, list[Any]]:  # fmt: skip
    n = len(cpu)
    return {
        "clean": clean or [1] * n,
        "present": [1] * n,
        "cpu_stat": cpu,
        "cpu_peak": cpu,
        "cpu_p95": cpu,
        "cpu_avg": [c / 2 for c in cpu],
        "mem_peak": mem,
        "mem_limit": limit or [-1] * n,
        "oom": oom or [0] * n,
        "pod_peak": mem,
        "ceiling": [-1] * n,
        "duration": [duration] * n,
    }


def walk(core: ModuleType, h: dict[str, list[Any]], policy: int = CI, *, runs: int = 5, buffer: int = 20,
         guaranteed: bool = True, pins: tuple[int, ...] = NO_PINS) -> tuple[Any, ...]:  # fmt: skip
    return tuple(core.backtest_walk(*h.values(), policy, runs, buffer, guaranteed, pins))


def test_fixed_default(core: ModuleType) -> None:
    # 500m / 4Gi: a run peaking at 5Gi is an OOM risk; p95 1000m > 500m is throttled
    h = history([1000.0, 200.0], [5 * GIB, 1 * GIB])
    r = walk(core, h, FIXED)
    assert r[:4] == (2, 1, 2, 1)
    # waste: CPU (500 - 500) + (500 - 100) = 400 m x 600 s; memory (4Gi - 1Gi) x 600 s (5Gi is under-requested: 0)
    assert r[CPU_WASTE] == 400 * 600
    assert r[MEM_WASTE] == 3 * GIB * 600
    assert r[MEM_REQ] == 2 * 4 * GIB * 600


def test_ci_sizer_phases(core: ModuleType) -> None:
    # run 0: unknown -> 500m/4Gi. run 1: learning from run 0 (cpu 100, mem 100Mi): 300m request,
    # limit 500m; memory 3 x 100Mi = 300Mi -> limit 512Mi (power of two), guaranteed -> request 512Mi.
    # Run 1 peaks at 600Mi > 512Mi: an OOM risk; its p95 600m > 500m: throttled.
    h = history([100.0, 600.0], [100 * MIB, 600 * MIB])
    r = walk(core, h, CI)
    assert r[:4] == (2, 1, 2, 1)
    # CPU waste: run 0 (500 - 50) x 600; run 1: 300 - 300 = 0
    assert r[CPU_WASTE] == 450 * 600
    # memory waste: run 0 (4Gi - 100Mi) x 600; run 1: 512Mi < 600Mi -> 0
    assert r[MEM_WASTE] == (4 * GIB - 100 * MIB) * 600


def test_recorded_limits(core: ModuleType) -> None:
    # the limit each run reported: run 0 had 1Gi and peaked at 2Gi (risk); run 1 reported none (not scored)
    h = history([100.0, 100.0], [2 * GIB, GIB], limit=[GIB, -1])
    r = walk(core, h, RECORDED)
    assert r[:4] == (1, 1, 0, 0)
    assert (r[CPU_WASTE], r[CPU_REQ]) == (0.0, 0.0)


def test_krr_and_vpa_approximations(core: ModuleType) -> None:
    # window of runs 0-2 before run 3. KRR: CPU p95 of the p95s [100, 200, 300] = 290m, no CPU limit;
    # memory max 300Mi x 1.15 = 345Mi. VPA: p90 of peaks = 280 x 1.15 = 322m, limit = request;
    # memory p90 [100, 200, 300]Mi = 280Mi x 1.15 = 322Mi.
    h = history([100.0, 200.0, 300.0, 400.0], [100 * MIB, 200 * MIB, 300 * MIB, 400 * MIB])
    krr = walk(core, h, KRR, runs=3)
    vpa = walk(core, h, VPA, runs=3)
    # run 0 has the 4Gi defaults; every later run outgrows its window: KRR run 1 115Mi < 200Mi,
    # run 2 230Mi < 300Mi, run 3 345Mi < 400Mi; VPA 115Mi, 219Mi (p90 190Mi), 322Mi likewise
    assert (krr[OOM], vpa[OOM]) == (3, 3)
    # KRR sets no CPU limit: nothing is throttle-scored except the default run 0 (500m limit)
    assert krr[CPU_SCORED] == 1
    assert vpa[CPU_SCORED] == 4


def test_pins_win(core: ModuleType) -> None:
    # a job-scope memory limit pin of 8Gi: no OOM risk anywhere; guaranteed -> request follows it
    h = history([100.0, 100.0, 100.0, 100.0], [6 * GIB] * 4)
    r = walk(core, h, CI, pins=(-1, -1, -1, 8 * GIB, 0, 0, 0, 4))
    assert r[OOM] == 0
    assert r[MEM_REQ] == 4 * 8 * GIB * 600


def test_oom_streak_doubles(core: ModuleType) -> None:
    # three clean runs at 1Gi; run 3 (not clean) peaks at 1.5Gi; run 4 at 3Gi. From run 3 on the job is
    # confident: 1Gi x 1.1 -> limit 2Gi. Flagged OOM-suspect with a 2Gi limit, run 3 starts a streak:
    # run 4's limit is max(2Gi, 2Gi) x 2 = 4Gi (rule S14) and its 3Gi is no risk. Without the flag,
    # run 4 gets 2Gi and is at risk. (Run 3's 1.5Gi is under 2Gi either way.)
    h = history([100.0] * 5, [GIB, GIB, GIB, 3 * GIB // 2, 3 * GIB], clean=[1, 1, 1, 0, 1], oom=[0, 0, 0, 1, 0],
                limit=[-1, -1, -1, 2 * GIB, -1])  # fmt: skip
    assert walk(core, h, CI)[OOM] == 0
    h["oom"][3] = 0
    assert walk(core, h, CI)[OOM] == 1


def test_oom_suspect_run_at_its_limit_is_a_risk(core: ModuleType) -> None:
    # a run stopped at its 1Gi limit (peak = limit, OOM-suspect) needed at least that: a risk under its
    # recorded limit; the same peak without the flag is not
    h = history([100.0], [GIB], oom=[1], limit=[GIB])
    assert walk(core, h, RECORDED)[OOM] == 1
    h["oom"][0] = 0
    assert walk(core, h, RECORDED)[OOM] == 0


def test_bad_columns(core: ModuleType) -> None:
    h = history([1.0], [1])
    h["present"] = []
    with pytest.raises(ValueError, match="differ in length"):
        walk(core, h)
    with pytest.raises(ValueError, match="runs"):
        walk(core, history([1.0], [1]), runs=0)


@st.composite
def histories(draw: st.DrawFn) -> tuple[Any, ...]:
    n = draw(st.integers(0, 30))

    def col(s: st.SearchStrategy[Any]) -> list[Any]:
        return draw(st.lists(s, min_size=n, max_size=n))

    flags = st.integers(0, 1)
    cpu = st.floats(0, 20_000, allow_nan=False)
    mem = st.integers(0, 1 << 36)
    cols = [col(flags), col(flags), col(cpu), col(cpu), col(cpu), col(cpu), col(mem),
            col(st.one_of(st.just(-1), mem)), col(flags), col(mem), col(st.one_of(st.just(-1), mem)),
            col(st.floats(0, 86400, allow_nan=False))]  # fmt: skip
    pin_values = [draw(st.one_of(st.just(-1), st.integers(1, 1 << 34))) for _ in range(4)]
    pin_ranks = [0 if v < 0 else draw(st.integers(1, 4)) for v in pin_values]
    return (*cols, draw(st.integers(0, 4)), draw(st.integers(1, 12)), draw(st.integers(0, 100)),
            draw(st.booleans()), (*pin_values, *pin_ranks),
            draw(st.one_of(st.just(-1), st.integers(1, 1 << 36))))  # fmt: skip


@pytest.mark.skipif(PURE or compiled() is None, reason="needs the compiled backend")
@settings(max_examples=examples(500), deadline=None)
@given(histories())
def test_compiled_matches_reference(args: tuple[Any, ...]) -> None:
    module = compiled()
    assert module is not None
    assert tuple(module.backtest_walk(*args)) == tuple(REF.backtest_walk(*args))
