"""Sizing recommendations (rules S3-S17, O2-O4).

``load_history`` reads what one job's answer needs with a few index range scans;
``compute`` is a pure function from that history to the answer, with the arithmetic in the core.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from .. import core
from ..models import Job, Override, Run, RunContainer, to_rfc3339, utcnow
from ..observability.fleet import JobTotals
from ..observability.metrics import CORE_DURATION
from ..quantity import format_cpu, format_memory
from . import overrides as overrides_service
from .overrides import SCOPES, ScopeKey

Phase = Literal["unknown", "learning", "confident"]
_PHASE_CODE = {
    "unknown": core.PHASE_UNKNOWN,
    "learning": core.PHASE_LEARNING,
    "confident": core.PHASE_CONFIDENT,
}
#: Specificity of a value's source, for rule O3 (the algorithm is the least specific).
_RANK = {"algorithm": 0, "org": 1, "repo": 2, "workflow": 3, "job": 4}
_MIB = core.MIB


@dataclass(frozen=True)
class SizingParams:
    runs: int = 5
    buffer: int = 20
    cpu_percentile: str = "p95"


@dataclass(frozen=True)
class Policy:
    cpu_sizing_mode: Literal["observe", "enforce"] = "observe"
    memory_qos: Literal["guaranteed", "burstable"] = "guaranteed"
    max_memory: int | None = None


@dataclass
class HistoryRun:
    id: int
    clean: bool
    pod_memory_peak_bytes: int | None
    containers: dict[str, RunContainer] = field(default_factory=dict)

    def pod_memory(self) -> int:
        """Rule S11: the reported pod peak, else the sum of the containers' peaks."""
        if self.pod_memory_peak_bytes is not None:
            return self.pod_memory_peak_bytes
        return sum(c.memory_peak_bytes for c in self.containers.values())


@dataclass
class History:
    clean_samples: int = 0
    #: newest first (rule S3): every run from the oldest analysed run on, or all runs when none is clean
    window: list[HistoryRun] = field(default_factory=list)
    newest_node_memory_bytes: int | None = None


async def load_history(*, session: AsyncSession, job_id: int | None, runs: int, need_node_memory: bool) -> History:
    history = History()
    if job_id is None:
        return history
    order = (col(Run.finished_at).desc(), col(Run.id).desc())
    history.clean_samples = (
        await session.execute(select(func.count()).select_from(Run).where(col(Run.job_id) == job_id, col(Run.clean)))
    ).scalar_one()
    window = select(col(Run.id), col(Run.clean), col(Run.pod_memory_peak_bytes)).where(col(Run.job_id) == job_id)
    if history.clean_samples:
        oldest = (
            await session.execute(
                select(col(Run.finished_at), col(Run.id))
                .where(col(Run.job_id) == job_id, col(Run.clean))
                .order_by(*order)
                .limit(1)
                .offset(min(runs, history.clean_samples) - 1)
            )
        ).one()
        window = window.where(
            or_(
                col(Run.finished_at) > oldest[0],
                and_(col(Run.finished_at) == oldest[0], col(Run.id) >= oldest[1]),
            )
        )
    rows = (await session.execute(window.order_by(*order))).all()
    by_id: dict[int, HistoryRun] = {}
    for run_pk, clean, pod_peak in rows:
        assert run_pk is not None
        hr = HistoryRun(id=run_pk, clean=clean, pod_memory_peak_bytes=pod_peak)
        history.window.append(hr)
        by_id[run_pk] = hr
    if by_id:
        containers = (
            await session.execute(
                select(RunContainer)
                .where(col(RunContainer.run_pk).in_(list(by_id)))
                .order_by(col(RunContainer.run_pk), col(RunContainer.position))
            )
        ).scalars()
        for c in containers:
            by_id[c.run_pk].containers[c.name] = c
    if need_node_memory:
        history.newest_node_memory_bytes = (
            await session.execute(
                select(col(Run.node_memory_bytes))
                .where(col(Run.job_id) == job_id, col(Run.node_memory_bytes).is_not(None))
                .order_by(*order)
                .limit(1)
            )
        ).scalar_one_or_none()
    return history


def phase_for(clean_samples: int) -> Phase:
    """Rule S4."""
    if clean_samples == 0:
        return "unknown"
    if clean_samples <= 2:
        return "learning"
    return "confident"


def node_ceiling(policy: Policy, history: History) -> int | None:
    """Rule S15: --max-memory, else 90% of the newest reported node memory, down to a whole MiB."""
    if policy.max_memory is not None:
        return policy.max_memory
    if history.newest_node_memory_bytes is None:
        return None
    return history.newest_node_memory_bytes * 9 // (10 * _MIB) * _MIB


