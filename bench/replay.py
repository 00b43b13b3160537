"""Closed-loop replay of real task traces (issue 25): how many runs each sizing policy gets
OOM-killed, and how much memory and CPU it wastes, when its own answers decide every run.

The public WfInstances traces (``wfinstances-runs.csv.gz``, see the README beside it) are read
from ``--data`` (default: ``../shared/data`` from the repository root); nothing is copied into the
repository, and the script skips with a message when the file is absent.

The loop, for each policy: the first 60 runs of every job with ten or more runs, jobs in name
order, each job's runs in start order (``executed_at``, ``instance``, ``task_id``). Before each
run, ask for the job's sizing. A peak above the memory limit given is an OOM kill: the run is
posted as one (``oom_killed``, the peak clipped at the limit) and not retried. Waste is
``(request - use) x duration``; a killed run must run again, so all it reserved counts as waste.
A task category ``<system>/<workflow>/<category>`` is a job: one org (the trace set), repo =
system, workflow = workflow, job = category.

Policies: the seed (guaranteed and burstable memory QoS), ``efficient`` (both QoS) and the
backtest's KRR-like and VPA-like baselines (``POLICY_KRR``, ``POLICY_VPA``).

    python bench/replay.py [--data DIR] [--database-url URL] [--check-offline] [--results-md FILE]
    python bench/replay.py --offline [--data DIR] [--results out.json] [--write-results]
    python bench/replay.py --robustness [--seeds 20] [--explain-kills] [--write-results]

The live mode (the default) runs each served policy and QoS against its own fresh ``python -m
service serve`` (its own port; a fresh SQLite file in a temporary directory, or a fresh database on
the PostgreSQL server of ``--database-url``; the server applies the migrations as it starts), with
``CI_SIZER_MEMORY_QOS`` and ``CI_SIZER_SIZING_POLICY`` in its environment and a tokens file
holding one ``ingest``+``read`` token. ``--grow``'s variants of one policy (with the guard, with
refusals: the client's side) share its server, each under an org of its own (``wfinstances-1``, ...). Before each run it GETs ``/api/v1/sizing/{org}/{repo}/
{workflow}/{job}``; after it, it POSTs ``/api/v1/runs`` as the collector would (the six CPU stats,
the peak working set, the limit in force, ``oom_kill_events``), a killed run with ``oom_killed``
and its peak clipped at the limit. One keep-alive connection per server. When the server echoes
``meta.policy`` it must be the policy asked for, or the replay stops. The KRR-like and VPA-like
baselines are not served policies: their rows come from the offline loop, and the table says so.
``--check-offline`` asserts that the seed's live answers (both QoS) are the offline ones, run by
run, and so are its kills and wastes.

``--offline`` drives the core's ``size_run`` directly (the same closed loop, no server); it swaps
the ``ask`` and ``post`` callables of ``Target`` and nothing else.

``--robustness`` (issue 35; offline, implied) is the protocol a change of ``efficient`` must pass:
the first 60 runs and every run of each job, each in name order and in ``--seeds`` (20) shuffled
job orders, each workflow system alone and the set without it. Each case replays efficient
(guaranteed, no growth), the two closed-loop anchors and efficient with growth (reported, not
judged); the report gives each case's share of each bound, the share of cases meeting each target
and the worst case; the script exits 3 while a case misses. ``--explain-kills`` reads each of
efficient's kills by the rule that made its answer (first run, learning, after a kill, confident).
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import bisect
import contextlib
import csv
import gzip
import json
import math
import random
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import asyncpg  # type: ignore[import-untyped]
import httpx
from sqlalchemy.engine import make_url

from bench import _grow, _load
from bench._util import ROOT, save
from service.runs.service import is_oom_suspect

FILE = "wfinstances-runs.csv.gz"
FIRST_RUNS = 60
ORG = "wfinstances"  # the replayed jobs' org
MIN_RUNS = 10
GIB = 1 << 30


@dataclass(frozen=True)
class Task:
    runtime_s: float
    cpu_millicores: float
    peak_bytes: int


@dataclass(frozen=True)
class Job:
    name: str  # <system>/<workflow>/<category>
    tasks: tuple[Task, ...]

    @property
    def key(self) -> tuple[str, str, str, str]:
        system, workflow, category = self.name.split("/", 2)
        return ORG, system, workflow, category


def load(path: Path, first: int | None = FIRST_RUNS) -> list[Job]:
    """The replayed jobs: the first 60 runs (``first``; None: every run) of each job with ten or more,
    jobs in name order."""
    rows: dict[str, list[tuple[str, str, str, Task]]] = defaultdict(list)
    with gzip.open(path, "rt", newline="") as f:
        for r in csv.DictReader(f):
            task = Task(float(r["runtime_s"]), float(r["cpu_mean_millicores"]), int(r["mem_peak_bytes"]))
            rows[r["job"]].append((r["executed_at"], r["instance"], r["task_id"], task))
    jobs = []
    for name in sorted(rows):
        if len(rows[name]) >= MIN_RUNS:
            ordered = sorted(rows[name], key=lambda t: t[:3])
            jobs.append(Job(name, tuple(t[3] for t in ordered[:first])))
    return jobs


@dataclass(frozen=True)
class Policy:
    label: str
    code: str  # "seed", "efficient", "growth", "krr", "vpa"
    guaranteed: bool = True
    #: issue 40 (--grow): the growth guard acts on the answer's grow block; the fraction of resizes refused
    grow: bool = False
    refused: float = 0.0


KRR_LOOP = Policy("KRR-like, closed loop (max peak + 15 %, p95 CPU)", "krr-loop")
VPA_LOOP = Policy("VPA-like, closed loop (p90 of peaks + 15 %, x1.2 after OOM)", "vpa-loop")
KRR = Policy("KRR-like, backtest baseline (POLICY_KRR)", "krr")
VPA = Policy("VPA-like, backtest baseline (POLICY_VPA)", "vpa")
POLICIES = (
    Policy("seed (guaranteed)", "seed"),
    Policy("seed (burstable)", "seed", guaranteed=False),
    Policy("efficient (guaranteed)", "efficient"),
    Policy("efficient (burstable)", "efficient", guaranteed=False),
    KRR_LOOP,
    VPA_LOOP,
    KRR,
    VPA,
)


@dataclass(frozen=True)
class Answer:
    """What the loop reads from a sizing answer (one container per job here)."""

    cpu_request: int  # millicores
    memory_request: int  # bytes
    memory_limit: int  # bytes
    grow: _grow.GrowBlock = _grow.NO_GROW  # the answer's grow block (rules G1-G5)


@dataclass(frozen=True)
class Posted:
    """One finished run as the loop posts it."""

    cpu_millicores: float
    peak_bytes: int  # clipped at the limit when killed
    limit_bytes: int
    oom_killed: bool
    runtime_s: float
    growths: tuple[tuple[int, int, str], ...] = ()  # the guard's events (from, to, result)


Key = tuple[str, str, str, str]


class Target:
    """Where the loop asks and posts: ``ask(key) -> Answer``, ``post(key, run)``."""

    ask: Callable[[Key], Answer]
    post: Callable[[Key, Posted], None]


@dataclass
class _Columns:
    clean: list[int] = field(default_factory=list)
    present: list[int] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    mem_peak: list[int] = field(default_factory=list)
    mem_limit: list[int] = field(default_factory=list)
    oom: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # each run's duration (E11)
    samples: int = 0  # runs without a kill ever posted (the prior's "first sample", E6), cut ones included

    def cut(self, start: int) -> None:
        """Forget the runs before ``start``."""
        for column in (self.clean, self.present, self.cpu, self.mem_peak, self.mem_limit, self.oom, self.seconds):
            del column[:start]


def _sorted_quantile(xs: Sequence[float], q: float) -> float:
    """I2's interpolated quantile of values already sorted."""
    h = (len(xs) - 1) * q
    lo = int(h)
    return xs[lo] if lo + 1 >= len(xs) else xs[lo] + (h - lo) * (xs[lo + 1] - xs[lo])


