"""Sizing recommendations (rules S3-S17, O2-O4).

``load_history`` reads what one job's answer needs with a few index range scans;
``compute`` is a pure function from that history to the answer, with the arithmetic in the core.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service import core
from service.db import DB_FAULTS, within
from service.keys import SCOPES, ScopeKey
from service.observability.fleet import JobTotals
from service.observability.metrics import CORE_DURATION, DATABASE_ERRORS
from service.overrides import service as overrides_service
from service.overrides.service import PinRow
from service.quantity import format_cpu, format_memory
from service.sizing import answer, priors
from service.sizing import ceilings as ceilings_service
from service.sizing.answer import Phase
from service.sizing.ceilings import Ceiling
from service.sizing.history import History, HistoryRun, load_history
from service.sizing.params import SizingParams
from service.wire import to_rfc3339, utcnow

_PHASES: tuple[Phase, ...] = ("unknown", "learning", "confident")  # by the core's PHASE_* code
#: Specificity of a value's source, for rule O3 (the algorithm is the least specific).
_RANK = {"algorithm": 0, "org": 1, "repo": 2, "workflow": 3, "job": 4}
_SOURCE: tuple[answer.Source, ...] = (
    "algorithm",
    "org",
    "repo",
    "workflow",
    "job",
)  # an O3 rank's name, as size_run reports it
_MIB = core.MIB
log = logging.getLogger("ci_sizer.sizing")


@dataclass(frozen=True)
class Policy:
    cpu_sizing_mode: Literal["observe", "enforce"] = "observe"
    memory_qos: Literal["guaranteed", "burstable"] = "guaranteed"
    max_memory: int | None = None
    #: with no node ceiling, the most the OOM backoff raises a memory limit to (CI_SIZER_MAX_BACKOFF_MEMORY)
    max_backoff_memory: int = 64 * core.GIB
    #: runner ceilings by org ("*": every org), from CI_SIZER_RUNNER_CEILINGS_FILE
    ceilings: Mapping[str, Ceiling] = field(default_factory=dict)
    #: the server's sizing policy (CI_SIZER_SIZING_POLICY); an override's ``sizing_policy`` wins
    sizing_policy: answer.SizingPolicy = "seed"

    @classmethod
    def of(cls, settings: Any, ceilings: Mapping[str, Ceiling]) -> Policy:
        """The policy the settings configure (``settings``: a ``Settings``)."""
        return cls(
            cpu_sizing_mode=settings.cpu_sizing_mode,
            memory_qos=settings.memory_qos,
            max_memory=settings.max_memory,
            max_backoff_memory=settings.max_backoff_memory,
            ceilings=ceilings,
            sizing_policy=settings.sizing_policy,
        )


def node_ceiling(policy: Policy, history: History) -> int | None:
    """Rule S15: --max-memory, else 90% of the newest reported node memory, down to a whole MiB."""
    if policy.max_memory is not None:
        return policy.max_memory
    if history.newest_node_memory_bytes is None:
        return None
    return history.newest_node_memory_bytes * 9 // (10 * _MIB) * _MIB


def _ordered_names(runs: list[HistoryRun]) -> list[str]:
    names: dict[str, None] = {}
    for run in runs:
        for name in run.containers:
            names.setdefault(name, None)
    return list(names)


def override_scope(pins: dict[str, PinRow]) -> answer.OverrideScope:
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


def pins8(pins: Mapping[str, PinRow]) -> tuple[int, ...]:
    """Rule O2 as ``size_run`` takes it: per field the most specific pin (-1 = none), then its rank
    (1 org .. 4 job; 0 = not pinned)."""
    values, ranks = [-1] * 4, [0] * 4
    for f, column in enumerate(overrides_service.FIELDS):
        for scope in ("job", "workflow", "repo", "org"):
            o = pins.get(scope)
            if o is not None and getattr(o, column) is not None:
                values[f], ranks[f] = int(getattr(o, column)), _RANK[scope]
                break
    return (*values, *ranks)


def choose(pins: dict[str, PinRow], policy: Policy) -> answer.SizingPolicy:
    """The sizing policy of one job (issue 25): the most specific override's, else the server's."""
    chosen = overrides_service.sizing_policy(pins, policy.sizing_policy)
    if chosen == "efficient":
        return "efficient"
    return "growth" if chosen == "growth" else "seed"  # G8: growth is a policy of its own


#: the core's code of each sizing policy; ``growth`` (rule G8) samples and backs off as ``efficient``
_CODES = {"seed": core.POLICY_CI_SIZER, "efficient": core.POLICY_EFFICIENT, "growth": core.POLICY_GROWTH}


def reads_samples(chosen: answer.SizingPolicy) -> bool:
    """Whether the policy sizes from E1's samples (runs without a kill) and reads the first-run prior (E6)."""
    return chosen != "seed"