def oom_streak(window: list[HistoryRun], name: str) -> tuple[int, int | None]:
    """Rule S13/S14: the OOM-suspect streak of one container from the newest run, and the limit
    reported by the streak's oldest run."""
    k = 0
    limit: int | None = None
    for run in window:
        c = run.containers.get(name)
        if c is None:
            continue
        if not c.oom_suspect:
            break
        k += 1
        limit = c.memory_limit_bytes
    return k, limit


def _ordered_names(runs: list[HistoryRun]) -> list[str]:
    names: dict[str, None] = {}
    for run in runs:
        for name in run.containers:
            names.setdefault(name, None)
    return list(names)


@dataclass
class Resolved:
    value: int
    source: str


def resolve(
    algorithm: tuple[int, int, int, int],
    pins: dict[str, Override],
    *,
    guaranteed: bool,
) -> tuple[Resolved, Resolved, Resolved, Resolved]:
    """Rules O2-O3 for one container: each field from the most specific pin, else the algorithm;
    then a request above its limit is reconciled in favour of the more specific source."""

    def pick(column: str, computed: int) -> Resolved:
        for scope in ("job", "workflow", "repo", "org"):
            o = pins.get(scope)
            if o is not None and getattr(o, column) is not None:
                return Resolved(int(getattr(o, column)), scope)
        return Resolved(computed, "algorithm")

    cpu_req = pick("cpu_request_millicores", algorithm[0])
    cpu_lim = pick("cpu_limit_millicores", algorithm[1])
    mem_req = pick("memory_request_bytes", algorithm[2])
    mem_lim = pick("memory_limit_bytes", algorithm[3])
    for req, lim in ((cpu_req, cpu_lim), (mem_req, mem_lim)):
        if req.value > lim.value:
            if _RANK[req.source] > _RANK[lim.source]:
                lim.value, lim.source = req.value, req.source
            else:
                req.value, req.source = lim.value, lim.source
    if guaranteed and mem_req.source == "algorithm":
        mem_req.value = mem_lim.value  # O3: an unpinned request follows the final limit
    return cpu_req, cpu_lim, mem_req, mem_lim


def override_scope(pins: dict[str, Override]) -> str:
    """Rule O4: the most specific scope that supplied at least one field, else "global"."""
    supplied: set[str] = set()
    for column in overrides_service.FIELDS:
        for scope in ("job", "workflow", "repo", "org"):
            o = pins.get(scope)
            if o is not None and getattr(o, column) is not None:
                supplied.add(scope)
                break
    for scope in reversed(SCOPES):
        if scope in supplied:
            return scope
    return "global"


def compute(
    *,
    key: ScopeKey,
    history: History,
    pins: dict[str, Override],
    params: SizingParams,
    policy: Policy,
) -> dict[str, Any]:
    phase = phase_for(history.clean_samples)
    n_analysed = min(params.runs, history.clean_samples)  # rule S5
    analysed = [r for r in history.window if r.clean][:n_analysed]
    if phase == "unknown":  # rule S6
        names = _ordered_names(history.window) or ["*"]
    else:
        names = _ordered_names(analysed)
    pod_peak = max((r.pod_memory() for r in analysed), default=-1) if phase == "confident" else -1
    ceiling = node_ceiling(policy, history)
    guaranteed = policy.memory_qos == "guaranteed"
    stat = "cpu_peak" if phase == "learning" else f"cpu_{params.cpu_percentile}"
    cpu_pinned = any(o.cpu_request_millicores is not None or o.cpu_limit_millicores is not None for o in pins.values())
    enforced = policy.cpu_sizing_mode == "enforce" or cpu_pinned  # rule S17
    containers = []
    for name in names:
        rows = [r.containers[name] for r in analysed if name in r.containers]
        cpu_observed: float | None = max((getattr(c, stat) for c in rows), default=None)
        mem_observed: int | None = max((c.memory_peak_bytes for c in rows), default=None)
        k, streak_limit = oom_streak(history.window, name)
        cpu_req, cpu_lim, mem_req, mem_lim, capped = core.size_container(
            _PHASE_CODE[phase],
            cpu_observed or 0.0,
            mem_observed or 0,
            pod_peak,
            params.buffer,
            k,
            -1 if streak_limit is None else streak_limit,
            -1 if ceiling is None else ceiling,
            guaranteed,
        )
        f_cpu_req, f_cpu_lim, f_mem_req, f_mem_lim = resolve(
            (cpu_req, cpu_lim, mem_req, mem_lim), pins, guaranteed=guaranteed
        )
        containers.append(
            {
                "name": name,
                "cpu": {
                    "request": format_cpu(f_cpu_req.value),
                    "limit": format_cpu(f_cpu_lim.value),
                    "request_millicores": f_cpu_req.value,
                    "limit_millicores": f_cpu_lim.value,
                    "enforced": enforced,
                    "source": {"request": f_cpu_req.source, "limit": f_cpu_lim.source},
                },
                "memory": {
                    "request": format_memory(f_mem_req.value),
                    "limit": format_memory(f_mem_lim.value),
                    "request_bytes": f_mem_req.value,
                    "limit_bytes": f_mem_lim.value,
                    "source": {"request": f_mem_req.source, "limit": f_mem_lim.source},
                },
                "observed": {
                    "cpu_millicores": cpu_observed,
                    "memory_bytes": mem_observed,
                },
                "oom": {"consecutive": k, "backoff_factor": 2**k, "capped": capped},
            }
        )
    return {
        "org": key.org,
        "repo": key.repo,
        "workflow": key.workflow,
        "job": key.job,
        "containers": containers,
        "meta": {
            "phase": phase,
            "clean_samples": history.clean_samples,
            "runs_analyzed": n_analysed,
            "runs": params.runs,
            "buffer": params.buffer,
            "cpu_percentile": params.cpu_percentile,
            "override_scope": override_scope(pins),
            "cpu_sizing_mode": policy.cpu_sizing_mode,
            "memory_qos": policy.memory_qos,
            "node_ceiling_bytes": ceiling,
            "generated_at": to_rfc3339(utcnow()),
            "degraded": False,
        },
    }


