"""The builds a simulation replays: a synthetic trace (a weekly cycle with bursts), or an org's
stored runs in a window (``load_trace``) with each pod's size as recorded or as the sizer
recommends it now."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlmodel import col

from service import core
from service.ballast import service as ballast_service
from service.keys import ScopeKey
from service.simulations.model import Build
from service.sizing import service as sizing_service
from service.sizing.answer import Answer
from service.tables import RunContainer


@dataclass(frozen=True)
class JobKind:
    """A kind of build in a synthetic trace: its share of builds, pod size and typical duration."""

    share: float
    cpu: int
    memory: int
    minutes: float


DEFAULT_KINDS = (
    JobKind(0.45, 1000, 2 * core.GIB, 6),  # unit tests, lint
    JobKind(0.30, 2000, 4 * core.GIB, 12),  # builds
    JobKind(0.15, 4000, 8 * core.GIB, 25),  # integration suites
    JobKind(0.10, 500, 1 * core.GIB, 2),  # small jobs: checks, notifications
)


def synthetic_from(spec: Any) -> list[Build]:
    """``synthetic`` with the fields of a ``SyntheticSpec``."""
    return synthetic(
        days=spec.days,
        builds_per_day=spec.builds_per_day,
        seed=spec.seed,
        peak_hour=spec.peak_hour,
        weekend_factor=spec.weekend_factor,
        bursts_per_day=spec.bursts_per_day,
    )


def synthetic(
    *,
    days: float = 7,
    builds_per_day: float = 1500,
    seed: int = 0,
    peak_hour: float = 14.0,
    weekend_factor: float = 0.2,
    night_factor: float = 0.1,
    bursts_per_day: float = 6,
    burst_size: tuple[int, int] = (5, 20),
    kinds: Sequence[JobKind] = DEFAULT_KINDS,
) -> list[Build]:
    """Builds over ``days`` from a Monday 00:00: a daily cycle peaking at ``peak_hour`` (a Gaussian
    of 3 hours over a ``night_factor`` floor), weekends at ``weekend_factor``, Poisson arrivals by
    thinning, and bursts (a push that starts ``burst_size`` builds within a minute) during working
    hours. Durations are log-normal around each kind's typical minutes (sigma 0.4)."""
    rng = random.Random(seed)
    total_weight = sum(k.share for k in kinds)

    def rate(t: float) -> float:  # relative, 0..1
        day, hour = divmod(t / 3600, 24)
        daily = night_factor + (1 - night_factor) * math.exp(-(((hour - peak_hour) / 3.0) ** 2))
        return daily * (weekend_factor if int(day) % 7 >= 5 else 1.0)

    mean_rate = sum(rate(h * 3600 + 1800) for h in range(24 * 7)) / (24 * 7)
    peak_per_second = builds_per_day / 86400 / mean_rate
    builds: list[Build] = []

    def one(t: float) -> Build:
        kind = _kind_at(rng.random() * total_weight, kinds)
        duration = kind.minutes * 60 * math.exp(rng.gauss(0, 0.4))
        return Build(round(t, 3), round(max(30.0, duration), 3), kind.cpu, kind.memory)

    horizon = days * 86400
    for t in _thinned(rng, peak_per_second, rate, horizon):
        builds.append(one(t))
    if bursts_per_day > 0:
        for t in _thinned(rng, bursts_per_day / 86400, rate, horizon):
            for _ in range(rng.randint(*burst_size)):
                builds.append(one(t + rng.random() * 60))
    builds.sort(key=lambda b: b.start)
    return builds


def _kind_at(x: float, kinds: Sequence[JobKind]) -> JobKind:
    """The kind whose slice of the cumulative shares holds ``x`` (the last one past the total)."""
    for k in kinds:
        x -= k.share
        if x < 0:
            return k
    return kinds[-1]


def _thinned(rng: random.Random, per_second: float, rate: Callable[[float], float], horizon: float) -> Iterator[float]:
    """Poisson arrivals at ``per_second`` up to ``horizon``, each kept with probability ``rate(t)``.
    A generator: the caller's draws for each kept arrival come before the next arrival's."""
    t = 0.0
    while True:
        t += rng.expovariate(per_second)
        if t >= horizon:
            return
        if rng.random() < rate(t):
            yield t


async def load_trace(
    *,
    conn: AsyncConnection,
    org: str,
    since: datetime,
    until: datetime,
    sizes: str,
    policy: sizing_service.Policy,
    default_duration: float = 600.0,
) -> tuple[list[Build], dict[str, Any]]:
    """The org's runs that finished in the window, as builds: start (``started_at``, else the
    finish minus ``default_duration``), duration, and the pod size (``recommended`` or ``recorded``)."""
    rows = await ballast_service.org_runs(conn=conn, org=org, since=since, until=until)
    if sizes == "recommended":
        keys = {r.id: ScopeKey(r.org, r.repo, r.workflow, r.job) for r in rows}
        answers = await sizing_service.fetch_many(conn=conn, keys=list(dict.fromkeys(keys.values())), policy=policy)
        size = {rid: answers[k].pod_requests() for rid, k in keys.items()}
        limits = {rid: pod_limits(answers[k]) for rid, k in keys.items()}
    else:
        size = await recorded_sizes(conn=conn, run_ids=[r.id for r in rows])
        limits = {}
    starts = [r.started_at or r.finished_at - timedelta(seconds=default_duration) for r in rows]
    t0 = min(starts, default=since)
    builds = [
        Build(
            (s - t0).total_seconds(),
            max(1.0, (r.finished_at - s).total_seconds()),
            *size.get(r.id, (0, 0)),
            *limits.get(r.id, (-1, -1)),
        )
        for r, s in zip(rows, starts, strict=True)
    ]
    return builds, {
        "runs": len(rows),
        "without_start": sum(r.started_at is None for r in rows),
        "t0": t0.isoformat() + "Z",
    }


def pod_limits(answer: Answer) -> tuple[int, int]:
    """The limits the sizer gives the job's pod, summed (SA1): the CPU limit as enforce mode sets
    it (observe sets none, which limit-aware would count as a whole node), the memory limit."""
    cs = answer.containers
    return sum(c.cpu.limit_millicores for c in cs), sum(c.memory.limit_bytes for c in cs)


async def recorded_sizes(*, conn: AsyncConnection, run_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Per run, what it recorded: CPU peak and the reported memory limit (else the memory peak), summed."""
    out: dict[int, tuple[int, int]] = {}
    for chunk in range(0, len(run_ids), 500):
        rows = await conn.execute(
            select(
                col(RunContainer.run_pk),
                col(RunContainer.cpu_peak),
                col(RunContainer.memory_peak_bytes),
                col(RunContainer.memory_limit_bytes),
            ).where(col(RunContainer.run_pk).in_(run_ids[chunk : chunk + 500]))
        )
        for r in rows:
            cpu, mem = out.get(r.run_pk, (0, 0))
            out[r.run_pk] = (cpu + int(-(-r.cpu_peak // 1)), mem + (r.memory_limit_bytes or r.memory_peak_bytes))
    return out
