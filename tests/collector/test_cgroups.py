"""``ci-sizer collect`` on real processes: the posted numbers against what the processes report
of themselves, the exit code, spooling when the sizer is unreachable or hangs, flushing later, the
collector's own share kept out, and cgroups that give no readings (nothing posted, never zeros)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from service import collector

from ..live import LiveServer, free_port

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


@contextlib.contextmanager
def v1_cgroups(name: str) -> Iterator[tuple[Path, Path]]:
    """A new memory and cpuacct cgroup (v1) below this process's own, removed afterwards."""
    found = _own_v1_dirs()
    assert found is not None
    memory, cpu = (d / f"ci-sizer-{name}-{os.getpid()}" for d in found)
    memory.mkdir()
    cpu.mkdir()
    try:
        yield memory, cpu
    finally:
        for d in (memory, cpu):
            for _ in range(50):  # the processes it held may still be exiting
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


needs_v1 = pytest.mark.skipif(
    _own_v1_dirs() is None, reason="no writable cgroup v1 memory and cpuacct hierarchies here"
)


def enter(memory: Path, cpu: Path) -> tuple[str, ...]:
    """A prefix that moves the command into the cgroups, then runs it."""
    return ("sh", "-c", f'echo $$ > {memory}/cgroup.procs && echo $$ > {cpu}/cgroup.procs && exec "$@"', "sh")


@needs_v1
def test_cgroup_v1_on_real_cgroups(tmp_path: Path) -> None:
    with v1_cgroups("workload") as (memory, cpu):
        script = tmp_path / "workload.py"
        script.write_text(WORKLOAD)
        truth_dir = tmp_path / "truth"
        truth_dir.mkdir()
        # the command moves itself into the cgroups before it starts the workload
        done = collect(
            "--url", f"http://127.0.0.1:{free_port()}", *IDENTITY, "--run-id", "9", "--interval", "0.2",
            "--retries", "0", "--spool-dir", str(tmp_path / "spool"), "--cgroup", str(memory), "--cpu-cgroup", str(cpu),
            "--", *enter(memory, cpu), sys.executable, str(script), "200", "2.5", "parent",
            env={"TRUTH_DIR": str(truth_dir)},
        )  # fmt: skip
        assert done.returncode == 3, done.stderr
        body = json.loads(next((tmp_path / "spool").glob("run-*.json")).read_text())
        check_accuracy(body, truth_dir)


