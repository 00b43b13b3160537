"""The backtest's scoring walk with issue 25's accounting, and the efficient policy's extra columns.

``walk`` takes ``core.backtest_walk``'s arguments and returns its totals, with one difference the
issue asks for: a run the recommendation would have OOM-killed must run again, so **all it reserved**
(memory request x duration, CPU request x duration) counts as waste, not only ``request - use``.
Each run's recommendation is the core's ``size_run`` before it, as in the core's walk.

``add_efficient_columns`` gives a job's series what the efficient policy (E1-E13) reads beyond the
seed's columns: the runs told apart as killed / clean / near the limit (``clean_e``, ``oom_e``) and
the org's first-run prior before each run (``prior``, rule E6), learned from the org's earlier runs
in time order as the live service learns it from the runs ingested before.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from service import core
from service.sizing import priors


def walk(
    clean: Sequence[int],
    present: Sequence[int],
    cpu_stat: Sequence[float],
    cpu_peak: Sequence[float],
    cpu_p95: Sequence[float],
    cpu_avg: Sequence[float],
    mem_peak: Sequence[int],
    mem_limit: Sequence[int],
    oom: Sequence[int],
    pod_peak: Sequence[int],
    ceiling: Sequence[int],
    duration: Sequence[float],
    policy: int,
    runs: int,
    buffer_pct: int,
    guaranteed: bool,
    pins: Sequence[int],
    backoff_ceiling: int = -1,
    prior: Sequence[int] | None = None,
    seconds: Sequence[float] | None = None,
) -> tuple[int, int, int, int, float, float, float, float]:
    """Totals in ``core.BACKTEST_FIELDS`` order; a run at OOM risk counts its whole reservation as waste."""
    scored = oom_risk = cpu_scored = throttled = 0
    cpu_waste = mem_waste = cpu_req_total = mem_req_total = 0.0
    for i in range(len(clean)):
        if not present[i]:
            continue
        s = core.size_run(
            i, clean, present, cpu_stat, cpu_peak, cpu_p95, mem_peak, mem_limit, oom, pod_peak, ceiling[i],
            policy, runs, buffer_pct, guaranteed, pins, backoff_ceiling, -1 if prior is None else prior[i], seconds,
        )  # fmt: skip
        d = duration[i]
        killed = False
        if s.memory_limit >= 0:
            scored += 1
            # an OOM-suspect run's true need was at least its peak: a limit at the peak is a risk too
            killed = mem_peak[i] > s.memory_limit or (oom[i] != 0 and mem_peak[i] >= s.memory_limit)
            oom_risk += killed
            mem_waste += (s.memory_request if killed else max(0, s.memory_request - mem_peak[i])) * d
            mem_req_total += s.memory_request * d
        if s.cpu_request >= 0:
            cpu_waste += (s.cpu_request if killed else max(0.0, s.cpu_request - cpu_avg[i])) * d
            cpu_req_total += s.cpu_request * d
        if s.cpu_limit >= 0:
            cpu_scored += 1
            throttled += cpu_p95[i] > s.cpu_limit
    return scored, oom_risk, cpu_scored, throttled, cpu_waste, mem_waste, cpu_req_total, mem_req_total


def prior_by_run(jobs: Sequence[tuple[str, int, list[dict[str, Any]]]]) -> dict[int, int]:
    """Rule E6 before each run: ``jobs`` as ``(org, job id, runs oldest first)`` (each run a dict with
    ``id``, ``clean``, ``finished_at`` and ``containers``, name -> row); the org's ``prior_read``
    over the runs that finished before it (by finish time, then id, as the runs are ordered), by run id."""
    timeline = sorted(
        ((r["finished_at"], r["id"], org, job_id, r) for org, job_id, runs in jobs for r in runs),
        key=lambda t: (t[0], t[1]),
    )
    states: dict[str, tuple[int, int]] = {}
    sampled: set[int] = set()
    out: dict[int, int] = {}
    for _, run_id, org, job_id, r in timeline:
        state = states.get(org, core.PRIOR_EMPTY)
        out[run_id] = core.prior_read(state)
        rows = list(r["containers"].values())
        if rows and priors.run_code(r["clean"], [_Row(x) for x in rows]) != core.RUN_KILLED:
            states[org] = core.prior_update(state, max(x["memory_peak_bytes"] for x in rows), job_id not in sampled)
            sampled.add(job_id)
    return out


class _Row:
    """Attribute access over a row mapping (``priors`` reads rows by attribute)."""

    __slots__ = ("_m",)

    def __init__(self, mapping: Any) -> None:
        self._m = mapping

    def __getattr__(self, name: str) -> Any:
        return self._m[name]


def add_efficient_columns(
    columns: dict[str, array[Any]], runs: list[dict[str, Any]], name: str, prior: dict[int, int]
) -> None:
    """``clean_e`` (RUN_*), ``oom_e`` (OOM_*) and ``prior`` for one container's series."""
    clean_e, oom_e, prior_col = array("q"), array("q"), array("q")
    for r in runs:
        rows = [_Row(x) for x in r["containers"].values()]
        clean_e.append(priors.run_code(r["clean"], rows))
        row = r["containers"].get(name)
        oom_e.append(0 if row is None else priors.oom_code(_Row(row)))
        prior_col.append(prior.get(r["id"], -1))
    columns["clean_e"], columns["oom_e"], columns["prior"] = clean_e, oom_e, prior_col
