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

    python bench/replay.py --offline [--data DIR] [--robustness] [--results out.json] [--write-results]

``--offline`` drives the core's ``size_run`` directly (the same closed loop, no server). The
live mode asks a ``ci-sizer serve`` over HTTP instead; it swaps the ``ask`` and ``post`` callables
of ``Target`` and nothing else.
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import csv
import gzip
import json
import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench._util import ROOT, save

FILE = "wfinstances-runs.csv.gz"
FIRST_RUNS = 60
MIN_RUNS = 10
GIB = 1 << 30
NEAR_LIMIT = 0.95  # rule S1's clause: a peak at 95 % of the limit is OOM-suspect


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
        return "wfinstances", system, workflow, category


def load(path: Path) -> list[Job]:
    """The replayed jobs: the first 60 runs of each job with ten or more, jobs in name order."""
    rows: dict[str, list[tuple[str, str, str, Task]]] = defaultdict(list)
    with gzip.open(path, "rt", newline="") as f:
        for r in csv.DictReader(f):
            task = Task(float(r["runtime_s"]), float(r["cpu_mean_millicores"]), int(r["mem_peak_bytes"]))
            rows[r["job"]].append((r["executed_at"], r["instance"], r["task_id"], task))
    jobs = []
    for name in sorted(rows):
        if len(rows[name]) >= MIN_RUNS:
            ordered = sorted(rows[name], key=lambda t: t[:3])
            jobs.append(Job(name, tuple(t[3] for t in ordered[:FIRST_RUNS])))
    return jobs


@dataclass(frozen=True)
class Policy:
    label: str
    code: str  # "seed", "efficient", "krr", "vpa"
    guaranteed: bool = True


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


@dataclass(frozen=True)
class Posted:
    """One finished run as the loop posts it."""

    cpu_millicores: float
    peak_bytes: int  # clipped at the limit when killed
    limit_bytes: int
    oom_killed: bool
    runtime_s: float


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