def grow_bound(policy: Policy, ceiling: int | None, org: str) -> int:
    """Rule G2: the most any container of the org's jobs may grow to: the node ceiling (S15), else
    ``--max-backoff-memory``; then no more than the org's runner ceiling on the memory limit (and on the
    request under ``guaranteed``, where a growth raises the request with the limit)."""
    bound = policy.max_backoff_memory if ceiling is None else ceiling
    runner = ceilings_service.for_org(policy.ceilings, org)
    if runner is not None:
        sides = (runner.memory_limit, runner.memory_request if policy.memory_qos == "guaranteed" else None)
        for most in sides:
            if most is not None and most < bound:
                bound = most
    return bound


def grow_block(limit: int, peak: int, bound: int) -> answer.Grow | None:
    """Rules G3-G5 (the core's ``size_grow``) as the answer's ``grow`` block; None when the container
    must not grow (G1)."""
    most, threshold, step = core.size_grow(limit, peak, bound)
    if most < 0:
        return None
    return answer.Grow(
        max=format_memory(most), max_bytes=most, threshold_percent=threshold, step=format_memory(step), step_bytes=step
    )


def compute(
    *,
    key: ScopeKey,
    history: History,
    pins: dict[str, PinRow],
    params: SizingParams,
    policy: Policy,
    prior: int = -1,
) -> answer.Answer:
    """The answer from the job's history: every rule of the policy is the core's ``size_run``
    (the one the backtest calls before each run), asked for the next run (``i == n``). ``prior``:
    the org's first-run prior (``core.prior_read``), read by the efficient policy only (E6)."""
    runs = history.window[::-1]  # oldest first, as the core reads columns
    n = len(runs)
    chosen = choose(pins, policy)
    efficient = reads_samples(chosen)
    code = _CODES[chosen]
    if efficient:  # E1: kills told apart from S1's 95 % clause
        clean = [priors.run_code(r.clean, r.containers.values()) for r in runs]
    else:
        clean = [core.RUN_CLEAN if r.clean else core.RUN_KILLED for r in runs]
    analysed = core.analysed_runs(n, clean, code, params.runs)
    names = _ordered_names([runs[j] for j in analysed] if analysed else history.window) or ["*"]  # rule S6
    ceiling = node_ceiling(policy, history)
    guaranteed = policy.memory_qos == "guaranteed"
    stat = f"cpu_{params.cpu_percentile}"
    pinned = pins8(pins)
    memory_pinned = pinned[6] > 0 or pinned[7] > 0  # rule G1: a pinned memory value never grows
    pod = [r.pod_memory() for r in runs]
    seconds = [r.seconds for r in runs]
    cpu_pinned = any(o.cpu_request_millicores is not None or o.cpu_limit_millicores is not None for o in pins.values())
    enforced = policy.cpu_sizing_mode == "enforce" or cpu_pinned  # rule S17
    phase: Phase = "unknown"
    containers: list[answer.Container] = []
    peaks: list[int] = []  # rule G3's P per container
    for name in names:
        rows = [r.containers.get(name) for r in runs]
        present = [int(c is not None) for c in rows]
        mem_peak = [0 if c is None else c.memory_peak_bytes for c in rows]
        s = core.size_run(
            n,
            clean,
            present,
            [0.0 if c is None else getattr(c, stat) for c in rows],
            [0.0 if c is None else c.cpu_peak for c in rows],
            [0.0 if c is None else c.cpu_p95 for c in rows],
            mem_peak,
            [-1 if c is None or c.memory_limit_bytes is None else c.memory_limit_bytes for c in rows],
            [0 if c is None else priors.oom_code(c) if efficient else int(c.oom_suspect) for c in rows],
            pod,
            -1 if ceiling is None else ceiling,
            code,
            params.runs,
            params.buffer,
            guaranteed,
            pinned,
            policy.max_backoff_memory,
            prior,
            seconds,  # rule E11
        )
        phase = _PHASES[s.phase]
        peaks.append(-1 if memory_pinned else core.window_peak(n, clean, present, mem_peak, code, params.runs))
        containers.append(
            answer.Container(
                name=name,
                cpu=answer.Cpu(
                    request=format_cpu(s.cpu_request),
                    limit=format_cpu(s.cpu_limit),
                    request_millicores=s.cpu_request,
                    limit_millicores=s.cpu_limit,
                    enforced=enforced,
                    source=answer.Sources(_SOURCE[s.cpu_request_source], _SOURCE[s.cpu_limit_source]),
                ),
                memory=answer.Memory(
                    request=format_memory(s.memory_request),
                    limit=format_memory(s.memory_limit),
                    request_bytes=s.memory_request,
                    limit_bytes=s.memory_limit,
                    source=answer.Sources(_SOURCE[s.memory_request_source], _SOURCE[s.memory_limit_source]),
                ),
                observed=answer.Observed(
                    cpu_millicores=None if s.cpu_observed < 0 else s.cpu_observed,
                    memory_bytes=None if s.memory_observed < 0 else s.memory_observed,
                ),
                oom=answer.Oom(consecutive=s.consecutive, backoff_factor=s.backoff_factor, capped=bool(s.capped)),
            )
        )
    runner_ceiling = ceilings_service.for_org(policy.ceilings, key.org)
    if runner_ceiling is not None:
        for c in containers:
            ceilings_service.clamp(c, runner_ceiling)
    if not memory_pinned:  # rules G1-G5, on the limits the runner will be given
        bound = grow_bound(policy, ceiling, key.org)
        for c, peak in zip(containers, peaks, strict=True):
            c.grow = grow_block(c.memory.limit_bytes, peak, bound)
    return answer.Answer(
        org=key.org,
        repo=key.repo,
        workflow=key.workflow,
        job=key.job,
        containers=containers,
        meta=answer.Meta(
            phase=phase,
            clean_samples=history.clean_samples,
            runs_analyzed=len(analysed) if efficient else min(params.runs, history.clean_samples),  # S5, E2
            runs=params.runs,
            buffer=params.buffer,
            cpu_percentile=params.cpu_percentile,
            override_scope=override_scope(pins),
            cpu_sizing_mode=policy.cpu_sizing_mode,
            memory_qos=policy.memory_qos,
            policy=chosen,
            node_ceiling_bytes=ceiling,
            generated_at=to_rfc3339(utcnow()) or "",
        ),
    )


