"""Backtests: how good the recommendations would have been, measured on stored history.

``load`` reads each job's runs in time order into per-container columns; ``run`` walks every
column once per policy (``walk.walk``, the core's ``size_run`` before each run): the recommendation
made from the runs before it; then what the run actually used, a run it would have OOM-killed
counting all it reserved as waste (issue 25). Policies are ci-sizer's own with each
requested parameter set, the limits recorded with the runs, and three baselines (approximations
of well-known right-sizers' documented approaches, labelled as such).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlmodel import col

from service import core
from service.backtests.report import render as render
from service.backtests.schemas import BacktestCreate
from service.backtests.walk import add_efficient_columns, prior_by_run
from service.backtests.walk import walk as score_walk
from service.keys import ScopeKey
from service.overrides import service as overrides_service
from service.sizing import service as sizing
from service.sizing.history import run_seconds
from service.sizing.params import CpuPercentile, SizingParams
from service.tables import Job, Run, RunContainer

DEFAULT_DURATION = 600.0  # seconds, for runs posted without started_at


@dataclass(frozen=True)
class Params(SizingParams):
    """One parameter set of the grid: the live answer's parameters, and the memory QoS."""

    memory_qos: str = "guaranteed"


@dataclass(frozen=True)
class Policy:
    """One row of the report: a policy and what it is."""

    label: str
    kind: str  # "ci-sizer", "recorded", "baseline"
    code: int
    params: Params
    note: str = ""


BASELINES = (
    ("fixed 500m / 4Gi", core.POLICY_FIXED, "every job at the unknown-phase default, request = limit"),
    (
        "max memory + 15%, p95 CPU (KRR-like)",
        core.POLICY_KRR,
        "approximation of Robusta KRR's simple strategy over the same runs: CPU request the p95 of the "
        "runs' p95s and no CPU limit; memory request = limit the peak + 15%",
    ),
    (
        "p90 of peaks + 15% (VPA-like)",
        core.POLICY_VPA,
        "approximation of the Kubernetes VPA recommender's target (90th percentile + 15% margin) over the "
        "runs' peaks, CPU and memory, limit = request",
    ),
)


def policies(param_sets: Sequence[Params], *, baselines: bool = True, efficient: bool = True) -> list[Policy]:
    """ci-sizer's seed policy with each parameter set, then (``efficient``) the efficient policy
    (E1-E13) with each, the recorded limits, and (``baselines``) the baselines."""
    kinds = [("ci-sizer", "ci-sizer", core.POLICY_CI_SIZER)]
    if efficient:
        kinds.append(("efficient", "efficient", core.POLICY_EFFICIENT))
    out = [
        Policy(f"{name} runs={p.runs} buffer={p.buffer} cpu={p.cpu_percentile} qos={p.memory_qos}", kind, code, p)
        for name, kind, code in kinds
        for p in param_sets
    ]
    out.append(
        Policy("recorded limits", "recorded", core.POLICY_RECORDED, Params(), "the memory limit each run reported")
    )
    if baselines:
        first = param_sets[0] if param_sets else Params()
        out += [Policy(label, "baseline", code, first, note) for label, code, note in BASELINES]
    return out


def grid(
    runs: Iterable[int], buffers: Iterable[int], percentiles: Iterable[CpuPercentile], qos: Iterable[str]
) -> list[Params]:
    return [Params(r, b, c, q) for r, b, c, q in itertools.product(runs, buffers, percentiles, qos)]


def param_sets(body: BacktestCreate) -> list[Params]:
    """The parameter sets a backtest request asks for: every combination of its lists."""
    return grid(body.runs, body.buffer, body.cpu_percentile, body.memory_qos)


@dataclass
class Series:
    """One container of one job: a column per field, one entry per run of the job."""

    job: ScopeKey
    container: str
    columns: dict[str, array[Any]] = field(default_factory=dict)


_STATS = ("cpu_peak", "cpu_p99", "cpu_p95", "cpu_p75", "cpu_p50", "cpu_avg")
_LONG = ("clean", "present", "mem_peak", "mem_limit", "oom", "pod_peak", "ceiling")
_DOUBLE = (*_STATS, "duration", "seconds")  # seconds: E11's reading of the duration, -1 when unknown


