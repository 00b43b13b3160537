"""What the collector tests share: the workloads they wrap (each reports what it used of itself), the
``collect`` command run as a runner runs it, and the accuracy check against the workload's own report."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

MIB = 1 << 20
# A build: starts a second process, both allocate and touch memory, both burn CPU and hold their
# memory to the end; each reports its own CPU time and resident set (at the end) to TRUTH_DIR.
WORKLOAD = r"""
import json, os, subprocess, sys, time
mib, seconds, child = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "child"
kid = None if child else subprocess.Popen([sys.executable, __file__, str(mib // 2), sys.argv[2], "child"])
blob = bytearray(mib * 2**20)
for i in range(0, len(blob), 4096):
    blob[i] = 1
end = time.time() + seconds
while time.time() < end:
    pass
rss = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmRSS:"))
if kid is not None:
    kid.wait()
with open(os.path.join(os.environ["TRUTH_DIR"], f"{os.getpid()}.json"), "w") as f:
    json.dump({"cpu": time.process_time(), "rss": rss}, f)
sys.exit(0 if child else 3)
"""


def truth(directory: Path) -> tuple[float, int]:
    reports = [json.loads(p.read_text()) for p in directory.glob("*.json")]
    assert len(reports) == 2
    # both processes hold their memory until the end: the tree's peak is the sum
    return sum(r["cpu"] for r in reports), sum(r["rss"] for r in reports)


def collect(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service", "collect", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def run_workload(tmp_path: Path, *collect_args: str, mib: int = 200, seconds: float = 2.5) -> tuple[Any, Path]:
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    truth_dir = tmp_path / "truth"
    truth_dir.mkdir()
    done = collect(
        *collect_args,
        "--",
        sys.executable,
        str(script),
        str(mib),
        str(seconds),
        "parent",
        env={"TRUTH_DIR": str(truth_dir)},
    )
    return done, truth_dir


def check_accuracy(body: dict[str, Any], truth_dir: Path) -> None:
    cpu_seconds, peak = truth(truth_dir)
    c = body["containers"][0]
    duration = (
        datetime.fromisoformat(body["finished_at"].replace("Z", "+00:00"))
        - datetime.fromisoformat(body["started_at"].replace("Z", "+00:00"))
    ).total_seconds()
    measured_cpu = statistics.fmean(c["cpu_samples_millicores"]) / 1000 * duration
    assert measured_cpu == pytest.approx(cpu_seconds, rel=0.15), (measured_cpu, cpu_seconds)
    assert c["memory_peak_bytes"] == pytest.approx(peak, rel=0.15), (c["memory_peak_bytes"], peak)


IDENTITY = ("--org", "acme", "--repo", "web", "--workflow", "ci.yml", "--job", "build")


# Reports the collector's resident set (its parent's) and lives a few samples; allocates nothing.
TRIVIAL = r"""
import os, sys, time
rss = next(int(line.split()[1]) * 1024 for line in open(f"/proc/{os.getppid()}/status") if line.startswith("VmRSS:"))
open(sys.argv[1], "w").write(str(rss))
time.sleep(float(sys.argv[2]))
"""


# Allocates and touches MIB, holds it for SECONDS, reports its own resident set at the end.
ALLOCATE = r"""
import sys, time
blob = bytearray(int(sys.argv[1]) * 2**20)
for i in range(0, len(blob), 4096):
    blob[i] = 1
time.sleep(float(sys.argv[2]))
rss = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmRSS:"))
open(sys.argv[3], "w").write(str(rss))
"""
