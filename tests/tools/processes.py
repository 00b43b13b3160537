"""Where a test run's CPU goes, by process (issue 36): ``python tests/tools/processes.py -- CMD ...``.

Runs CMD (say ``python -m pytest -q -m ci``) with a ``sitecustomize`` on ``PYTHONPATH`` that notes the
command line of every Python process it starts (the xdist workers, each ``ci-sizer serve``, each CLI
run, the benches), then prints how many of each kind ran. As root, with Debian's ``acct`` installed
(``accton``, ``dump-acct``), the kernel's process accounting also gives each process's CPU time, and
the table gives CPU-seconds per kind beside the other programs (PostgreSQL's backends, Chromium,
kubectl, gcc). Accounting sees the whole machine: run it with nothing else going on. Without it, the
counts alone: how many servers started and migrations ran.

Measured with it on 2 cores (2026-11-27, before ``migrate`` stopped importing the app): the README's
command as .ci/run runs it (every property in full) used 708 CPU-s in 405 s, of which the four workers
400, PostgreSQL 81 (6,252 backends, one per connection), 41 live servers 92; the CI tier 630 CPU-s in
322 s, of which the workers 196, 35 live servers 143, Chromium 76, 8 ``migrate`` runs 29.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: every run of this tool in progress (one inside another: the suite's own test of it, under
#: ``processes.py -- python -m pytest``): each Python process is noted in each of their logs
LOGS = "CI_SIZER_PROCESSES_LOGS"

HOOK = """\
import json, os, sys
line = json.dumps([os.getpid(), list(sys.orig_argv)]) + "\\n"
for log in os.environ.get("CI_SIZER_PROCESSES_LOGS", "").split(os.pathsep):
    try:
        with open(log, "a") as f:
            f.write(line)
    except Exception:
        pass
"""


def kind(argv: list[str]) -> str:
    """A process's kind from its command line, with paths and ports left out."""
    args = argv[1:]
    if args[:2] == ["-u", "-c"]:  # execnet's bootstrap (xdist)
        return "pytest: xdist worker"
    if "pytest" in args[:2]:
        return "pytest: the run"
    if "spawn_main" in " ".join(args):
        return "multiprocessing child (uvicorn --workers, process pools)"
    command = [a for a in args if not a.startswith("-")]
    if Path(argv[0]).name == "ci-sizer":
        command = ["service", *command]
    if command[:1] == ["service"] and len(command) > 1:
        # `ci-sizer token --help` names no subcommand
        sub = command[2:3] if command[1] in ("token", "webhook") else []
        return " ".join(["ci-sizer", command[1], *sub])
    if command and command[0].endswith(".py"):
        return f"script {Path(command[0]).name}"
    return "python " + " ".join(args[:2]).replace("\n", " ")[:60]


def accounted(path: Path) -> list[tuple[str, int, float]]:
    """(command name, pid, CPU seconds) of every process ended while accounting was on."""
    out = subprocess.run(["dump-acct", str(path)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        rows.append((f[0], int(f[9]), (float(f[2]) + float(f[3])) / 100))  # user + system, in ticks of 10 ms
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: processes.py -- python -m pytest -q")
    work = Path(tempfile.mkdtemp(prefix="ci-sizer-processes-"))
    log, acct = work / "python.jsonl", work / "acct"
    (work / "sitecustomize.py").write_text(HOOK)
    outer = os.environ.get(LOGS, "")
    # the kernel keeps one accounting file: a run inside another leaves it to the outer one (switching it
    # would end the outer run's accounting), and gives counts only
    accounting = (
        not outer and os.geteuid() == 0 and shutil.which("accton") is not None and shutil.which("dump-acct") is not None
    )
    if accounting:
        acct.touch()
        subprocess.run(["accton", str(acct)], check=True, capture_output=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(work), os.environ.get("PYTHONPATH")])),
        LOGS: os.pathsep.join(filter(None, [outer, str(log)])),
    }
    try:
        code = subprocess.run(command, env=env, check=False).returncode
    finally:
        if accounting:
            subprocess.run(["accton", "off"], check=False, capture_output=True)
    kinds = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        pid, orig = json.loads(line)
        kinds[pid] = kind(orig)
    count: collections.Counter[str] = collections.Counter(kinds.values())
    cpu: dict[str, float] = collections.defaultdict(float)
    if accounting:
        for name, pid, seconds in accounted(acct):
            label = kinds.get(pid) or (name if not name.startswith("python") else "python (not noted)")
            cpu[label] += seconds
            if pid not in kinds:
                count[label] += 1
    print("\n" + ("  CPU-s " if accounting else "") + "processes  kind", file=sys.stderr)
    for label in sorted(cpu, key=cpu.__getitem__, reverse=True) if cpu else [k for k, _ in count.most_common()]:
        figure = f"{cpu[label]:7.1f} " if accounting else ""
        print(f"{figure}{count[label]:>9}  {label}", file=sys.stderr)
    if accounting:
        print(f"{sum(cpu.values()):7.1f} {sum(count.values()):>9}  in all", file=sys.stderr)
    else:
        why = "a run inside another leaves it to the outer one" if outer else "it needs root and Debian's acct"
        print(f"(no CPU times from process accounting: {why})", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
