"""Ballast advice (``shared/seeds/004_*``): how big and how many placeholder pods keep build starts
instant, and when they can go. The formulas are pure functions over build starts and sizes;
``load`` reads an org's stored runs and each job's recommended pod size.

- size: the most common recommended build-pod size (each run counts its job's current size; ties
  go to the larger size), so one build evicts one ballast pod;
- replicas: build starts grouped into bursts (a burst opens at a start and takes every start
  within the autoscaler's provision delay; the next start after it opens the next burst); the
  most common burst size (ties to the larger), with the share of bursts no bigger than it;
- zero hours: the hours of the week (UTC) with no build start in the window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlmodel import col

from ..models import Job, Run
from ..quantity import format_cpu, format_memory
from . import sizing as sizing_service
from .overrides import ScopeKey

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def most_common_size(sizes: Iterable[tuple[int, int]]) -> tuple[int, int] | None:
    counts = Counter(sizes)
    if not counts:
        return None
    return max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]


def bursts(starts: Iterable[float], window: float) -> list[int]:
    """Sizes of the bursts of ``starts`` (seconds), each at most ``window`` long from its first start."""
    out: list[int] = []
    opened: float | None = None
    for t in sorted(starts):
        if opened is None or t >= opened + window:
            opened = t
            out.append(0)
        out[-1] += 1
    return out


def replicas(burst_sizes: Sequence[int]) -> tuple[int, float]:
    """The most common burst size (ties to the larger) and the share of bursts it covers."""
    if not burst_sizes:
        return 0, 1.0
    counts = Counter(burst_sizes)
    mode = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
    return mode, sum(1 for b in burst_sizes if b <= mode) / len(burst_sizes)


def zero_hours(starts: Iterable[datetime]) -> list[str]:
    """The hours of the week with no start, as ``"Sat 03"`` (UTC)."""
    busy = {(s.weekday(), s.hour) for s in starts}
    return [f"{DAYS[d]} {h:02d}" for d in range(7) for h in range(24) if (d, h) not in busy]


def helm_values(count: int, cpu: int, memory: int) -> str:
    """The cf-runtime chart's ``ballast.dind`` values. The chart reads the pod count from
    ``replicasCount`` (codefresh-io/venona,
    ``charts/cf-runtime/templates/_components/ballast/_deployment.yaml``); a ``replicaCount`` key
    would be silently ignored and deploy one pod."""
    q_cpu, q_mem = format_cpu(cpu), format_memory(memory)
    return (
        "ballast:\n"
        "  dind:\n"
        f"    enabled: {'true' if count > 0 else 'false'}\n"
        f"    replicasCount: {count}\n"
        "    resources:\n"
        "      requests:\n"
        f"        cpu: {q_cpu}\n"
        f"        memory: {q_mem}\n"
        "      limits:\n"
        f"        cpu: {q_cpu}\n"
        f"        memory: {q_mem}\n"
    )


@dataclass(frozen=True)
class Start:
    at: datetime
    job: ScopeKey


async def org_runs(*, conn: AsyncConnection, org: str, since: datetime, until: datetime) -> list[Any]:
    """The org's runs that finished in the window, oldest first: ``id``, ``started_at``,
    ``finished_at`` and the job's ``org``, ``repo``, ``workflow``, ``job``."""
    rows = await conn.execute(
        select(
            col(Run.id), col(Run.started_at), col(Run.finished_at),
            col(Job.org), col(Job.repo), col(Job.workflow), col(Job.job),
        )
        .join(Job, col(Run.job_id) == col(Job.id))
        .where(col(Job.org) == org, col(Run.finished_at) >= since, col(Run.finished_at) < until)
        .order_by(col(Run.finished_at), col(Run.id))
    )  # fmt: skip
    return list(rows)


async def load_starts(*, conn: AsyncConnection, org: str, since: datetime, until: datetime) -> list[Start]:
    """Build starts of the org's runs that finished in the window (``started_at``, else ``finished_at``)."""
    rows = await org_runs(conn=conn, org=org, since=since, until=until)
    return [Start(r.started_at or r.finished_at, ScopeKey(r.org, r.repo, r.workflow, r.job)) for r in rows]


async def advise(
    *,
    conn: AsyncConnection,
    org: str,
    since: datetime,
    until: datetime,
    provision_delay: float,
    policy: sizing_service.Policy,
) -> dict[str, Any]:
    starts = await load_starts(conn=conn, org=org, since=since, until=until)
    answers = await sizing_service.fetch_many(conn=conn, keys=list(dict.fromkeys(s.job for s in starts)), policy=policy)
    size = most_common_size(sizing_service.pod_requests(answers[s.job]) for s in starts)
    groups = bursts(((s.at - since).total_seconds() for s in starts), provision_delay)
    count, covered = replicas(groups)
    cpu, memory = size if size is not None else (0, 0)
    return {
        "org": org,
        "window": {"since": since.isoformat() + "Z", "until": until.isoformat() + "Z", "builds": len(starts)},
        "provision_delay_seconds": provision_delay,
        "pod": {"cpu": format_cpu(cpu), "cpu_millicores": cpu, "memory": format_memory(memory), "memory_bytes": memory},
        "replicas": count,
        "bursts": {"count": len(groups), "largest": max(groups, default=0), "covered_share": round(covered, 4)},
        "zero_hours_utc": zero_hours(s.at for s in starts) if until - since >= timedelta(days=7) else [],
        "helm_values": helm_values(count, cpu, memory),
    }