def series_of(
    key: ScopeKey, runs: list[dict[str, Any]], *, max_memory: int | None, prior: dict[int, int] | None = None
) -> list[Series]:
    """Columns per container from a job's runs (oldest first), each run a dict with ``clean``,
    ``started_at``, ``finished_at``, ``pod_memory_peak_bytes``, ``node_memory_bytes`` and
    ``containers`` (name -> row with the stats)."""
    names: dict[str, None] = {}
    for r in runs:
        for name in r["containers"]:
            names.setdefault(name, None)
    out = []
    newest_node: int | None = None
    ceilings = []
    for r in runs:  # rule S15 as it stood before each run
        if max_memory is not None:
            ceilings.append(max_memory)
        else:
            ceilings.append(-1 if newest_node is None else newest_node * 9 // (10 * core.MIB) * core.MIB)
        if r["node_memory_bytes"] is not None:
            newest_node = r["node_memory_bytes"]
    for name in names:
        s = Series(key, name, {k: array("q") for k in _LONG} | {k: array("d") for k in _DOUBLE})
        c = s.columns
        for r, ceiling in zip(runs, ceilings, strict=True):
            row = r["containers"].get(name)
            pod = r["pod_memory_peak_bytes"]
            if pod is None:
                pod = sum(x["memory_peak_bytes"] for x in r["containers"].values())
            seconds = run_seconds(r["started_at"], r["finished_at"])  # -1 without started_at
            c["clean"].append(int(r["clean"]))
            c["present"].append(int(row is not None))
            c["pod_peak"].append(pod)
            c["ceiling"].append(ceiling)
            c["duration"].append(DEFAULT_DURATION if seconds < 0 else seconds)
            c["seconds"].append(seconds)
            if row is None:
                for k in _STATS:
                    c[k].append(0.0)
                c["mem_peak"].append(0)
                c["mem_limit"].append(-1)
                c["oom"].append(0)
            else:
                for k in _STATS:
                    c[k].append(row[k])
                c["mem_peak"].append(row["memory_peak_bytes"])
                c["mem_limit"].append(-1 if row["memory_limit_bytes"] is None else row["memory_limit_bytes"])
                c["oom"].append(int(row["oom_suspect"]))
        add_efficient_columns(c, runs, name, prior or {})
        out.append(s)
    return out


async def load(
    *,
    conn: AsyncConnection,
    org: str | None,
    since: datetime | None,
    until: datetime | None,
    max_memory: int | None,
) -> list[Series]:
    """Every job's runs (of ``org``, finished in the window) as per-container columns."""
    q: Any = (
        select(
            col(Job.id).label("job_pk"), col(Job.org), col(Job.repo), col(Job.workflow), col(Job.job),
            col(Run.id).label("run_pk"), col(Run.clean), col(Run.started_at), col(Run.finished_at),
            col(Run.pod_memory_peak_bytes), col(Run.node_memory_bytes),
            col(RunContainer.name), *(col(getattr(RunContainer, k)) for k in _STATS),
            col(RunContainer.memory_peak_bytes), col(RunContainer.memory_limit_bytes), col(RunContainer.oom_suspect),
            col(RunContainer.oom_killed), col(RunContainer.oom_kill_events),
        )
        .join(Run, col(Run.job_id) == col(Job.id))
        .join(RunContainer, col(RunContainer.run_pk) == col(Run.id))
        .order_by(col(Job.id), col(Run.finished_at), col(Run.id), col(RunContainer.position))
    )  # fmt: skip
    q = _window(q, org=org, since=since, until=until)
    jobs: list[tuple[ScopeKey, int, list[dict[str, Any]]]] = []
    job_pk: int | None = None
    runs: list[dict[str, Any]] = []
    result = await conn.stream(q)
    async for row in result:
        if row.job_pk != job_pk:
            job_pk, runs = row.job_pk, []
            jobs.append((ScopeKey(row.org, row.repo, row.workflow, row.job), row.job_pk, runs))
        if not runs or runs[-1]["id"] != row.run_pk:
            runs.append(
                {
                    "id": row.run_pk,
                    "clean": row.clean,
                    "started_at": row.started_at,
                    "finished_at": row.finished_at,
                    "pod_memory_peak_bytes": row.pod_memory_peak_bytes,
                    "node_memory_bytes": row.node_memory_bytes,
                    "containers": {},
                }
            )
        runs[-1]["containers"][row.name] = row._mapping
    prior = prior_by_run([(k.org, pk, r) for k, pk, r in jobs])  # E6, from the org's earlier runs
    return [s for k, _, r in jobs for s in series_of(k, r, max_memory=max_memory, prior=prior)]


def _window(q: Any, *, org: str | None, since: datetime | None, until: datetime | None) -> Any:
    """``q`` (over jobs and runs) kept to the runs of ``org`` that finished in the window."""
    if org is not None:
        q = q.where(col(Job.org) == org)
    if since is not None:
        q = q.where(col(Run.finished_at) >= since)
    if until is not None:
        q = q.where(col(Run.finished_at) < until)
    return q


async def has_runs(*, conn: AsyncConnection, org: str | None, since: datetime | None, until: datetime | None) -> bool:
    """Whether any run (of ``org``) finished in the window: a backtest of nothing is refused."""
    q = select(col(Run.id)).join(Job, col(Job.id) == col(Run.job_id)).limit(1)
    return (await conn.execute(_window(q, org=org, since=since, until=until))).first() is not None


async def load_pins(*, conn: AsyncConnection, org: str | None) -> list[Any]:
    """The unexpired override rows (of ``org``)."""
    return await overrides_service.of_org(conn=conn, org=org)


def pins_for(overrides: Sequence[Any], key: ScopeKey) -> tuple[int, ...]:
    """Rule O2 for one job, as the live answer resolves it (``sizing.pins8``): per field the most
    specific pin's value and its scope rank (0 = none)."""
    return sizing.pins8(overrides_service.applicable_of(overrides, key))


def _columns(s: Series, code: int) -> tuple[Any, Any, Any]:
    """The ``clean`` and ``oom`` columns and the prior a policy reads (the efficient policy's own, E1, E6)."""
    c = s.columns
    if code in (core.POLICY_EFFICIENT, core.POLICY_GROWTH):  # G8 samples as E1
        return c["clean_e"], c["oom_e"], c["prior"]
    return c["clean"], c["oom"], None


def recommend_before(
    s: Series,
    i: int,
    params: Params,
    pins: Sequence[int],
    *,
    max_backoff_memory: int = 64 * core.GIB,
    code: int = core.POLICY_CI_SIZER,
) -> Any:
    """The ci-sizer recommendation (``code``: the seed's, POLICY_EFFICIENT or POLICY_GROWTH) for run ``i``
    of a series from the runs before it: the core's ``size_run``, with the columns and arguments the walk scores."""
    c = s.columns
    clean, oom, prior = _columns(s, code)
    return core.size_run(
        i, clean, c["present"], c[f"cpu_{params.cpu_percentile}"], c["cpu_peak"], c["cpu_p95"], c["mem_peak"],
        c["mem_limit"], oom, c["pod_peak"], c["ceiling"][i], code, params.runs, params.buffer,
        params.memory_qos == "guaranteed", pins, max_backoff_memory, -1 if prior is None else prior[i],
        c["seconds"],
    )  # fmt: skip


def grow_before(s: Series, i: int, params: Params, limit: int, bound: int, *, code: int = core.POLICY_CI_SIZER) -> Any:
    """Rules G3-G5 for run ``i`` of a series, as the live answer's ``grow`` block: the core's ``size_grow``
    over ``window_peak`` (``limit``: the recommendation's memory limit, ``bound``: G2's)."""
    c = s.columns
    clean, _, _ = _columns(s, code)
    return core.size_grow(limit, core.window_peak(i, clean, c["present"], c["mem_peak"], code, params.runs), bound)


def _empty() -> list[float]:
    return [0.0] * len(core.BACKTEST_FIELDS)


def summarise(totals: Sequence[float]) -> dict[str, Any]:
    scored, oom, cpu_scored, throttled, cpu_waste, mem_waste, cpu_req, mem_req = totals
    return {
        "runs_scored": int(scored),
        "oom_risk_runs": int(oom),
        "oom_risk_share": round(oom / scored, 4) if scored else 0.0,
        "cpu_limit_runs": int(cpu_scored),
        "throttled_runs": int(throttled),
        # out of the same runs as the OOM-risk share: a run without a CPU limit is not throttled
        "throttle_share": round(throttled / scored, 4) if cpu_scored and scored else None,
        "cpu_waste_core_hours": round(cpu_waste / 1000 / 3600, 3),
        "memory_waste_gib_hours": round(mem_waste / core.GIB / 3600, 3),
        "cpu_request_core_hours": round(cpu_req / 1000 / 3600, 3),
        "memory_request_gib_hours": round(mem_req / core.GIB / 3600, 3),
    }


def frontier(points: Sequence[tuple[float, float] | None]) -> list[bool]:
    """Which points no other point beats on both axes (lower risk and lower waste, one strictly)."""
    out = []
    for i, p in enumerate(points):
        if p is None:
            out.append(False)
            continue
        out.append(
            not any(
                q is not None and q[0] <= p[0] and q[1] <= p[1] and (q[0] < p[0] or q[1] < p[1])
                for j, q in enumerate(points)
                if j != i
            )
        )
    return out


def run(
    series: Sequence[Series],
    pols: Sequence[Policy],
    overrides: Sequence[Any],
    *,
    walk: Callable[..., Sequence[float]] | None = None,
    progress: Callable[[float], None] | None = None,
    max_backoff_memory: int = 64 * core.GIB,
) -> dict[str, Any]:
    """Every series under every policy; per job and fleet-wide totals, the frontier marked.
    ``max_backoff_memory``: the live answer's bound on the OOM backoff without a node ceiling."""
    walk = walk or score_walk
    fleet = [_empty() for _ in pols]
    jobs: dict[ScopeKey, list[list[float]]] = {}
    pins_cache: dict[ScopeKey, tuple[int, ...]] = {}
    for n, s in enumerate(series):
        pins = pins_cache.setdefault(s.job, pins_for(overrides, s.job))
        per_job = jobs.setdefault(s.job, [_empty() for _ in pols])
        c = s.columns
        for k, p in enumerate(pols):
            stat = c[f"cpu_{p.params.cpu_percentile}"]
            clean, oom, prior = _columns(s, p.code)
            totals = walk(
                clean, c["present"], stat, c["cpu_peak"], c["cpu_p95"], c["cpu_avg"], c["mem_peak"],
                c["mem_limit"], oom, c["pod_peak"], c["ceiling"], c["duration"],
                p.code, p.params.runs, p.params.buffer, p.params.memory_qos == "guaranteed",
                pins if p.kind in ("ci-sizer", "efficient") else (-1, -1, -1, -1, 0, 0, 0, 0), max_backoff_memory,
                prior, c["seconds"],
            )  # fmt: skip
            for f, v in enumerate(totals):
                fleet[k][f] += v
                per_job[k][f] += v
        if progress is not None and (n % 50 == 0 or n == len(series) - 1):
            progress((n + 1) / len(series))
    rows = [
        {"label": p.label, "kind": p.kind, "params": vars(p.params), "note": p.note, **summarise(t)}
        for p, t in zip(pols, fleet, strict=True)
    ]
    mem_points = [(r["oom_risk_runs"], r["memory_waste_gib_hours"]) if r["runs_scored"] else None for r in rows]
    cpu_points = [
        (r["throttled_runs"], r["cpu_waste_core_hours"]) if r["cpu_limit_runs"] and r["kind"] != "recorded" else None
        for r in rows
    ]
    for r, on_mem, on_cpu in zip(rows, frontier(mem_points), frontier(cpu_points), strict=True):
        r["frontier"] = {"memory": on_mem, "cpu": on_cpu}
    return {
        "jobs": len(jobs),
        "containers": len(series),
        # every series of a job has one entry per run of the job
        "runs": sum(len(next(s for s in series if s.job == key).columns["clean"]) for key in jobs),
        "container_runs": sum(int(sum(s.columns["present"])) for s in series),
        "policies": rows,
        "per_job": [
            {
                "org": key.org,
                "repo": key.repo,
                "workflow": key.workflow,
                "job": key.job,
                "policies": [summarise(t) for t in totals],
            }
            for key, totals in jobs.items()
        ],
    }
