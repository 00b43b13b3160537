"""Shared by the bench scripts: timing, percentiles, the machine line, and the JSON each script
leaves for ``bench/report.py`` (which writes ``bench/RESULTS.md``)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def per_call_seconds(fn: Callable[[], object], *, min_time: float = 0.05) -> float:
    """Seconds per call of ``fn``: calls in a loop sized to last ``min_time``."""
    loops = 1
    while True:
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / loops
        loops *= 2 if elapsed == 0 else max(2, min(10, int(min_time / elapsed) + 1))


def interleaved(
    candidates: dict[str, Callable[[], object]], *, rounds: int = 7, min_time: float = 0.05
) -> dict[str, float]:
    """Median seconds per call for each candidate, measured in alternating rounds so that noise
    from other work on the machine falls on all of them alike."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            samples[name].append(per_call_seconds(fn, min_time=min_time))
    return {name: statistics.median(values) for name, values in samples.items()}


def quantile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    xs = sorted(values)
    h = (len(xs) - 1) * q
    f = int(h)
    return xs[f] if f + 1 >= len(xs) else xs[f] + (h - f) * (xs[f + 1] - xs[f])


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def save(results: str | None, name: str, rows: list[dict[str, Any]], notes: list[str] | None = None) -> None:
    """Write this script's figures as JSON for ``bench/report.py``."""
    if not results:
        return
    path = Path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "bench": name,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": rows,
        "notes": notes or [],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")


def latencies(ours: dict[str, float], bare: dict[str, float], *, with_max: bool = True) -> dict[str, float]:
    """A results row's latency columns, ci-sizer's then the bare app's."""
    row: dict[str, float] = {}
    for who, figures in (("ci_sizer", ours), ("bare", bare)):
        row[f"{who}_p50_ms"] = round(figures["p50_ms"], 2)
        row[f"{who}_p99_ms"] = round(figures["p99_ms"], 2)
        if with_max:
            row[f"{who}_max_ms"] = round(figures["max_ms"], 1)
    return row


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _stats() -> list[tuple[int, int, str, float]]:
    """(pid, parent pid, name, CPU seconds used) of every process (Linux ``/proc``; empty elsewhere)."""
    found: list[tuple[int, int, str, float]] = []
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for entry in Path("/proc").glob("[0-9]*/stat") if Path("/proc").is_dir() else []:
        try:
            text = entry.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        found.append((int(entry.parent.name), int(fields[1]), name, (int(fields[11]) + int(fields[12])) / tick))
    return found


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """CPU seconds used so far by these processes with their children (uvicorn's workers), and by
    PostgreSQL's processes (the server and its backends)."""
    stats = _stats()
    mine = set(pids)
    mine |= {pid for pid, parent, _, _ in stats if parent in mine}
    return (
        sum(cpu for pid, _, _, cpu in stats if pid in mine),
        sum(cpu for _, _, name, cpu in stats if name == "postgres"),
    )
