"""``ci-sizer collect`` on real processes: the posted numbers against what the processes report
of themselves, the exit code, spooling when the sizer is unreachable, and flushing later."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from service import collector

from .live import LiveServer, free_port

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


def test_unreachable_sizer_spools_then_flush_sends(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    dead = f"http://127.0.0.1:{free_port()}"
    done, truth_dir = run_workload(
        tmp_path, "--url", dead, *IDENTITY, "--run-id", "7", "--interval", "0.2", "--retries", "1",
        "--backoff", "0.1", "--spool-dir", str(spool),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr  # the command's exit code, not the collector's trouble
    assert "spooled the run to" in done.stderr
    files = list(spool.glob("run-*.json"))
    assert len(files) == 1
    body = json.loads(files[0].read_text())
    assert (body["org"], body["job"], body["run_id"]) == ("acme", "build", "7")
    check_accuracy(body, truth_dir)

    with LiveServer(f"sqlite:///{tmp_path / 'sizer.db'}") as server:
        flushed = collect("--flush", str(spool), "--url", server.url)
        assert flushed.returncode == 0, flushed.stderr
        assert not list(spool.glob("run-*.json"))
        again = httpx.post(server.url + "/api/v1/runs", json=body)
        assert again.json()["result"] == "duplicate"  # the flushed run is the stored one
        observed = httpx.get(server.url + "/api/v1/sizing/acme/web/ci.yml/build").json()["containers"][0]
        assert observed["observed"]["memory_bytes"] == body["containers"][0]["memory_peak_bytes"]


def test_posts_to_a_live_sizer(tmp_path: Path) -> None:
    with LiveServer(f"sqlite:///{tmp_path / 'sizer.db'}") as server:
        done, truth_dir = run_workload(tmp_path, "--url", server.url, *IDENTITY, "--run-id", "8", "--interval", "0.2")
        assert done.returncode == 3, done.stderr
        assert "posted run 8" in done.stderr
        answer = httpx.get(server.url + "/api/v1/sizing/acme/web/ci.yml/build").json()
        assert answer["meta"]["clean_samples"] == 1
        _, peak = truth(truth_dir)
        assert answer["containers"][0]["observed"]["memory_bytes"] == pytest.approx(peak, rel=0.15)


def test_flush_keeps_what_it_cannot_send(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    collector.spool(spool, {"org": "a"})
    done = collect("--flush", str(spool), "--url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert len(list(spool.glob("run-*.json"))) == 1


def test_exit_codes_pass_through(tmp_path: Path) -> None:
    spool = ("--spool-dir", str(tmp_path / "spool"))
    assert collect(*IDENTITY, *spool, "--", sys.executable, "-c", "raise SystemExit(42)").returncode == 42
    assert collect(*IDENTITY, *spool, "--", "/nonexistent/tool").returncode == 127
    killed = collect(
        *IDENTITY, *spool, "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    )
    assert killed.returncode == 128 + 9


def test_no_identity_is_a_clear_error(tmp_path: Path) -> None:
    clean = dict.fromkeys(("GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "JENKINS_URL"), "")
    done = collect("--", "true", env=clean)
    assert done.returncode == 2
    assert "no --org, --repo, --workflow, --job given" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/web", "GITHUB_REPOSITORY_OWNER": "acme",
             "GITHUB_WORKFLOW_REF": "acme/web/.github/workflows/ci.yml@refs/heads/main", "GITHUB_JOB": "build",
             "GITHUB_RUN_ID": "99", "GITHUB_RUN_ATTEMPT": "2"},
            ("acme", "web", ".github/workflows/ci.yml", "build", "99-2"),
        ),
        (
            {"GITLAB_CI": "true", "CI_PROJECT_NAMESPACE": "acme/platform", "CI_PROJECT_NAME": "web",
             "CI_JOB_NAME": "test 1/3", "CI_JOB_ID": "555"},
            ("acme/platform", "web", ".gitlab-ci.yml", "test 1/3", "555"),
        ),
        (
            {"BUILDKITE": "true", "BUILDKITE_ORGANIZATION_SLUG": "acme", "BUILDKITE_PIPELINE_SLUG": "web",
             "BUILDKITE_STEP_KEY": "build", "BUILDKITE_JOB_ID": "0190-ab", "BUILDKITE_RETRY_COUNT": "1"},
            ("acme", "web", "pipeline.yml", "build", "0190-ab-1"),
        ),
        (
            {"JENKINS_URL": "https://ci", "JOB_NAME": "acme/web/main", "STAGE_NAME": "Build",
             "BUILD_TAG": "jenkins-acme-web-main-12"},
            ("acme", "web", "Jenkinsfile", "Build", "jenkins-acme-web-main-12"),
        ),
    ],
)  # fmt: skip
def test_identity_from_ci_environments(env: dict[str, str], expected: tuple[str, ...]) -> None:
    found = collector.identity_from_env(env)
    assert (found["org"], found["repo"], found["workflow"], found["job"], found["run_id"]) == expected


def test_cgroup_v2_files(tmp_path: Path) -> None:
    # the files of a cgroup v2 directory, as the kernel writes them
    (tmp_path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (tmp_path / "memory.current").write_text(str(900 * MIB) + "\n")
    (tmp_path / "memory.stat").write_text(f"anon {600 * MIB}\nfile {300 * MIB}\ninactive_file {200 * MIB}\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    source = collector.cgroup_source(str(tmp_path))
    assert isinstance(source, collector.CgroupV2)
    r = source.read()
    assert r.cpu_seconds == 2.5
    assert r.working_set_bytes == 700 * MIB  # current minus inactive_file, as the kubelet counts it
    assert r.oom_kills == 1
    assert r.limit_bytes is None
    assert not source.alive()
    (tmp_path / "memory.max").write_text(str(1024 * MIB))
    assert source.read().limit_bytes == 1024 * MIB


def _own_v1_dirs() -> tuple[Path, Path] | None:
    """This process's cgroup v1 memory and cpuacct directories, when a child cgroup can be made in each."""
    try:
        own = collector.own_cgroups()
        memory, cpu = own["memory"], own["cpuacct"]
        for d in (memory, cpu):
            probe = d / f"ci-sizer-probe-{os.getpid()}"
            probe.mkdir()
            probe.rmdir()
        return memory, cpu
    except (OSError, KeyError, ValueError):
        return None


