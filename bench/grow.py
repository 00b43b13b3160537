"""How fast may a build allocate and still be grown before the kernel kills it? (``ci-sizer collect --grow``)

A build maps and touches memory (MAP_POPULATE, 4 MiB at a time) at a set rate up to 600 MiB, from a limit
of 256 MiB that the guard may grow to 1 GiB by 128 MiB at 90 % (the contract's threshold). Each rate is
tried a few times with the local actuator on a real cgroup, watched three ways:

- ``notify``: polling every 10 ms and woken by cgroup v1's usage threshold eventfd (the default on v1);
- ``poll 10ms``: polling alone every 10 ms (the default where there is no notification: cgroup v2, pods);
- ``poll 100ms``: polling alone at the slowest ``--grow-poll`` allows.

Rates are reported beside the baseline run in the same run: the fastest this machine allocates at all
(one 600 MiB MAP_POPULATE with no cgroup limit). ``max`` is that same single mmap under the guard. The
Kubernetes actuator adds the kubelet's time to actuate a resize; it catches a build whose rate is below
headroom / that time (with a 256 MiB limit at 90 %: 25.6 MiB per second of kubelet latency).

Needs root and a writable cgroup memory controller (v1 here). Run: ``python bench/grow.py [--trials 3]``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # bench/http.py would shadow http

from tests.growth.helpers import ALLOCATE  # the build the tests grow

MIB = 1 << 20
LIMIT, MAX, STEP, THRESHOLD, TOTAL = 256 * MIB, 1024 * MIB, 128 * MIB, 90, 600

WAYS = {"notify": ["--grow-poll", "0.01"], "poll 10ms": ["--grow-poll", "0.01", "--no-grow-notify"],
        "poll 100ms": ["--grow-poll", "0.1", "--no-grow-notify"]}  # fmt: skip


def baseline(script: Path, trials: int) -> float:
    """The fastest this machine allocates: one 600 MiB populate, no limit (MiB/s, the best of ``trials``)."""
    best = 0.0
    for _ in range(trials):
        out = subprocess.run(
            [sys.executable, str(script), str(TOTAL), "0", str(TOTAL), "0"], capture_output=True, text=True, check=True
        )
        best = max(best, float(out.stdout))
    return best


def trial(work: Path, script: Path, answer: Path, way: list[str], rate: float) -> tuple[bool, float]:
    """(caught: the build finished, its achieved MiB/s)."""
    chunk = TOTAL if rate == 0 else 4
    done = subprocess.run(
        [sys.executable, "-m", "service", "collect", "--org", "bench", "--repo", "grow", "--workflow", "w", "--job", "j",
         "--spool-dir", str(work / "spool"), "--interval", "0.5", "--grow", "--grow-with", "cgroup",
         "--answer", str(answer), *way, "--", sys.executable, str(script), str(TOTAL), str(rate), str(chunk), "0"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    caught = done.returncode == 0
    achieved = float(done.stdout) if caught and done.stdout.strip() else float("nan")
    return caught, achieved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--rates", default="100,200,400,800,1600,0", help="MiB/s; 0 is as fast as the kernel faults pages in"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/grow.py needs root (a cgroup of its own for each build)")
    rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        script = work / "allocate.py"
        script.write_text(ALLOCATE)
        answer = work / "answer.json"
        answer.write_text(json.dumps({"containers": [{"name": "build", "memory": {"limit_bytes": LIMIT},
                          "grow": {"max_bytes": MAX, "threshold_percent": THRESHOLD, "step_bytes": STEP}}]}))  # fmt: skip
        fastest = baseline(script, args.trials)
        print(f"baseline: one {TOTAL} MiB MAP_POPULATE, no limit: {fastest:.0f} MiB/s (best of {args.trials})")
        print(f"the guard: limit {LIMIT // MIB} MiB, up to {MAX // MIB} MiB by {STEP // MIB} MiB at {THRESHOLD}%, "
              f"{TOTAL} MiB allocated 4 MiB at a time; caught = finished, of {args.trials}\n")  # fmt: skip
        print(f"{'rate':>10} {'x baseline':>10} | " + " | ".join(f"{w:>20}" for w in WAYS))
        best: dict[str, float] = dict.fromkeys(WAYS, 0.0)
        for rate in rates:
            cells = []
            for name, way in WAYS.items():
                results = [trial(work, script, answer, way, rate) for _ in range(args.trials)]
                caught = sum(c for c, _ in results)
                achieved = max((a for c, a in results if c), default=float("nan"))
                cells.append(
                    f"{caught}/{args.trials} ({achieved:5.0f} MiB/s)" if caught else f"0/{args.trials} (killed)"
                )
                if caught == args.trials:
                    best[name] = max(best[name], achieved)
            label = "max" if rate == 0 else f"{rate:.0f}"
            ratio = "" if rate == 0 else f"{rate / fastest:.2f}"
            print(f"{label:>10} {ratio:>10} | " + " | ".join(f"{c:>20}" for c in cells), flush=True)
            time.sleep(0.2)
        print("\nfastest rate caught in every trial:")
        for name, rate in best.items():
            print(f"  {name:>10}: {rate:.0f} MiB/s ({rate / fastest:.2f}x the baseline)")


if __name__ == "__main__":
    main()
