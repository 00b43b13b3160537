"""Ballast advice (``shared/seeds/004_*``): how big and how many placeholder pods keep build starts
instant, and when they can go. The formulas are pure functions over build starts and sizes;
``load`` reads an org's stored runs and each job's recommended pod size.

- size: the most common recommended build-pod size (each run counts its job's current size; ties
  go to the larger size), so one build evicts one ballast pod;
- replicas: build starts grouped into bursts (a burst opens at a start and takes every start
  within the autoscaler's provision delay; the next start after it opens the next burst); the
  smallest k whose share of bursts no bigger than k reaches ``coverage`` (SA2), with every
  choice's share and cost in node-hours;
- zero hours: the hours of the week (UTC) with no build start, among the hour-of-week slots the
  data covers: the whole hours from when the org's stored runs are all its builds (``data_begins``:
  its first run, or later where retention may have deleted a job's older runs) to the window's end
  (SA4);
- the autoscaler: cf-runtime's ballast priority (-1000000) is below cluster-autoscaler's default
  expendable cutoff (-10), so an evicted ballast pod brings no node unless the cutoff is lowered (SA3).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlmodel import col

from service.keys import ScopeKey
from service.quantity import format_cpu, format_memory
from service.sizing import service as sizing_service
from service.tables import Job, Run

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


#: the share of bursts the ballast should absorb by default (SA2)
COVERAGE = 0.9
#: cluster-autoscaler's default --expendable-pods-priority-cutoff (core/utils/expendable.go, SA3)
EXPENDABLE_CUTOFF = -10
#: cf-runtime's ``cf-ballast`` PriorityClass value (charts/cf-runtime/templates/ballast/priority-class.yaml)
BALLAST_PRIORITY = -1_000_000


def replicas(burst_sizes: Sequence[int], coverage: float = COVERAGE) -> tuple[int, float]:
    """SA2: the smallest k with share(burst <= k) >= ``coverage``, and that share."""
    if not burst_sizes:
        return 0, 1.0
    n = len(burst_sizes)
    counts = Counter(burst_sizes)
    covered = 0
    for k in sorted(counts):
        covered += counts[k]
        if covered / n >= coverage - 1e-12:
            return k, covered / n
    return max(counts), 1.0  # pragma: no cover - the loop ends at share 1


def choices(burst_sizes: Sequence[int], node_share: float, hours: float) -> list[dict[str, Any]]:
    """Each burst size as a replica count: the share of bursts it covers and what it costs, in
    node-hours per week (``node_share`` of a node per pod, held ``hours`` a week)."""
    if not burst_sizes:
        return []
    n = len(burst_sizes)
    counts = Counter(burst_sizes)
    out = []
    covered = 0
    for k in sorted(counts):
        covered += counts[k]
        out.append(
            {
                "replicas": k,
                "covered_share": round(covered / n, 4),
                "node_hours_per_week": round(k * node_share * hours, 2),
            }
        )
    return out


def covered_slots(since: datetime, until: datetime) -> set[tuple[int, int]]:
    """SA4: the hour-of-week slots ``(weekday, hour)`` whose whole hour lies at least once in ``[since, until)``."""
    first = since.replace(minute=0, second=0, microsecond=0)
    if first < since:
        first += timedelta(hours=1)
    hours = max(0, math.floor((until - first).total_seconds() / 3600))
    slots: set[tuple[int, int]] = set()
    for h in range(min(hours, 168)):
        t = first + timedelta(hours=h)
        slots.add((t.weekday(), t.hour))
    return slots


def zero_hours(starts: Iterable[datetime], slots: set[tuple[int, int]] | None = None) -> list[str]:
    """The hours of the week with no start, as ``"Sat 03"`` (UTC), among ``slots`` (default: all 168)."""
    busy = {(s.weekday(), s.hour) for s in starts}
    return [
        f"{DAYS[d]} {h:02d}"
        for d in range(7)
        for h in range(24)
        if (d, h) not in busy and (slots is None or (d, h) in slots)
    ]


def autoscaler_advice(priority: int = BALLAST_PRIORITY, cutoff: int = EXPENDABLE_CUTOFF) -> str:
    """SA3: what the cluster needs so that an evicted ballast pod brings a node."""
    if priority >= cutoff:
        return f"the ballast's priority {priority} is not below the autoscaler's cutoff {cutoff}: an evicted ballast pod brings a node"
    return (
        f"cf-runtime runs the ballast at priority {priority} (PriorityClass cf-ballast), below cluster-autoscaler's "
        f"--expendable-pods-priority-cutoff ({cutoff} by default): an evicted ballast pod then never brings a node, "
        "and a node holding only ballast is scaled down. Run the autoscaler with "
        f"--expendable-pods-priority-cutoff={priority} or lower, or use an autoscaler that ignores pod priority."
    )


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


async def data_begins(*, conn: AsyncConnection, org: str, keep: int | None = None) -> datetime | None:
    """SA4: from when the org's stored runs are all its builds (start, else finish): its earliest run, or
    later, the earliest stored run of a job holding ``keep`` runs (the retention bound) or more, since
    retention may have deleted that job's older runs: before it, a quiet hour may only look quiet."""
    at = func.coalesce(col(Run.started_at), col(Run.finished_at))
    jobs = (
        select(func.min(at).label("oldest"), func.count().label("runs"))
        .join(Job, col(Run.job_id) == col(Job.id))
        .where(col(Job.org) == org)
        .group_by(col(Run.job_id))
        .subquery()
    )
    pruned = jobs.c.oldest if keep is None else case((jobs.c.runs >= keep, jobs.c.oldest))
    row = (await conn.execute(select(func.min(jobs.c.oldest), func.max(pruned)))).first()
    if row is None or row[0] is None:
        return None
    first: datetime = row[0]
    truncated: datetime | None = row[1]
    return first if truncated is None else max(first, truncated)


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
    coverage: float = COVERAGE,
    node_cpu: int = 8000,
    node_memory: int = 32 << 30,
    keep: int | None = None,
) -> dict[str, Any]:
    starts = await load_starts(conn=conn, org=org, since=since, until=until)
    answers = await sizing_service.fetch_many(conn=conn, keys=list(dict.fromkeys(s.job for s in starts)), policy=policy)
    size = most_common_size(answers[s.job].pod_requests() for s in starts)
    groups = bursts(((s.at - since).total_seconds() for s in starts), provision_delay)
    count, covered = replicas(groups, coverage)
    cpu, memory = size if size is not None else (0, 0)
    begins = await data_begins(conn=conn, org=org, keep=keep)
    slots = covered_slots(max(since, begins) if begins is not None else until, until)
    zeros = zero_hours((s.at for s in starts), slots)
    share = max(cpu / node_cpu, memory / node_memory)
    options = choices(groups, share, 168 - len(zeros))
    return {
        "org": org,
        "window": {"since": since.isoformat() + "Z", "until": until.isoformat() + "Z", "builds": len(starts)},
        "provision_delay_seconds": provision_delay,
        "pod": {"cpu": format_cpu(cpu), "cpu_millicores": cpu, "memory": format_memory(memory), "memory_bytes": memory},
        "replicas": count,
        "coverage": coverage,
        "bursts": {"count": len(groups), "largest": max(groups, default=0), "covered_share": round(covered, 4)},
        "choices": options,
        "zero_hours_utc": zeros,
        "hours_covered": len(slots),
        "autoscaler": autoscaler_advice(),
        "helm_values": helm_values(count, cpu, memory),
    }