@dataclass(frozen=True)
class Recommendation:
    answer: answer.Answer
    job_id: int | None
    #: wall-clock seconds until which the answer holds unless something is written (an applied
    #: override's expiry), else infinity
    fresh_until: float = math.inf

    def totals(self) -> JobTotals:
        """Requests and observed use summed over the containers (for the fleet gauges)."""
        cs = self.answer.containers
        cpu_request, memory_request = self.answer.pod_requests()
        return JobTotals(
            cpu_request_millicores=cpu_request,
            cpu_observed_millicores=sum(c.observed.cpu_millicores or 0.0 for c in cs),
            memory_request_bytes=memory_request,
            memory_observed_bytes=sum(c.observed.memory_bytes or 0 for c in cs),
        )


async def recommend(*, conn: AsyncConnection, key: ScopeKey, params: SizingParams, policy: Policy) -> Recommendation:
    """The sizing answer for one job; an unseen job answers in the unknown phase."""
    pins = await overrides_service.applicable(conn=conn, key=key)
    efficient = reads_samples(choose(pins, policy))
    job_id, history = await load_history(
        conn=conn,
        key=key,
        runs=window_runs(params, efficient),  # E2
        need_node_memory=policy.max_memory is None,
        every_run_when_short=efficient,
    )
    first_run = efficient and not priors.has_sample(history.window)
    prior = await priors.read(conn=conn, org=key.org) if first_run else None  # E6
    return recommendation(key=key, job_id=job_id, history=history, pins=pins, params=params, policy=policy, prior=prior)