class Anchor(Target):
    """Issue 25's anchors as its replay ran them (its public figures come out of these): every
    run posted so far, killed ones included with their peak clipped at the limit. KRR-like: memory
    the highest peak + 15 %, CPU the p95 of the runs' CPU. VPA-like: memory and CPU the p90 + 15 %,
    a killed run counting at 1.2 x its limit. Request = limit; 500m / 4Gi before any run. They are
    computed here, not by the service: the backtest's baselines (``POLICY_KRR``, ``POLICY_VPA``)
    read only the newest clean runs and have no answer to a kill, so in a closed loop a job they
    get killed once stays killed."""

    def __init__(self, vpa: bool) -> None:
        self.vpa = vpa
        # per job, kept sorted as runs arrive (the same quantiles as sorting every posted run at each ask,
        # in time linear per run: the robustness protocol replays every run of jobs with thousands)
        self.cpu: dict[Key, list[float]] = defaultdict(list)
        self.mem: dict[Key, list[float]] = defaultdict(list)
        self.top: dict[Key, int] = {}
        self.ask = self._ask
        self.post = self._post

    def _ask(self, key: Key) -> Answer:
        cpu = self.cpu[key]
        if not cpu:
            return Answer(500, 4 * GIB, 4 * GIB)
        if self.vpa:
            limit = math.ceil(_sorted_quantile(self.mem[key], 0.9) * 1.15)
            request = math.ceil(_sorted_quantile(cpu, 0.9) * 1.15)
        else:
            limit = -(-self.top[key] * 115 // 100)
            request = math.ceil(_sorted_quantile(cpu, 0.95))
        return Answer(max(request, 1), limit, limit)

    def _post(self, key: Key, run: Posted) -> None:
        bisect.insort(self.cpu[key], run.cpu_millicores)
        bisect.insort(self.mem[key], run.peak_bytes * 1.2 if run.oom_killed else float(run.peak_bytes))
        self.top[key] = max(self.top.get(key, run.peak_bytes), run.peak_bytes)


class Offline(Target):
    """The core's ``size_run`` at ``i == n`` over each job's posted runs, the org's first-run prior
    updated with every posted sample: what the service will do, without the service."""

    def __init__(self, core: Any, policy: Policy, *, runs: int = 5, buffer: int = 20) -> None:
        self.core = core
        self.code = {
            "seed": core.POLICY_CI_SIZER,
            "efficient": core.POLICY_EFFICIENT,
            "growth": core.POLICY_GROWTH,
            "krr": core.POLICY_KRR,
            "vpa": core.POLICY_VPA,
        }[policy.code]
        self.guaranteed = policy.guaranteed
        self.runs, self.buffer = runs, buffer
        self.efficient = (core.POLICY_EFFICIENT, core.POLICY_GROWTH)  # E1: their samples include S1-only runs
        self.keep = max(runs, core.EFFICIENT_MIN_WINDOW, 3)  # the samples an answer may read (S4, S5, E2)
        self.jobs: dict[Key, _Columns] = defaultdict(_Columns)
        self.priors: dict[str, tuple[int, int]] = defaultdict(lambda: core.PRIOR_EMPTY)
        self.last: tuple[Any, int] | None = None  # the core's Sized and the prior of the latest answer
        self.ask = self._ask
        self.post = self._post

    def _ask(self, key: Key) -> Answer:
        c = self.jobs[key]
        prior = self.core.prior_read(self.priors[key[0]])
        s = self.core.size_run(
            len(c.clean), c.clean, c.present, c.cpu, c.cpu, c.cpu, c.mem_peak, c.mem_limit, c.oom, c.mem_peak,
            -1, self.code, self.runs, self.buffer, self.guaranteed, (-1, -1, -1, -1, 0, 0, 0, 0),
            64 * GIB, prior, c.seconds,
        )  # fmt: skip
        self.last = (s, prior)
        # rules G2-G5 as the server's compute: no node ceiling in the traces, so G2's bound is the backoff's 64Gi
        peak = self.core.window_peak(len(c.clean), c.clean, c.present, c.mem_peak, self.code, self.runs)
        return Answer(
            s.cpu_request, s.memory_request, s.memory_limit, self.core.size_grow(s.memory_limit, peak, 64 * GIB)
        )

    def _post(self, key: Key, run: Posted) -> None:
        core = self.core
        c = self.jobs[key]
        near = is_oom_suspect(  # rule S1 as ingest applies it, growth included (G6, G7)
            memory_peak_bytes=run.peak_bytes, memory_limit_bytes=run.limit_bytes, oom_killed=False,
            oom_kill_events=0, grew=any(r == "grown" for _, _, r in run.growths),
            too_late=any(r == "too_late" for _, _, r in run.growths),
        )  # fmt: skip
        c.clean.append(core.RUN_KILLED if run.oom_killed else core.RUN_NEAR_LIMIT if near else core.RUN_CLEAN)
        c.oom.append(core.OOM_KILLED if run.oom_killed else core.OOM_NEAR_LIMIT if near else core.OOM_NONE)
        c.present.append(1)
        c.cpu.append(run.cpu_millicores)  # the traces give the mean: all six stats are it
        c.mem_peak.append(run.peak_bytes)
        c.mem_limit.append(run.limit_bytes)
        c.seconds.append(run.runtime_s)
        if not run.oom_killed:
            self.priors[key[0]] = core.prior_update(self.priors[key[0]], run.peak_bytes, c.samples == 0)
            c.samples += 1
        if len(c.clean) >= 4 * self.keep:
            self._forget(c)

    def _forget(self, c: _Columns) -> None:
        """Drop the runs before the ``keep``-th newest sample: an answer reads the newest samples of
        its window (S5, E2; at least 3 to tell the phase, S4) and the runs since the oldest of them (the
        OOM streak S13/E5, G3's P), never older ones; so the answers are those of the whole history, and
        a job of 10,000 runs costs no more per run than one of 100."""
        samples = (self.core.RUN_CLEAN,) if self.code not in self.efficient else (
            self.core.RUN_CLEAN, self.core.RUN_NEAR_LIMIT,
        )  # fmt: skip
        seen = 0
        for j in range(len(c.clean) - 1, -1, -1):
            if c.clean[j] in samples:
                seen += 1
                if seen == self.keep:
                    c.cut(j)
                    return


class PolicyMismatch(RuntimeError):
    """The server answered for another sizing policy than the one it was started with."""


class Live(Target):
    """A served policy through the live HTTP API: ``GET /api/v1/sizing/...`` before each run,
    ``POST /api/v1/runs`` after it, on one keep-alive connection (``client``)."""

    CONTAINER = "task"

    def __init__(self, client: httpx.Client, policy: Policy, *, start: datetime, org: str | None = None) -> None:
        self.client = client
        self.policy = policy
        self.org = org  # None: the jobs' own org; else this replay's jobs live under it, apart from others'
        self.clock = start  # each posted run finishes one second after the one before
        self.posted = 0
        self.served: str | None = None  # meta.policy as the server echoes it; None: not echoed
        self.ask = self._ask
        self.post = self._post

    @staticmethod
    def path(key: Key) -> str:
        return "/api/v1/sizing/" + "/".join(quote(part, safe="") for part in key)

    def _key(self, key: Key) -> Key:
        return key if self.org is None else (self.org, *key[1:])

    def _ask(self, key: Key) -> Answer:
        key = self._key(key)
        r = self.client.get(self.path(key))
        if r.status_code != 200:
            raise RuntimeError(f"GET {self.path(key)} answered {r.status_code}: {r.text[:300]}")
        body = r.json()
        served = body["meta"].get("policy")
        if served is not None and served != self.policy.code:
            raise PolicyMismatch(
                f"asked for sizing policy {self.policy.code!r}, the server answered meta.policy {served!r}"
            )
        self.served = served
        if body["meta"]["degraded"]:  # a fallback (the last answer) when the database was slow: not the policy's
            raise RuntimeError(f"GET {self.path(key)} answered a degraded (fallback) answer: {body['meta']}")
        if len(body["containers"]) != 1:
            raise RuntimeError(f"expected one container in the answer for {key}, got {body['containers']}")
        c = body["containers"][0]
        g = c.get("grow")
        grow = _grow.NO_GROW if g is None else (g["max_bytes"], g["threshold_percent"], g["step_bytes"])
        return Answer(c["cpu"]["request_millicores"], c["memory"]["request_bytes"], c["memory"]["limit_bytes"], grow)

    def _post(self, key: Key, run: Posted) -> None:
        self.posted += 1
        finished = self.clock + timedelta(seconds=self.posted)
        started = finished - timedelta(seconds=run.runtime_s)
        org, repo, workflow, job = self._key(key)
        cpu = run.cpu_millicores  # the traces give the mean: all six stats are it
        body = {
            "org": org,
            "repo": repo,
            "workflow": workflow,
            "job": job,
            "run_id": f"replay-{self.posted}",
            "started_at": started.isoformat().replace("+00:00", "Z"),
            "finished_at": finished.isoformat().replace("+00:00", "Z"),
            "containers": [
                {
                    "name": self.CONTAINER,
                    "cpu_stats_millicores": dict.fromkeys(("peak", "p99", "p95", "p75", "p50", "avg"), cpu),
                    "memory_peak_bytes": run.peak_bytes,  # clipped at the limit when killed
                    "memory_limit_bytes": run.limit_bytes,
                    "oom_killed": run.oom_killed,
                    "oom_kill_events": int(run.oom_killed),
                    **_growths(run, started),
                }
            ],
        }
        r = self.client.post("/api/v1/runs", json=body)
        if r.status_code not in (200, 201) or r.json().get("result") != "created":
            raise RuntimeError(f"POST /api/v1/runs answered {r.status_code}: {r.text[:300]}")


def _growths(run: Posted, started: datetime) -> dict[str, Any]:
    """The guard's events as the run's body carries them (issue 40), a second apart from the start."""
    if not run.growths:
        return {}
    return {
        "growths": [
            {
                "at": (started + timedelta(seconds=k)).isoformat().replace("+00:00", "Z"),
                "from_bytes": f,
                "to_bytes": t,
                "result": r,
            }
            for k, (f, t, r) in enumerate(run.growths)
        ]
    }


@dataclass
class Tally:
    runs: int = 0
    killed: int = 0
    memory_waste: float = 0.0  # byte-seconds
    cpu_waste: float = 0.0  # millicore-seconds
    answers: list[Answer] = field(default_factory=list)  # the answer before each run, in order
    growth: _grow.Counts = field(default_factory=_grow.Counts)  # what the guard did (--grow)

    def row(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "oom_killed": self.killed,
            "oom_share": self.killed / self.runs if self.runs else 0.0,
            "memory_waste_gib_h": self.memory_waste / GIB / 3600,
            "cpu_waste_core_h": self.cpu_waste / 1000 / 3600,
            **self.growth.row(),
        }


Observer = Callable[[Job, int, Task, Answer, _grow.Outcome, float], None]


def replay(jobs: Sequence[Job], target: Target, policy: Policy | None = None, observe: Observer | None = None) -> Tally:
    """The closed loop over ``jobs`` in the order given; with ``policy.grow`` the growth guard acts on
    each answer's grow block (bench/_grow.py). ``observe(job, n, task, answer, outcome, waste)`` sees
    each run (its memory waste in byte-seconds) before it is posted."""
    t = Tally()
    refuse = _grow.Refusals(policy.refused) if policy is not None and policy.grow else None
    guaranteed = policy is None or policy.guaranteed
    for job in jobs:
        for n, task in enumerate(job.tasks):
            a = target.ask(job.key)
            t.answers.append(a)
            o = _grow.outcome(
                task.peak_bytes, a.memory_limit, a.memory_request, a.grow, refuse=refuse, guaranteed=guaranteed
            )
            t.growth.add(o, task.peak_bytes, a.memory_limit)
            t.runs += 1
            if o.killed:
                t.killed += 1
                waste = o.request * task.runtime_s
                t.cpu_waste += a.cpu_request * task.runtime_s
            else:
                waste = max(0, o.request - task.peak_bytes) * task.runtime_s
                t.cpu_waste += max(0.0, a.cpu_request - task.cpu_millicores) * task.runtime_s
            t.memory_waste += waste
            if observe is not None:
                observe(job, n, task, a, o, waste)
            peak = min(task.peak_bytes, o.limit)
            target.post(job.key, Posted(task.cpu_millicores, peak, o.limit, o.killed, task.runtime_s, o.events))
    return t


def table_rows(
    jobs: Sequence[Job], make: Callable[[Policy], Target], policies: Sequence[Policy] = POLICIES
) -> list[dict[str, Any]]:
    return [{"policy": p.label, **growth_column(p), **replay(jobs, make(p), p).row()} for p in policies]


def grow_policies(refused: float) -> tuple[Policy, ...]:
    """``--grow``'s rows (issue 40): each served policy without and with the growth guard (and, with
    ``--grow-refused F``, with F of the resizes refused), the growth policy (G8), and the anchors."""
    rows: list[Policy] = []
    for code, name in (("seed", "seed"), ("efficient", "efficient"), ("growth", "growth policy (G8)")):
        rows.append(Policy(f"{name} (guaranteed)", code))
        rows.append(Policy(f"{name} (guaranteed) + growth", code, grow=True))
        if refused > 0:
            rows.append(
                Policy(f"{name} (guaranteed) + growth, {refused:.0%} refused", code, grow=True, refused=refused)
            )
    return (*rows, KRR_LOOP, VPA_LOOP)


def growth_column(p: Policy) -> dict[str, str]:
    if not p.grow:
        return {"growth": "off"}
    return {"growth": "on" if p.refused == 0 else f"on, {p.refused:.0%} of resizes refused"}


def verdict(
    rows: Sequence[dict[str, Any]],
    anchors: tuple[Policy, Policy] = (KRR_LOOP, VPA_LOOP),
    label: str = "efficient (guaranteed)",
) -> dict[str, Any]:
    """Issue 25's target for ``label``: at most half the OOM-killed runs of the better anchor, at
    most 0.8x the lower of their memory wastes, CPU waste at most VPA-like's."""
    by = {r["policy"]: r for r in rows}
    e, krr, vpa = by[label], by[anchors[0].label], by[anchors[1].label]
    oom_bound = 0.5 * min(krr["oom_killed"], vpa["oom_killed"])
    mem_bound = 0.8 * min(krr["memory_waste_gib_h"], vpa["memory_waste_gib_h"])
    return {
        "oom": (e["oom_killed"], oom_bound, e["oom_killed"] <= oom_bound),
        "memory": (e["memory_waste_gib_h"], mem_bound, e["memory_waste_gib_h"] <= mem_bound),
        "cpu": (e["cpu_waste_core_h"], vpa["cpu_waste_core_h"], e["cpu_waste_core_h"] <= vpa["cpu_waste_core_h"]),
    }


def render(title: str, rows: Sequence[dict[str, Any]]) -> list[str]:
    """A markdown table; ratios against the better anchor (KRR-like, VPA-like) side by side. A
    row's ``source`` (live mode) is shown after its policy's name."""
    by = {r["policy"]: r for r in rows}
    krr, vpa = by[KRR_LOOP.label], by[VPA_LOOP.label]
    best_oom = min(krr["oom_killed"], vpa["oom_killed"]) or 1
    best_mem = min(krr["memory_waste_gib_h"], vpa["memory_waste_gib_h"]) or 1.0
    out = [
        f"{title} ({rows[0]['runs']} runs)",
        "",
        "| policy | OOM-killed runs | memory waste GiB-h | CPU waste core-h | OOM vs better anchor | memory vs lower anchor | CPU vs VPA-like |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu_ratio = r["cpu_waste_core_h"] / vpa["cpu_waste_core_h"] if vpa["cpu_waste_core_h"] else float("nan")
        out.append(
            f"| {r['policy']}{' (' + r['source'] + ')' if r.get('source') else ''} | {r['oom_killed']} ({r['oom_share']:.1%}) | {r['memory_waste_gib_h']:.2f} | "
            f"{r['cpu_waste_core_h']:.2f} | {r['oom_killed'] / best_oom:.2f}x | "
            f"{r['memory_waste_gib_h'] / best_mem:.2f}x | {cpu_ratio:.2f}x |"
        )
    out.append("")
    if "efficient (guaranteed)" not in by:
        return out
    for name, anchors in (("the closed-loop anchors", (KRR_LOOP, VPA_LOOP)), ("the backtest baselines", (KRR, VPA))):
        v = verdict(rows, anchors)
        met = all(ok for _, _, ok in v.values())
        out.append(
            f"- efficient (guaranteed) against issue 25's target with {name}: OOM-killed {v['oom'][0]} <= "
            f"{v['oom'][1]:.1f}, memory {v['memory'][0]:.2f} <= {v['memory'][1]:.2f} GiB-h, CPU "
            f"{v['cpu'][0]:.2f} <= {v['cpu'][1]:.2f} core-h: {'met' if met else 'NOT met'}"
        )
    return out


EFFICIENT = Policy("efficient (guaranteed)", "efficient")
EFFICIENT_GROW = Policy("efficient (guaranteed) + growth", "efficient", grow=True)
#: the rows each case of the robustness protocol replays: the judged policy, the anchors it is judged
#: against, and efficient with growth (reported, not judged: the targets are without growth)
PROTOCOL_POLICIES = (EFFICIENT, KRR_LOOP, VPA_LOOP, EFFICIENT_GROW)


def protocol(first: Sequence[Job], every: Sequence[Job], orders: int) -> list[tuple[str, list[Job]]]:
    """Issue 35's robustness protocol, for the first 60 runs of each job and for every run of it:
    the jobs in name order; in ``orders`` shuffled orders (seeds 0..orders-1: the first-run prior
    learns from the jobs before, so the order matters); each workflow system alone, and the set
    without it. Each case is a list of jobs in replay order."""
    out: list[tuple[str, list[Job]]] = []
    for runs, jobs in ((f"first {FIRST_RUNS} runs", first), ("every run", every)):
        out.append((f"{runs}, name order", list(jobs)))
        for seed in range(orders):
            shuffled = list(jobs)
            random.Random(seed).shuffle(shuffled)
            out.append((f"{runs}, shuffled (seed {seed})", shuffled))
        for system in sorted({j.name.split("/", 1)[0] for j in jobs}):
            out.append((f"{runs}, only {system}", [j for j in jobs if j.name.startswith(system + "/")]))
            out.append((f"{runs}, without {system}", [j for j in jobs if not j.name.startswith(system + "/")]))
    return out


TARGETS = ("oom", "memory", "cpu")
TARGET_NAMES = {
    "oom": "OOM-killed <= half the better anchor's",
    "memory": "memory waste <= 0.8x the lower anchor's",
    "cpu": "CPU waste <= VPA-like's",
}


def _share(value: float, bound: float) -> float:
    """``value`` as a share of its bound (<= 1 meets it); a bound of 0 is met by 0 only."""
    return value / bound if bound else (0.0 if not value else math.inf)


def case_result(title: str, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One case's verdict: each target's (value, bound, met) and its share of the bound, and what
    efficient does with growth (not judged)."""
    v = verdict(rows)
    by = {r["policy"]: r for r in rows}
    lower = min(by[KRR_LOOP.label]["memory_waste_gib_h"], by[VPA_LOOP.label]["memory_waste_gib_h"])
    grown = by.get(EFFICIENT_GROW.label)
    return {
        "check": title,
        "runs": rows[0]["runs"],
        "rows": list(rows),
        "target": v,
        "shares": {t: _share(v[t][0], v[t][1]) for t in TARGETS},
        "met": all(v[t][2] for t in TARGETS),
        "growth": None
        if grown is None
        else {"oom_killed": grown["oom_killed"], "memory_vs_lower": _share(grown["memory_waste_gib_h"], lower)},
    }


def summarise(results: Sequence[dict[str, Any]]) -> list[str]:
    """The protocol's report: efficient (guaranteed) per case as shares of issue 35's bounds
    (<= 1.00 meets), the share of cases meeting each target, and the worst case of each."""
    out = [
        "### Robustness protocol (issue 35): efficient (guaranteed), no growth, per case, as a share of each bound (<= 1.00 meets it)",
        "",
        "| case | runs | efficient OOM-killed (best anchor's) | OOM vs half the better anchor | memory vs 0.8x the lower anchor | CPU vs VPA-like | target | with growth: OOM-killed, memory vs lower anchor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        v, sh = r["target"], r["shares"]
        best = round(2 * v["oom"][1])
        g = r["growth"]
        grown = "-" if g is None else f"{g['oom_killed']}, {g['memory_vs_lower']:.2f}x"
        out.append(
            f"| {r['check']} | {r['runs']} | {v['oom'][0]} ({best}) | {sh['oom']:.2f} | {sh['memory']:.2f} | "
            f"{sh['cpu']:.2f} | {'met' if r['met'] else 'NOT met'} | {grown} |"
        )
    n = len(results)
    out += ["", "| target | cases meeting it | worst case | its share of the bound |", "|---|---|---|---|"]
    for t in TARGETS:
        worst = max(results, key=lambda r: r["shares"][t])
        met = sum(r["target"][t][2] for r in results)
        out.append(
            f"| {TARGET_NAMES[t]} | {met} of {n} ({met / n:.0%}) | {worst['check']} | {worst['shares'][t]:.2f} |"
        )
    met = sum(r["met"] for r in results)
    out += ["", f"Every target met in {met} of {n} cases ({met / n:.0%}), against the closed-loop anchors."]
    return out


#: a run's cause, as issue 35 asks it to be read: what the answer before it was made from
CAUSES = (
    "first run, at the 4Gi default (E6)",
    "first run, under the org's prior (E6)",
    "after a kill (E5's backoff)",
    "learning, 1-2 samples (E3)",
    "confident, 3+ samples (E3)",
)


def cause(core: Any, sized: Any, prior: int) -> str:
    """Which rule made the answer: E5 when the container's newest run was killed, else the phase's."""
    if sized.consecutive > 0:
        return CAUSES[2]
    if sized.phase == core.PHASE_UNKNOWN:
        return CAUSES[1] if prior >= 0 else CAUSES[0]
    return CAUSES[3] if sized.phase == core.PHASE_LEARNING else CAUSES[4]


def explain_kills(core: Any, title: str, jobs: Sequence[Job], policy: Policy = EFFICIENT) -> list[str]:
    """Issue 35's reading of each killed run: which answer it had (``cause``), and for the runs
    killed after a sample, how far the peak jumped over the highest peak of the window it was sized
    from. Memory waste by the same causes shows where the headroom is spent."""
    target = Offline(core, policy)
    kills: dict[str, int] = defaultdict(int)
    runs: dict[str, int] = defaultdict(int)
    waste: dict[str, float] = defaultdict(float)
    killed: list[str] = []

    def observe(job: Job, n: int, task: Task, a: Answer, o: _grow.Outcome, w: float) -> None:
        assert target.last is not None
        sized, prior = target.last
        c = cause(core, sized, prior)
        runs[c] += 1
        waste[c] += w
        if o.killed:
            kills[c] += 1
            jump = f"{task.peak_bytes / sized.memory_observed:.2f}x" if sized.memory_observed > 0 else "-"
            killed.append(
                f"| {job.name} | {n + 1} | {c} | {a.memory_limit / (1 << 20):.0f} | {task.peak_bytes / (1 << 20):.1f} "
                f"| {jump} | {task.runtime_s:.0f} |"
            )

    t = replay(jobs, target, policy, observe)
    out = [
        f"### Where {policy.label}'s kills come from: {title} ({t.runs} runs, {t.killed} killed)",
        "",
        "| answer made by | runs | OOM-killed | memory waste GiB-h |",
        "|---|---|---|---|",
    ]
    for c in CAUSES:
        out.append(f"| {c} | {runs[c]} | {kills[c]} | {waste[c] / GIB / 3600:.2f} |")
    if killed and len(killed) <= 40:
        out += [
            "",
            "| killed run: job | run | answer made by | limit MiB | peak MiB | peak vs window's highest | seconds |",
            "|---|---|---|---|---|---|---|",
            *killed,
        ]
    return out


def write_results(path: Path, section: list[str]) -> None:
    """Replace (or append) this script's section of ``bench/RESULTS.md``, keeping the rest."""
    heading = section[0]
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = text.rstrip("\n").split("\n")
    if heading in lines:
        start = lines.index(heading)
        end = next((k for k in range(start + 1, len(lines)) if lines[k].startswith("## ")), len(lines))
        lines[start:end] = [*section, ""] if end < len(lines) else section
    else:
        lines += ["", *section]
    path.write_text("\n".join(lines).rstrip("\n") + "\n")


SERVED = ("seed", "efficient", "growth")  # the policies a server answers for; the anchors are offline only
LIVE_HEADING = "## Replay: closed loop through the live HTTP API on the public WfInstances traces (bench/replay.py)"


def tokens_file(directory: Path) -> tuple[Path, str]:
    """A tokens file with one ``ingest`` + ``read`` token (docs/overrides.md), and its secret."""
    from service.auth import hash_secret, new_secret

    secret = new_secret()
    path = directory / "tokens.toml"
    path.write_text(f'[[tokens]]\nname = "replay"\nsha256 = "{hash_secret(secret)}"\nroles = ["ingest", "read"]\n')
    return path, secret


@contextlib.contextmanager
def served(policy: Policy, directory: Path, database_url: str | None, secret: str) -> Iterator[httpx.Client]:
    """A fresh ``python -m service serve`` for ``policy`` and a keep-alive client to it."""
    qos = "guaranteed" if policy.guaranteed else "burstable"
    name = f"replay_{policy.code}_{qos}"
    if database_url:
        # a database of its own on the server, named apart from any other replay's, dropped after
        url = _load.run(_load.fresh_database(database_url, f"ci_sizer_{name}_{uuid.uuid4().hex[:8]}"))
    else:
        url = f"sqlite+aiosqlite:///{directory / name}.db"
    try:
        with serving(policy, qos, url, directory / f"{name}.log", secret) as client:
            yield client
    finally:
        if database_url:
            _load.run(drop_database(url))


@contextlib.contextmanager
def serving(policy: Policy, qos: str, url: str, log: Path, secret: str) -> Iterator[httpx.Client]:
    """The server on ``url``, its log at ``log``, the tokens file beside it; the policy checked
    against ``/api/v1/info`` (``memory_qos``, and ``sizing_policy`` once the server has it)."""
    from tests.live import LiveServer

    directory = log.parent
    env = {
        "CI_SIZER_MEMORY_QOS": qos,
        "CI_SIZER_SIZING_POLICY": policy.code,
        # the replay measures answers, not latency: no fail-open fallback on a slow (shared) database
        "CI_SIZER_SIZING_DEADLINE_MS": "60000",
    }
    args = ("--tokens-file", str(directory / "tokens.toml"), "--log-level", "warning")
    with (
        LiveServer(url, *args, log=log, env=env) as server,
        httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as client,
    ):
        info = client.get("/api/v1/info").raise_for_status().json()
        if info["memory_qos"] != qos:
            raise RuntimeError(f"started with memory QoS {qos}, /api/v1/info says {info['memory_qos']}")
        if info.get("sizing_policy", policy.code) != policy.code:
            raise PolicyMismatch(
                f"asked for sizing policy {policy.code!r}, /api/v1/info says {info['sizing_policy']!r}"
            )
        yield client


async def drop_database(url: str) -> None:
    conn = await asyncpg.connect(_load._plain(url, "postgres"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')
    finally:
        await conn.close()


def offline_target(core: Any, p: Policy) -> Target:
    if p in (KRR_LOOP, VPA_LOOP):
        return Anchor(vpa=p is VPA_LOOP)
    return Offline(core, p)


def live_rows(
    jobs: Sequence[Job],
    core: Any,
    *,
    served_codes: Sequence[str],
    database_url: str | None,
    directory: Path,
    policies: Sequence[Policy] = POLICIES,
) -> tuple[list[dict[str, Any]], dict[str, Tally]]:
    """The table's rows: each served policy (and QoS) through its own server, its growth variants under
    orgs of their own on it, the anchors offline; and each row's tally (with the answers run by run)."""
    _, secret = tokens_file(directory)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
    rows: dict[str, dict[str, Any]] = {}
    tallies: dict[str, Tally] = {}
    # One server per served policy and QoS (what a server is started with); the growth guard and its
    # refusals act on the client's side, so each such variant is replayed on the same server under an
    # org of its own: nothing the server keeps (a job's history, its org's first-run prior) crosses orgs
    servers: dict[tuple[str, bool], list[Policy]] = defaultdict(list)
    for p in policies:
        if p.code in SERVED:
            if p.code in served_codes:
                servers[p.code, p.guaranteed].append(p)
        else:
            t = replay(jobs, offline_target(core, p), p)
            rows[p.label] = {
                "policy": p.label,
                "source": "offline loop: not a served policy",
                **growth_column(p),
                **t.row(),
            }
            tallies[p.label] = t
    for variants in servers.values():
        with served(variants[0], directory, database_url, secret) as client:
            for n, p in enumerate(variants):
                target = Live(client, p, start=start, org=None if n == 0 else f"{ORG}-{n}")
                t = replay(jobs, target, p)
                source = f"live, meta.policy {target.served}" if target.served else "live, meta.policy not echoed"
                seed = tallies.get(f"seed ({'guaranteed' if p.guaranteed else 'burstable'})")
                if p.code == "efficient" and target.served is None and seed is not None and seed.answers == t.answers:
                    source += ": the server ignored CI_SIZER_SIZING_POLICY and answered as seed (not wired yet)"
                rows[p.label] = {"policy": p.label, "source": source, **growth_column(p), **t.row()}
                tallies[p.label] = t
    return [rows[p.label] for p in policies if p.label in rows], tallies


def check_offline(
    jobs: Sequence[Job],
    core: Any,
    rows: Sequence[dict[str, Any]],
    tallies: dict[str, Tally],
    policies: Sequence[Policy] = POLICIES,
) -> list[str]:
    """Live == offline for the seed (both QoS), and for the other served policies when the server echoed
    them: the same answer (grow block included) before every run, so the same kills, growths and wastes.
    The problems, or []."""
    problems = []
    figures = ("runs", "oom_killed", "memory_waste_gib_h", "cpu_waste_core_h", "runs_grown", "resizes", "refused")
    by = {r["policy"]: r for r in rows}
    for p in policies:
        if p.label not in tallies or p.code not in SERVED:
            continue
        if p.code != "seed" and not by[p.label]["source"].startswith(f"live, meta.policy {p.code}"):
            continue
        offline = replay(jobs, Offline(core, p), p)
        live = tallies[p.label]
        for n, (a, b) in enumerate(zip(live.answers, offline.answers, strict=True)):
            if a != b:
                problems.append(f"{p.label}: run {n}: live answered {a}, offline {b}")
                break
        off_row = offline.row()
        for f in figures:
            if by[p.label][f] != off_row[f]:
                problems.append(f"{p.label}: {f} live {by[p.label][f]!r} != offline {off_row[f]!r}")
    return problems


def main_live(args: argparse.Namespace, jobs: list[Job]) -> int:
    from service import core

    title = f"public wfinstances, {len(jobs)} jobs"
    with tempfile.TemporaryDirectory(prefix="ci-sizer-replay-") as tmp:
        rows, tallies = live_rows(
            jobs, core, served_codes=args.policy or SERVED, database_url=args.database_url, directory=Path(tmp)
        )
    lines = render(title, rows)
    if any("answered as seed" in r["source"] for r in rows):  # no verdict on figures that are the seed's
        lines = [line for line in lines if not line.startswith("- efficient (guaranteed) against")]
        lines.append(
            "- efficient is not judged here: the server answered as seed (CI_SIZER_SIZING_POLICY is not wired "
            "yet); its figures are in the offline section (`--offline`)."
        )
    print("\n".join(lines) + "\n")
    database = "PostgreSQL (--database-url)" if args.database_url else "SQLite"
    section = [
        LIVE_HEADING,
        "",
        f"`python bench/replay.py{' --check-offline' if args.check_offline else ''}` on {database}, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC: each served policy against its own fresh `python -m service serve` "
        "(`CI_SIZER_MEMORY_QOS`, `CI_SIZER_SIZING_POLICY`), GET sizing before each run, POST runs after it "
        "(a peak above the limit posted as an OOM kill, clipped at the limit, not retried). The KRR-like and VPA-like "
        "rows are not served policies: they come from the offline loop, as marked.",
        "",
        f"### {lines[0]}",
        *lines[1:],
    ]
    status = 0
    if args.check_offline:
        problems = check_offline(jobs, core, rows, tallies)
        checked = [p.label for p in POLICIES if p.label in tallies and p.code in SERVED]
        if problems:
            print("check-offline FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
            status = 1
        else:
            line = "- check-offline: live == offline, answer by answer (same kills, same wastes), for: " + ", ".join(
                label
                for label in checked
                if not label.startswith("efficient")
                or {r["policy"]: r for r in rows}[label]["source"].startswith("live, meta.policy efficient")
            )
            print(line)
            section.append(line)
    if args.results:
        save(args.results, "replay-live", rows)
    if status == 0:
        write_results(args.results_md, section)
    return status


GROW_HEADING = "## Replay with growth (issue 40): closed loop on the public WfInstances traces (bench/replay.py --grow)"


def main_grow(args: argparse.Namespace, jobs: list[Job]) -> int:
    """``--grow``: the growth table (bench/_grow.py), offline over the core or through live servers."""
    if args.pure_python:
        from service.core import _reference as core
    else:
        from service import core  # type: ignore[no-redef]
    policies = grow_policies(args.grow_refused)
    title = f"public wfinstances, {len(jobs)} jobs"
    problems: list[str] = []
    if args.offline:
        rows = table_rows(jobs, lambda p: offline_target(core, p), policies)
        how = "offline: the core's `size_run`, `window_peak` and `size_grow`, no server"
    else:
        with tempfile.TemporaryDirectory(prefix="ci-sizer-replay-") as tmp:
            rows, tallies = live_rows(
                jobs, core, served_codes=args.policy or SERVED, database_url=args.database_url,
                directory=Path(tmp), policies=policies,
            )  # fmt: skip
        if args.check_offline:
            problems = check_offline(jobs, core, rows, tallies, policies)
        how = (
            "each served policy through its own `python -m service serve`, its growth variants on the same "
            "server under orgs of their own; the anchors offline"
        )
    lines = _grow.render(title, rows, (KRR_LOOP.label, VPA_LOOP.label))
    print("\n".join(lines))
    command = "python bench/replay.py --grow" + (f" --grow-refused {args.grow_refused:g}" if args.grow_refused else "")
    command += " --offline --write-results" if args.offline else (" --check-offline" if args.check_offline else "")
    section = [
        GROW_HEADING + ("" if args.offline else ", through the live HTTP API"),
        "",
        f"`{command}` ({how}): before each run the policy's answer and its `grow` block (rules G1-G5, "
        "docs/sizing.md); the growth guard raises the limit by the block's step whenever use reaches its threshold, up "
        "to its maximum; a run whose peak is above the limit in force at the end is an OOM kill. A grown run reserves "
        "its grown size for its whole duration (the traces give the peak, not when it came: this overstates the "
        "waste); a refused resize (`--grow-refused`, `Deferred`, fixed seed) stops the growing. Kills avoided: runs "
        "that grew past the limit they were given and were not killed.",
        "",
        f"### {lines[0]}",
        *lines[1:],
    ]
    if problems:
        print("check-offline FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    if args.check_offline:
        section.append(
            "- check-offline: live == offline, answer by answer (grow blocks included), for every served row"
        )
        print(section[-1])
    if args.results:
        save(args.results, "replay-grow", rows)
    if not args.offline or args.write_results:
        write_results(args.results_md, section)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data", help="the traces' directory")
    parser.add_argument("--offline", action="store_true", help="drive the core directly, no server")
    parser.add_argument("--pure-python", action="store_true", help="offline: the reference core, not the compiled")
    parser.add_argument(
        "--robustness",
        action="store_true",
        help="issue 35's protocol (implies --offline: the core's closed loop, no server): the first 60 and every "
        "run, each in name order and --seeds shuffled orders, each workflow system alone and the set without it",
    )
    parser.add_argument("--seeds", type=int, default=20, help="shuffled job orders for --robustness (default 20)")
    parser.add_argument(
        "--explain-kills",
        action="store_true",
        help="offline: read each of efficient's kills (first run, learning, after a kill, confident) on the public "
        "set, and on every run",
    )
    parser.add_argument("--results", help="write the figures as JSON here")
    parser.add_argument("--write-results", action="store_true", help="offline: write the table into bench/RESULTS.md")
    parser.add_argument("--database-url", help="live: a PostgreSQL server (a fresh database per policy), not SQLite")
    parser.add_argument("--policy", action="append", choices=SERVED, help="live: the served policies (default both)")
    parser.add_argument(
        "--check-offline", action="store_true", help="live: assert the seed's live answers are the offline ones"
    )
    parser.add_argument(
        "--results-md", type=Path, default=ROOT / "bench" / "RESULTS.md", help="live: where the table is written"
    )
    parser.add_argument(
        "--grow", action="store_true", help="issue 40: the growth guard acts on each answer's grow block"
    )
    parser.add_argument(
        "--grow-refused", type=float, default=0.0, metavar="F", help="with --grow: also refuse F of the resizes"
    )
    args = parser.parse_args(argv)
    if args.robustness or args.explain_kills:
        if args.check_offline or args.database_url or args.policy:
            parser.error("--robustness and --explain-kills are offline (the core's closed loop, no server)")
        args.offline = True
    if args.grow and (args.robustness or args.explain_kills):
        parser.error("--robustness reports efficient with growth in its own column; it is not run with --grow")
    if args.seeds < 0:
        parser.error("--seeds is a number of shuffled orders, 0 or more")
    if not 0.0 <= args.grow_refused <= 1.0:
        parser.error("--grow-refused is a fraction between 0 and 1")
    path = args.data / FILE
    if not path.exists():
        print(f"skipped: {path} is absent (the public traces are not part of the repository)")
        return 0
    if args.grow:
        return main_grow(args, load(path))
    if not args.offline:
        return main_live(args, load(path))
    return main_offline(args, path)


OFFLINE_HEADING = "## Replay: closed loop on the public WfInstances traces (bench/replay.py)"


def main_offline(args: argparse.Namespace, path: Path) -> int:
    """``--offline`` (and ``--robustness``, ``--explain-kills``): the core's closed loop, no server."""
    if args.pure_python:
        from service.core import _reference as core_module
    else:
        from service import core as core_module  # type: ignore[no-redef]

    def make(p: Policy) -> Target:
        return offline_target(core_module, p)

    jobs = load(path)
    title = f"public wfinstances, {len(jobs)} jobs"
    rows = table_rows(jobs, make)
    lines = render(title, rows)
    print("\n".join(lines) + "\n")
    # --robustness and --explain-kills imply --offline
    command = "python bench/replay.py" + (" --robustness" if args.robustness else "")
    command += " --explain-kills" if args.explain_kills else ""
    command += "" if args.robustness or args.explain_kills else " --offline"
    command += f" --seeds {args.seeds}" if args.robustness and args.seeds != 20 else ""
    section = [
        OFFLINE_HEADING,
        "",
        f"`{command} --write-results` (offline: the core, no server; {datetime.now(UTC):%Y-%m-%d}): the core's "
        "`size_run` answers before each run, a peak above the limit is an OOM kill (not retried, its whole "
        "reservation counted as waste). Ratios against the better of the closed-loop KRR-like and VPA-like anchors "
        "(the issue's public figures come out of these; the backtest's baselines are shown too).",
        "",
        f"### {lines[0]}",
        *lines[1:],
        "",
    ]
    detail: dict[str, Any] = {"public": rows}
    if args.robustness:
        every = load(path, None)
        results = [
            case_result(case, table_rows(subset, make, PROTOCOL_POLICIES))
            for case, subset in protocol(jobs, every, args.seeds)
        ]
        summary = summarise(results)
        print("\n".join(summary) + "\n")
        section += [*summary, ""]
        detail["robustness"] = results
    if args.explain_kills:
        every = load(path, None)
        for name, subset in ((title, jobs), (f"every run of the {len(every)} jobs", every)):
            explained = explain_kills(core_module, name, subset)
            print("\n".join(explained) + "\n")
            section += [*explained, ""]
    if args.results:
        flat = [{"check": title, **row} for row in rows]
        for r in detail.get("robustness", []):
            flat += [{"check": r["check"], **row} for row in r["rows"]]
        save(args.results, "replay", flat)
        Path(args.results).with_suffix(".detail.json").write_text(json.dumps(detail, indent=2) + "\n")
    if args.write_results:
        write_results(ROOT / "bench" / "RESULTS.md", section[:-1])
    if args.robustness and not all(r["met"] for r in detail["robustness"]):
        return 3  # the protocol is a gate: a case that misses the target fails the run
    return 0


if __name__ == "__main__":
    sys.exit(main())
