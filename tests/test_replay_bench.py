"""bench/replay.py (issue 25): the live closed loop through a real ``python -m service serve``
gives, for the seed and the efficient policy (both QoS), exactly the figures of the offline loop over
the core, the efficient policy's first-run prior (stored by the server) included; and the script
skips with a message when the traces are absent.

The traces here are synthetic, written in the test's directory in the shape of the public
``wfinstances-runs.csv.gz`` (the real data never enters the repository).
"""

from __future__ import annotations

import csv
import gzip
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "replay.py"
COLUMNS = (
    "job",
    "instance",
    "executed_at",
    "task_id",
    "runtime_s",
    "core_count",
    "cpu_mean_millicores",
    "mem_peak_bytes",
    "machine",
)
MB = 1_000_000
FIGURES = ("runs", "oom_killed", "memory_waste_gib_h", "cpu_waste_core_h")


def write_traces(directory: Path) -> Path:
    """Three replayed jobs of 12 runs and one of 5 (under the ten runs a replayed job needs).
    Peaks wander around each job's level with one spike of 3x: the seed's limits must let some
    runs be killed, so that the kill path (clipped peak, ``oom_killed``) is part of what is compared."""
    rng = random.Random(25)
    rows = []
    for job, level, runs in (
        ("Sys/flow/align", 300 * MB, 12),
        ("Sys/flow/merge", 1200 * MB, 12),
        ("Other/wf/split", 40 * MB, 12),
        ("Other/wf/tiny", 10 * MB, 5),
    ):
        for n in range(runs):
            spike = 3 if n == 7 else 1
            rows.append(
                {
                    "job": job,
                    "instance": f"{job.split('/')[1]}-{n // 4:03d}.json",
                    "executed_at": f"2021-01-{1 + n // 4:02d}T10:00:00+00:00",
                    "task_id": f"t_ID{n:06d}",
                    "runtime_s": f"{rng.uniform(5, 900):.6f}",
                    "core_count": "1",
                    "cpu_mean_millicores": f"{rng.uniform(50, 1900):.1f}",
                    "mem_peak_bytes": str(int(level * rng.uniform(0.7, 1.3)) * spike),
                    "machine": "worker-1",
                }
            )
    path = directory / "wfinstances-runs.csv.gz"
    with gzip.open(path, "wt", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rng.sample(rows, len(rows)))  # file order is not run order: the script sorts
    return path


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


def live_setup(tmp_path: Path, database: str, request: pytest.FixtureRequest) -> tuple[tuple[str, ...], Path, Path]:
    """A live replay's database flags (none: SQLite), its traces' folder and a RESULTS.md holding another
    bench's section, which the replay must keep."""
    on = () if database == "sqlite" else ("--database-url", request.getfixturevalue("postgres_server").url)
    data = tmp_path / "data"
    data.mkdir()
    write_traces(data)
    md = tmp_path / "RESULTS.md"
    md.write_text("# Benchmark results\n\n## Other bench\n\nkept as it is\n")
    return on, data, md


@pytest.mark.ci  # the CI tier (README): the public traces replayed through a live server
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_live_equals_offline(tmp_path: Path, database: str, request: pytest.FixtureRequest) -> None:
    on, data, md = live_setup(tmp_path, database, request)

    live = replay(
        *on, "--data", str(data), "--check-offline",
        "--results-md", str(md), "--results", str(tmp_path / "live.json"),
    )  # fmt: skip
    assert live.returncode == 0, live.stdout + live.stderr
    offline = replay("--offline", "--data", str(data), "--results", str(tmp_path / "offline.json"))
    assert offline.returncode == 0, offline.stdout + offline.stderr

    live_rows = {r["policy"]: r for r in json.loads((tmp_path / "live.json").read_text())["rows"]}
    offline_rows = {r["policy"]: r for r in json.loads((tmp_path / "offline.json").read_text())["rows"]}
    for label in ("seed (guaranteed)", "seed (burstable)", "efficient (guaranteed)", "efficient (burstable)"):
        served = label.split(" ")[0]
        assert live_rows[label]["source"] == f"live, meta.policy {served}", live_rows[label]
        assert live_rows[label]["runs"] == 36  # three jobs of 12 runs; the job of 5 runs is not replayed
        assert {f: live_rows[label][f] for f in FIGURES} == {f: offline_rows[label][f] for f in FIGURES}
    # the comparison covers killed runs (posted as OOM kills, peak clipped at the limit)
    assert live_rows["seed (guaranteed)"]["oom_killed"] >= 1
    assert live_rows["efficient (guaranteed)"]["oom_killed"] >= 1
    # the policies differ: the comparison would see a server that answered one for the other
    assert (
        live_rows["efficient (guaranteed)"]["memory_waste_gib_h"]
        != live_rows["seed (guaranteed)"]["memory_waste_gib_h"]
    )
    # burstable requests no more memory than guaranteed (S16): less or equal waste, same limits
    assert live_rows["seed (burstable)"]["memory_waste_gib_h"] <= live_rows["seed (guaranteed)"]["memory_waste_gib_h"]
    # the anchors are not served policies: their rows come from the offline loop and say so
    anchors = [r for r in live_rows.values() if not r["policy"].startswith(("seed", "efficient"))]
    assert anchors
    assert all(r["source"] == "offline loop: not a served policy" for r in anchors)
    assert "check-offline: live == offline" in live.stdout

    text = md.read_text()
    assert "## Other bench\n\nkept as it is\n" in text
    assert text.count("## Replay: closed loop through the live HTTP API") == 1
    assert "| seed (guaranteed) (live" in text