def _quantile(values: Sequence[float], q: float) -> float:
    xs = sorted(values)
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
        self.jobs: dict[Key, list[Posted]] = defaultdict(list)
        self.ask = self._ask
        self.post = self._post

    def _ask(self, key: Key) -> Answer:
        runs = self.jobs[key]
        if not runs:
            return Answer(500, 4 * GIB, 4 * GIB)
        cpu = [r.cpu_millicores for r in runs]
        if self.vpa:
            mem = [r.peak_bytes * 1.2 if r.oom_killed else float(r.peak_bytes) for r in runs]
            limit = math.ceil(_quantile(mem, 0.9) * 1.15)
            request = math.ceil(_quantile(cpu, 0.9) * 1.15)
        else:
            limit = -(-max(r.peak_bytes for r in runs) * 115 // 100)
            request = math.ceil(_quantile(cpu, 0.95))
        return Answer(max(request, 1), limit, limit)

    def _post(self, key: Key, run: Posted) -> None:
        self.jobs[key].append(run)


class Offline(Target):
    """The core's ``size_run`` at ``i == n`` over each job's posted runs, the org's first-run prior
    updated with every posted sample: what the service will do, without the service."""

    def __init__(self, core: Any, policy: Policy, *, runs: int = 5, buffer: int = 20) -> None:
        self.core = core
        self.code = {
            "seed": core.POLICY_CI_SIZER,
            "efficient": core.POLICY_EFFICIENT,
            "krr": core.POLICY_KRR,
            "vpa": core.POLICY_VPA,
        }[policy.code]
        self.guaranteed = policy.guaranteed
        self.runs, self.buffer = runs, buffer
        self.jobs: dict[Key, _Columns] = defaultdict(_Columns)
        self.priors: dict[str, tuple[int, int]] = defaultdict(lambda: core.PRIOR_EMPTY)
        self.ask = self._ask
        self.post = self._post

    def _ask(self, key: Key) -> Answer:
        c = self.jobs[key]
        s = self.core.size_run(
            len(c.clean), c.clean, c.present, c.cpu, c.cpu, c.cpu, c.mem_peak, c.mem_limit, c.oom, c.mem_peak,
            -1, self.code, self.runs, self.buffer, self.guaranteed, (-1, -1, -1, -1, 0, 0, 0, 0),
            64 * GIB, self.core.prior_read(self.priors[key[0]]),
        )  # fmt: skip
        return Answer(s.cpu_request, s.memory_request, s.memory_limit)

    def _post(self, key: Key, run: Posted) -> None:
        core = self.core
        c = self.jobs[key]
        near = run.peak_bytes >= NEAR_LIMIT * run.limit_bytes  # rule S1
        samples_before = sum(1 for x in c.clean if x != core.RUN_KILLED)
        c.clean.append(core.RUN_KILLED if run.oom_killed else core.RUN_NEAR_LIMIT if near else core.RUN_CLEAN)
        c.oom.append(core.OOM_KILLED if run.oom_killed else core.OOM_NEAR_LIMIT if near else core.OOM_NONE)
        c.present.append(1)
        c.cpu.append(run.cpu_millicores)  # the traces give the mean: all six stats are it
        c.mem_peak.append(run.peak_bytes)
        c.mem_limit.append(run.limit_bytes)
        if not run.oom_killed:
            self.priors[key[0]] = core.prior_update(self.priors[key[0]], run.peak_bytes, samples_before == 0)


@dataclass
class Tally:
    runs: int = 0
    killed: int = 0
    memory_waste: float = 0.0  # byte-seconds
    cpu_waste: float = 0.0  # millicore-seconds

    def row(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "oom_killed": self.killed,
            "oom_share": self.killed / self.runs if self.runs else 0.0,
            "memory_waste_gib_h": self.memory_waste / GIB / 3600,
            "cpu_waste_core_h": self.cpu_waste / 1000 / 3600,
        }


def replay(jobs: Sequence[Job], target: Target) -> Tally:
    """The closed loop over ``jobs`` in the order given."""
    t = Tally()
    for job in jobs:
        for task in job.tasks:
            a = target.ask(job.key)
            killed = task.peak_bytes > a.memory_limit
            t.runs += 1
            if killed:
                t.killed += 1
                t.memory_waste += a.memory_request * task.runtime_s
                t.cpu_waste += a.cpu_request * task.runtime_s
            else:
                t.memory_waste += max(0, a.memory_request - task.peak_bytes) * task.runtime_s
                t.cpu_waste += max(0.0, a.cpu_request - task.cpu_millicores) * task.runtime_s
            peak = min(task.peak_bytes, a.memory_limit)
            target.post(job.key, Posted(task.cpu_millicores, peak, a.memory_limit, killed, task.runtime_s))
    return t


def table_rows(jobs: Sequence[Job], make: Callable[[Policy], Target]) -> list[dict[str, Any]]:
    return [{"policy": p.label, **replay(jobs, make(p)).row()} for p in POLICIES]


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
    """A markdown table; ratios against the better anchor (KRR-like, VPA-like) side by side."""
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
            f"| {r['policy']} | {r['oom_killed']} ({r['oom_share']:.1%}) | {r['memory_waste_gib_h']:.2f} | "
            f"{r['cpu_waste_core_h']:.2f} | {r['oom_killed'] / best_oom:.2f}x | "
            f"{r['memory_waste_gib_h'] / best_mem:.2f}x | {cpu_ratio:.2f}x |"
        )
    out.append("")
    for name, anchors in (("the closed-loop anchors", (KRR_LOOP, VPA_LOOP)), ("the backtest baselines", (KRR, VPA))):
        v = verdict(rows, anchors)
        met = all(ok for _, _, ok in v.values())
        out.append(
            f"- efficient (guaranteed) against issue 25's target with {name}: OOM-killed {v['oom'][0]} <= "
            f"{v['oom'][1]:.1f}, memory {v['memory'][0]:.2f} <= {v['memory'][1]:.2f} GiB-h, CPU "
            f"{v['cpu'][0]:.2f} <= {v['cpu'][1]:.2f} core-h: {'met' if met else 'NOT met'}"
        )
    return out