@pytest.mark.skipif(_own_v1_dirs() is None, reason="no writable cgroup v1 memory and cpuacct hierarchies here")
def test_cgroup_v1_on_real_cgroups(tmp_path: Path) -> None:
    found = _own_v1_dirs()
    assert found is not None
    memory = found[0] / f"ci-sizer-test-{os.getpid()}"
    cpu = found[1] / f"ci-sizer-test-{os.getpid()}"
    memory.mkdir()
    cpu.mkdir()
    try:
        script = tmp_path / "workload.py"
        script.write_text(WORKLOAD)
        truth_dir = tmp_path / "truth"
        truth_dir.mkdir()
        # the command moves itself into the cgroups before it starts the workload
        enter = f'echo $$ > {memory}/cgroup.procs && echo $$ > {cpu}/cgroup.procs && exec "$@"'
        done = collect(
            "--url", f"http://127.0.0.1:{free_port()}", *IDENTITY, "--run-id", "9", "--interval", "0.2",
            "--retries", "0", "--spool-dir", str(tmp_path / "spool"), "--cgroup", str(memory), "--cpu-cgroup", str(cpu),
            "--", "sh", "-c", enter, "sh", sys.executable, str(script), "200", "2.5", "parent",
            env={"TRUTH_DIR": str(truth_dir)},
        )  # fmt: skip
        assert done.returncode == 3, done.stderr
        body = json.loads(next((tmp_path / "spool").glob("run-*.json")).read_text())
        check_accuracy(body, truth_dir)
    finally:
        for d in (memory, cpu):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    import time

                    time.sleep(0.1)


def test_watching_a_cgroup_ends_when_it_empties(tmp_path: Path) -> None:
    # beside a build (no command): sample the cgroup until it has no processes left, then report
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cpu.stat").write_text("usage_usec 1000000\n")
    (cg / "memory.current").write_text(str(500 * MIB))
    (cg / "memory.stat").write_text(f"inactive_file {100 * MIB}\n")
    (cg / "memory.events").write_text("oom_kill 0\n")
    (cg / "memory.max").write_text(str(1024 * MIB))
    (cg / "cgroup.events").write_text("populated 0\n")
    spool = tmp_path / "spool"
    done = collect(*IDENTITY, "--run-id", "w", "--cgroup", str(cg), "--interval", "0.05", "--spool-dir", str(spool))
    assert done.returncode == 0, done.stderr
    body = json.loads(next(spool.glob("run-*.json")).read_text())
    c = body["containers"][0]
    assert c["memory_peak_bytes"] == 400 * MIB
    assert c["memory_limit_bytes"] == 1024 * MIB
    assert c["oom_kill_events"] == 0