def script() -> Any:
    """bench/replay.py as a module."""
    from importlib import util

    spec = util.spec_from_file_location("replay_script", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = util.module_from_spec(spec)
    saved = list(sys.path)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)  # the script puts the repository root first on sys.path
    finally:
        sys.path[:] = saved
        del sys.modules[spec.name]
    return module


def test_rerun_replaces_its_section_only(tmp_path: Path) -> None:
    module = script()
    md = tmp_path / "RESULTS.md"
    md.write_text("# Benchmark results\n\n## A\n\na\n\n" + module.LIVE_HEADING + "\n\nold table\n\n## B\n\nb\n")
    module.write_results(md, [module.LIVE_HEADING, "", "new table"])
    assert (
        md.read_text() == "# Benchmark results\n\n## A\n\na\n\n" + module.LIVE_HEADING + "\n\nnew table\n\n## B\n\nb\n"
    )


@pytest.mark.parametrize("mode", [(), ("--offline",)], ids=["live", "offline"])
def test_skips_with_a_message_when_the_data_is_absent(tmp_path: Path, mode: tuple[str, ...]) -> None:
    md = tmp_path / "RESULTS.md"
    done = replay(*mode, "--data", str(tmp_path / "nowhere"), "--results-md", str(md))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("skipped: ")
    assert str(tmp_path / "nowhere" / "wfinstances-runs.csv.gz") in done.stdout
    assert "absent" in done.stdout
    assert not md.exists()


def test_robustness_protocol_is_offline_and_reports_every_case(tmp_path: Path) -> None:
    # issue 35: --robustness alone (no --offline, no server) replays each case of the protocol
    data = tmp_path / "data"
    data.mkdir()
    write_traces(data)
    done = replay(
        "--robustness", "--seeds", "2", "--explain-kills", "--data", str(data), "--results", str(tmp_path / "r.json")
    )
    assert done.returncode in (0, 3), done.stdout + done.stderr  # 3: a case misses the target
    detail = json.loads((tmp_path / "r.detail.json").read_text())
    cases = [c["check"] for c in detail["robustness"]]
    # first 60 and every run, each: name order, 2 shuffled orders, each of the two systems alone and without it
    assert len(cases) == 2 * (1 + 2 + 2 * 2)
    assert "every run, without Other" in cases
    assert "first 60 runs, only Sys" in cases
    for c in detail["robustness"]:
        assert {r["policy"] for r in c["rows"]} == {
            "efficient (guaranteed)", "efficient (guaranteed) + growth",
            "KRR-like, closed loop (max peak + 15 %, p95 CPU)",
            "VPA-like, closed loop (p90 of peaks + 15 %, x1.2 after OOM)",
        }  # fmt: skip
        assert c["met"] == all(c["target"][t][2] for t in ("oom", "memory", "cpu"))
    assert done.returncode == (0 if all(c["met"] for c in detail["robustness"]) else 3)
    assert "cases meeting it" in done.stdout
    # the kill reading adds up to the table's kills for efficient (guaranteed)
    public = {r["policy"]: r for r in detail["public"]}
    section = done.stdout.split("### Where efficient (guaranteed)'s kills come from: public")[1].split("###")[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| first run") or
            line.startswith(("| after", "| learning", "| confident"))]  # fmt: skip
    assert sum(int(r[3]) for r in rows) == public["efficient (guaranteed)"]["oom_killed"]
    assert sum(int(r[2]) for r in rows) == public["efficient (guaranteed)"]["runs"]


def test_offline_loop_forgets_only_what_no_answer_reads() -> None:
    # the offline loop drops the runs before the newest samples an answer may read: the same answers,
    # kills and wastes as over the whole history, on a job long enough to be cut many times
    module = script()
    from service import core

    rng = random.Random(35)
    tasks = tuple(
        module.Task(rng.uniform(5, 900), rng.uniform(50, 1900), int(300 * MB * rng.choice([0.7, 1, 1, 1.3, 2.5])))
        for _ in range(400)
    )
    jobs = [module.Job("Sys/flow/long", tasks)]
    for p in (*module.POLICIES[:4], module.EFFICIENT_GROW, module.Policy("growth", "growth")):
        cut, whole = module.Offline(core, p), module.Offline(core, p)
        whole.keep = 10**9
        a, b = module.replay(jobs, cut, p), module.replay(jobs, whole, p)
        assert a.answers == b.answers, p.label
        assert a.row() == b.row(), p.label
        assert len(cut.jobs[jobs[0].key].clean) < 4 * cut.keep < len(tasks)  # it was cut
    assert any(module.replay(jobs, module.Offline(core, p), p).killed for p in module.POLICIES[:4])