def subsets(jobs: Sequence[Job], seeds: int) -> list[tuple[str, list[Job]]]:
    """Robustness checks: each workflow system alone, the jobs in reverse name order, and shuffled
    job orders (the first-run prior learns from the jobs before, so the order matters)."""
    out: list[tuple[str, list[Job]]] = []
    for system in sorted({j.name.split("/", 1)[0] for j in jobs}):
        out.append((f"only {system}", [j for j in jobs if j.name.startswith(system + "/")]))
    out.append(("jobs in reverse name order", list(reversed(jobs))))
    for seed in range(seeds):
        shuffled = list(jobs)
        random.Random(seed).shuffle(shuffled)
        out.append((f"jobs shuffled (seed {seed})", shuffled))
    return out


def summarise(results: Sequence[dict[str, Any]]) -> list[str]:
    """One line per check: efficient (guaranteed) as ratios of issue 25's bounds (<= 1 meets)."""
    out = [
        "### Robustness: efficient (guaranteed) per check, as a share of issue 25's bound (<= 1.00 meets it)",
        "",
        "| check | OOM-killed vs half the better anchor | memory vs 0.8x the lower anchor | CPU vs VPA-like | target |",
        "|---|---|---|---|---|",
    ]
    met = 0
    for r in results:
        v = r["target"]
        ok = all(x[2] for x in v.values())
        met += ok
        cells = [f"{x[0] / x[1]:.2f}" if x[1] else ("0.00" if not x[0] else "inf") for x in v.values()]
        out.append(f"| {r['check']} | {' | '.join(cells)} | {'met' if ok else 'NOT met'} |")
    out += ["", f"met in {met} of {len(results)} checks (closed-loop anchors)."]
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data", help="the traces' directory")
    parser.add_argument("--offline", action="store_true", help="drive the core directly, no server")
    parser.add_argument("--pure-python", action="store_true", help="offline: the reference core, not the compiled")
    parser.add_argument("--robustness", action="store_true", help="also each system alone and other job orders")
    parser.add_argument("--seeds", type=int, default=3, help="shuffled job orders for --robustness")
    parser.add_argument("--results", help="write the figures as JSON here")
    parser.add_argument("--write-results", action="store_true", help="write the table into bench/RESULTS.md")
    args = parser.parse_args(argv)
    path = args.data / FILE
    if not path.exists():
        print(f"skipped: {path} is absent (the public traces are not part of the repository)")
        return 0
    if not args.offline:
        print("the live-HTTP replay is not wired yet: run with --offline", file=sys.stderr)
        return 2
    if args.pure_python:
        from service.core import _reference as core_module
    else:
        from service import core as core_module

    def make(p: Policy) -> Target:
        if p in (KRR_LOOP, VPA_LOOP):
            return Anchor(vpa=p is VPA_LOOP)
        return Offline(core_module, p)

    jobs = load(path)
    checks = [(f"public wfinstances, {len(jobs)} jobs", jobs)]
    if args.robustness:
        checks += subsets(jobs, args.seeds)
    results = []
    section = [
        "## Replay: closed loop on the public WfInstances traces (bench/replay.py)",
        "",
        "`python bench/replay.py --offline --robustness --seeds 20 --write-results` (offline: the core, no server): the core's `size_run` answers "
        "before each run, a peak above the limit is an OOM kill (not retried, its whole reservation "
        "counted as waste). Ratios against the better of the closed-loop KRR-like and VPA-like anchors "
        "(the issue's public figures come out of these; the backtest's baselines are shown too).",
        "",
    ]
    for title, subset in checks:
        rows = table_rows(subset, make)
        results.append({"check": title, "rows": rows, "target": verdict(rows)})
        lines = render(title, rows)
        print("\n".join(lines) + "\n")
        if len(results) == 1:  # RESULTS.md keeps the full table of the public set and the summary
            section += [f"### {lines[0]}", *lines[1:], ""]
    if len(results) > 1:
        summary = summarise(results)
        print("\n".join(summary) + "\n")
        section += [*summary, ""]
    if args.results:
        flat = [{"check": r["check"], **row} for r in results for row in r["rows"]]
        save(args.results, "replay", flat)
        Path(args.results).with_suffix(".detail.json").write_text(json.dumps(results, indent=2) + "\n")
    if args.write_results:
        write_results(ROOT / "bench" / "RESULTS.md", section[:-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