async def find_job_id(*, session: AsyncSession, key: ScopeKey) -> int | None:
    job_id: int | None = (
        await session.execute(
            select(col(Job.id)).where(
                col(Job.org) == key.org,
                col(Job.repo) == key.repo,
                col(Job.workflow) == key.workflow,
                col(Job.job) == key.job,
            )
        )
    ).scalar_one_or_none()
    return job_id


@dataclass(frozen=True)
class Recommendation:
    answer: dict[str, Any]
    job_id: int | None

    def totals(self) -> JobTotals:
        """Requests and observed use summed over the containers (for the fleet gauges)."""
        cs = self.answer["containers"]
        return JobTotals(
            cpu_request_millicores=sum(c["cpu"]["request_millicores"] for c in cs),
            cpu_observed_millicores=sum(c["observed"]["cpu_millicores"] or 0.0 for c in cs),
            memory_request_bytes=sum(c["memory"]["request_bytes"] for c in cs),
            memory_observed_bytes=sum(c["observed"]["memory_bytes"] or 0 for c in cs),
        )


async def recommend(*, session: AsyncSession, key: ScopeKey, params: SizingParams, policy: Policy) -> Recommendation:
    """The sizing answer for one job; an unseen job answers in the unknown phase."""
    job_id = await find_job_id(session=session, key=key)
    history = await load_history(
        session=session,
        job_id=job_id,
        runs=params.runs,
        need_node_memory=policy.max_memory is None,
    )
    pins = await overrides_service.applicable(
        session=session, org=key.org, repo=key.repo, workflow=key.workflow, job=key.job
    )
    started = time.perf_counter()
    answer = compute(key=key, history=history, pins=pins, params=params, policy=policy)
    CORE_DURATION.labels(operation="size_job").observe(time.perf_counter() - started)
    return Recommendation(answer=answer, job_id=job_id)


class AnswerCache:
    """The last answer served per job, bounded (least recently served evicted first), for
    degraded mode: when the database fails, the build still gets what it got last time."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._answers: OrderedDict[ScopeKey, dict[str, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._answers)

    def put(self, key: ScopeKey, answer: dict[str, Any]) -> None:
        if self.capacity <= 0:
            return
        self._answers[key] = answer
        self._answers.move_to_end(key)
        while len(self._answers) > self.capacity:
            self._answers.popitem(last=False)

    def get(self, key: ScopeKey) -> dict[str, Any] | None:
        found = self._answers.get(key)
        if found is not None:
            self._answers.move_to_end(key)
        return found


def degraded(*, key: ScopeKey, cache: AnswerCache, params: SizingParams, policy: Policy) -> dict[str, Any]:
    """The answer when the database cannot be read in time: the last answer served for the job,
    else the unknown-phase defaults (without overrides, which cannot be read either); both
    marked ``meta.degraded``."""
    cached = cache.get(key)
    if cached is not None:
        answer = copy.deepcopy(cached)
    else:
        answer = compute(key=key, history=History(), pins={}, params=params, policy=policy)
    answer["meta"]["degraded"] = True
    return answer