@needs_v1
def test_a_cgroup_holding_the_collector_is_read_without_it(tmp_path: Path) -> None:
    # the collector itself runs in the watched cgroup: its own CPU time and memory are left out
    script, report = tmp_path / "trivial.py", tmp_path / "collector-rss"
    script.write_text(TRIVIAL)
    with v1_cgroups("self") as (memory, cpu):
        done = subprocess.run(
            [*enter(memory, cpu), sys.executable, "-m", "service", "collect", *IDENTITY, "--spool-dir", str(tmp_path / "spool"),
             "--interval", "0.1", "--cgroup", str(memory), "--cpu-cgroup", str(cpu),
             "--", sys.executable, str(script), str(report), "0.8"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    collector_rss = int(report.read_text())
    measured = json.loads(next((tmp_path / "spool").glob("run-*.json")).read_text())["containers"][0]
    assert 0 < measured["memory_peak_bytes"] < collector_rss / 2, (measured, collector_rss)


def _container_view(memory: Path, cpu: Path) -> tuple[str, ...]:
    """As Docker gives a container on a cgroup v1 host: the command in its own cgroups, each mounted
    as the root of its hierarchy, while /proc/self/cgroup still names the host's paths."""
    own = collector.own_cgroups()
    script = (
        f"echo $$ > {memory}/cgroup.procs && echo $$ > {cpu}/cgroup.procs && "
        f'mount --bind {memory} {own["memory"]} && mount --bind {cpu} {own["cpuacct"]} && exec "$@"'
    )
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh")


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or _own_v1_dirs() is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


@needs_v1
@pytest.mark.skipif(not _can_unshare(), reason="no mount namespaces here (unshare --mount)")
def test_cgroup_self_in_a_container_view(tmp_path: Path) -> None:
    # before: /sys/fs/cgroup/memory + the host path named in /proc/self/cgroup, which a container does
    # not have: every read failed and the run was posted as 0 CPU and 0 bytes
    script, report = tmp_path / "allocate.py", tmp_path / "rss"
    script.write_text(ALLOCATE)
    with v1_cgroups("view") as (memory, cpu):
        done = subprocess.run(
            [*_container_view(memory, cpu), sys.executable, "-m", "service", "collect", *IDENTITY,
             "--spool-dir", str(tmp_path / "spool"), "--interval", "0.1", "--cgroup", "self",
             "--", sys.executable, str(script), "200", "1.0", str(report)],
            capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    c = json.loads(next((tmp_path / "spool").glob("run-*.json")).read_text())["containers"][0]
    # the command's memory (the collector in the same cgroup left out), and its CPU (it touched 200 MiB)
    assert c["memory_peak_bytes"] == pytest.approx(int(report.read_text()), rel=0.15)
    assert max(c["cpu_samples_millicores"]) > 50


# /proc/PID/mountinfo and /proc/PID/cgroup as the kernel writes them (proc(5)): a Docker container on a
# cgroup v1 host (its cgroups mounted as the roots of their hierarchies), and a cgroup v2 host.
DOCKER_V1_MOUNTINFO = """\
1071 1070 0:98 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
1072 1071 0:29 /docker/3f1a /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime master:15 - cgroup cgroup rw,memory
1073 1071 0:30 /docker/3f1a /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime master:16 - cgroup cgroup rw,cpu,cpuacct
1074 1071 0:31 /docker/3f1a /sys/fs/cgroup/pids ro,nosuid,nodev,noexec,relatime master:17 - cgroup cgroup rw,pids
1075 1070 0:32 / /data\040dir rw,relatime - ext4 /dev/sda1 rw
"""
DOCKER_V1_CGROUP = (
    "12:pids:/docker/3f1a\n6:memory:/docker/3f1a\n4:cpu,cpuacct:/docker/3f1a\n1:name=systemd:/docker/3f1a\n"
)
V2_MOUNTINFO = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_cgroups_are_found_through_mountinfo() -> None:
    mounts = collector.parse_mountinfo(DOCKER_V1_MOUNTINFO)
    mine = collector.parse_proc_cgroup(DOCKER_V1_CGROUP)
    assert mine["memory"] == mine["cpuacct"] == "/docker/3f1a"
    assert collector.locate(mine["memory"], "memory", mounts) == Path("/sys/fs/cgroup/memory")
    assert collector.locate(mine["cpuacct"], "cpuacct", mounts) == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert collector.locate("/docker/3f1a/step-2", "memory", mounts) == Path("/sys/fs/cgroup/memory/step-2")
    assert collector.locate("/docker/other", "memory", mounts) is None  # not visible from this container
    assert collector.locate("/docker/3f1a", "", mounts) is None  # no cgroup v2 mount
    v2 = collector.parse_mountinfo(V2_MOUNTINFO)
    assert collector.parse_proc_cgroup("0::/ci/job-7\n") == {"": "/ci/job-7"}
    assert collector.locate("/ci/job-7", "", v2) == Path("/sys/fs/cgroup/ci/job-7")
    assert collector.locate("/ci/job-7", "memory", v2) is None
    # a later mount on the same point hides the earlier one; octal escapes in paths are undone
    shadowed = collector.parse_mountinfo(
        "40 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "63 40 0:32 /kube/pod\\040a /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    )
    assert [m.root.as_posix() for m in shadowed] == ["/kube/pod a"]
    assert collector.locate("/kube/x", "memory", shadowed) is None


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


# --------------------------------------------------------------------------- the plain install's imports


def _top_modules(code: str) -> set[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code + "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_collect_imports_only_the_standard_library(tmp_path: Path) -> None:
    # `pip install .` has no test extras (httpx) and a build image may trim the rest: the collect
    # command, CLI entry point included, imports the standard library and the package only
    baseline = _top_modules("")
    spool = str(tmp_path / "spool")
    loaded = _top_modules(
        "import sys\nfrom service.__main__ import main\n"
        f"assert main(['collect', *{list(IDENTITY)!r}, '--spool-dir', {spool!r}, '--interval', '0.1', "
        "'--', sys.executable, '-c', 'import time; time.sleep(0.3)']) == 0"
    )
    foreign = loaded - baseline - set(sys.stdlib_module_names) - {"service"}
    assert not foreign, f"collect imports {sorted(foreign)}"
    assert list((tmp_path / "spool").glob("run-*.json")), "the command was measured and its run spooled"


# --------------------------------------------------------------------------- --timeout


@pytest.fixture
def hanging_sizer() -> Iterator[str]:
    """A socket that accepts every connection and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


#: a command that gives readings (it lives a few samples), so that there is a run to post
SHORT = (sys.executable, "-c", "import time; time.sleep(0.3)")
#: what starting Python, the collector and the command take here, beyond the time spent posting
STARTUP = 3.0


def timed_collect(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = collect(*args, "--interval", "0.1", "--", *SHORT)
    return done, time.monotonic() - started


@pytest.mark.parametrize("timeout", [None, 1.5])
def test_timeout_bounds_what_a_hanging_sizer_adds(hanging_sizer: str, tmp_path: Path, timeout: float | None) -> None:
    # before --timeout: 4 attempts of 10 s each plus 7 s of backoff, 47 s added to every build
    spool = tmp_path / "spool"
    given = () if timeout is None else ("--timeout", str(timeout))
    done, took = timed_collect("--url", hanging_sizer, *IDENTITY, "--spool-dir", str(spool), *given)
    limit = 5.0 if timeout is None else timeout
    assert done.returncode == 0, done.stderr
    assert f"no answer in {limit:.1f}s" in done.stderr
    assert "the sizer is unreachable; spooled the run" in done.stderr
    assert len(list(spool.glob("run-*.json"))) == 1
    assert limit <= took < limit + STARTUP, took


def test_timeout_bounds_the_retries_on_a_refused_port(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    dead = f"http://127.0.0.1:{free_port()}"
    # 3 retries from 1 s would wait 1 + 2 + 4 s: the timeout cuts the waits short
    done, took = timed_collect("--url", dead, *IDENTITY, "--spool-dir", str(spool), "--timeout", "1.5")
    assert done.returncode == 0, done.stderr
    waits = [float(w) for w in re.findall(r"retrying in (\d+\.\d)s", done.stderr)]
    assert waits[0] == 1.0
    assert len(waits) >= 2
    assert all(w < 1.0 for w in waits[1:])  # not the doubled 2 s: what is left of the 1.5 s
    assert "the sizer is unreachable; spooled the run" in done.stderr
    assert len(list(spool.glob("run-*.json"))) == 1
    assert took < 1.5 + STARTUP, took
    bad = collect("--url", dead, *IDENTITY, "--timeout", "0", "--", "true")
    assert bad.returncode == 2
    assert "--timeout must be positive" in bad.stderr


# --------------------------------------------------------------------------- the command, not the collector

# Reports the collector's resident set (its parent's) and lives a few samples; allocates nothing.
TRIVIAL = r"""
import os, sys, time
rss = next(int(line.split()[1]) * 1024 for line in open(f"/proc/{os.getppid()}/status") if line.startswith("VmRSS:"))
open(sys.argv[1], "w").write(str(rss))
time.sleep(float(sys.argv[2]))
"""


def test_a_trivial_command_is_not_charged_the_collector(tmp_path: Path) -> None:
    # the kernel's ru_maxrss of a child starts at its parent's peak: reading it counted the collector
    spool = tmp_path / "spool"
    script, report = tmp_path / "trivial.py", tmp_path / "collector-rss"
    script.write_text(TRIVIAL)
    done = collect(*IDENTITY, "--spool-dir", str(spool), "--interval", "0.1", "--", sys.executable, str(script), str(report), "0.5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    collector_rss = int(report.read_text())
    measured = json.loads(next(spool.glob("run-*.json")).read_text())["containers"][0]["memory_peak_bytes"]
    assert 0 < measured < collector_rss / 2, (measured, collector_rss)
    # `true` ends before it can be read: then nothing is posted, and never the collector's size
    done = collect(*IDENTITY, "--spool-dir", str(tmp_path / "true"), "--", "true")
    assert done.returncode == 0, done.stderr
    for path in (tmp_path / "true").glob("run-*.json"):
        assert json.loads(path.read_text())["containers"][0]["memory_peak_bytes"] < collector_rss / 2
    if not list((tmp_path / "true").glob("run-*.json")):
        assert "gave no readings: no memory" in done.stderr


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


def test_a_command_allocating_200_mib_reports_about_that(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    script, report = tmp_path / "allocate.py", tmp_path / "rss"
    script.write_text(ALLOCATE)
    done = collect(*IDENTITY, "--spool-dir", str(spool), "--interval", "0.1", "--", sys.executable, str(script), "200", "0.6", str(report))  # fmt: skip
    assert done.returncode == 0, done.stderr
    measured = json.loads(next(spool.glob("run-*.json")).read_text())["containers"][0]["memory_peak_bytes"]
    assert measured == pytest.approx(int(report.read_text()), rel=0.1)
    assert 200 * MIB <= measured < 240 * MIB


# --------------------------------------------------------------------------- cgroups with no readings


def _v1_memory_files(directory: Path, usage: int) -> None:
    # the files of a cgroup v1 memory directory, as the kernel writes them
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (directory / "memory.stat").write_text(f"cache 0\nrss {usage}\ntotal_inactive_file 0\n")
    (directory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (directory / "memory.limit_in_bytes").write_text(f"{(1 << 63) - 4096}\n")
    (directory / "cgroup.procs").write_text("")


def test_a_v1_memory_dir_without_cpuacct_runs_the_command_and_posts_nothing(tmp_path: Path) -> None:
    # before: CPU read from a cpuacct dir that is not there (or the machine's root one), posted as 0
    memory = tmp_path / "memory" / "build"
    _v1_memory_files(memory, 300 * MIB)
    spool = tmp_path / "spool"
    done = collect(*IDENTITY, "--spool-dir", str(spool), "--cgroup", str(memory), "--", "sh", "-c", "exit 3")
    assert done.returncode == 3, done.stderr  # the command ran, and its exit code is the collector's
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"ci-sizer: no cgroup v1 cpuacct directory matches {memory} (give --cpu-cgroup); "
        "the command runs unmeasured and nothing is posted"
    ]
    assert not spool.exists()
    watched = collect(*IDENTITY, "--spool-dir", str(spool), "--cgroup", str(memory))
    assert watched.returncode == 2
    assert "no cgroup v1 cpuacct directory matches" in watched.stderr
    assert "Traceback" not in watched.stderr
    assert not spool.exists()


def test_a_cgroup_reading_zero_posts_nothing(tmp_path: Path) -> None:
    # a cgroup holding nothing (the wrong one): its files read, but 0 bytes and no CPU are not a run
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cpu.stat").write_text("usage_usec 0\n")
    (cg / "memory.current").write_text("0\n")
    (cg / "memory.stat").write_text("inactive_file 0\n")
    (cg / "memory.events").write_text("oom_kill 0\n")
    (cg / "cgroup.events").write_text("populated 0\n")
    spool = tmp_path / "spool"
    done = collect(*IDENTITY, "--cgroup", str(cg), "--interval", "0.05", "--spool-dir", str(spool))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == [f"ci-sizer: cgroup {cg} gave no readings: no memory; nothing is posted"]
    assert not spool.exists()