def window_runs(params: SizingParams, efficient: bool) -> int:
    """How many clean runs the window of a job sized by the policy reaches back to (E2)."""
    return max(params.runs, priors.EFFICIENT_MIN_WINDOW) if efficient else params.runs


def recommendation(
    *,
    key: ScopeKey,
    job_id: int | None,
    history: History,
    pins: dict[str, PinRow],
    params: SizingParams,
    policy: Policy,
    prior: tuple[int, int] | None,
) -> Recommendation:
    """The answer computed from what ``recommend`` read (``prior``: the org's prior state, read only for
    an efficient answer with no sample, E6), with how long it holds."""
    first_run = prior is not None
    started = time.perf_counter()
    computed = compute(
        key=key,
        history=history,
        pins=pins,
        params=params,
        policy=policy,
        prior=-1 if prior is None else core.prior_read(prior),
    )
    CORE_DURATION.labels(operation="size_job").observe(time.perf_counter() - started)
    expiries = [o.expires_at.replace(tzinfo=UTC).timestamp() for o in pins.values() if o.expires_at is not None]
    if first_run:  # other jobs' runs move the prior (E6): an answer that read it is not cached
        expiries.append(0.0)
    return Recommendation(answer=computed, job_id=job_id, fresh_until=min(expiries, default=math.inf))


async def fetch_many(
    *, conn: AsyncConnection, keys: Iterable[ScopeKey], policy: Policy
) -> dict[ScopeKey, answer.Answer]:
    """Each job's answer with the default parameters (overrides included), for other resources."""
    params = SizingParams()
    return {k: (await recommend(conn=conn, key=k, params=params, policy=policy)).answer for k in keys}


def degraded(*, key: ScopeKey, last: answer.Answer | None, params: SizingParams, policy: Policy) -> answer.Answer:
    """The answer when the database cannot be read in time: the last answer served for the job,
    else the unknown-phase defaults (without overrides, which cannot be read either); both
    marked ``meta.degraded``."""
    fallback = last if last is not None else compute(key=key, history=History(), pins={}, params=params, policy=policy)
    return fallback.marked_degraded()


async def answers_for(
    *, engine: AsyncEngine, keys: list[ScopeKey], policy: Policy, deadline: float
) -> tuple[dict[ScopeKey, answer.Answer], bool]:
    """The answers of jobs another resource refers to (stages, placement, simulations), with the
    default parameters; when the database fails or is slow (``deadline`` seconds over the whole
    read), the ones not read are left out and the second value says ``degraded``."""
    if not keys:
        return {}, False
    answers: dict[ScopeKey, answer.Answer] = {}

    async def read() -> None:
        async with engine.connect() as conn:
            for key in keys:
                answers.update(await fetch_many(conn=conn, keys=[key], policy=policy))

    try:
        # one deadline for the whole read, connecting included: a database that accepts
        # connections and never answers costs the caller the deadline, not the connect timeout
        await within(deadline, read())
    except DB_FAULTS as exc:
        if not isinstance(exc, TimeoutError):
            DATABASE_ERRORS.inc()
        log.warning("recommendations for another resource degraded: %s", type(exc).__name__)
        return dict(answers), True  # a copy: the abandoned read may still be winding down
    return answers, False
