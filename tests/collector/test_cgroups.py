"""``ci-sizer collect`` on cgroups: v2 files, real v1 cgroups (the collector's own share left out),
the container view found through mountinfo, watching a cgroup until it empties, and cgroups that
give no readings (nothing posted, never zeros)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.collector.mounts import locate, own_cgroups, parse_mountinfo, parse_proc_cgroup
from service.collector.sources import CgroupV2, cgroup_source

from ..live import free_port
from .helpers import ALLOCATE, IDENTITY, MIB, TRIVIAL, WORKLOAD, check_accuracy, collect


def test_cgroup_v2_files(tmp_path: Path) -> None:
    # the files of a cgroup v2 directory, as the kernel writes them
    (tmp_path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (tmp_path / "memory.current").write_text(str(900 * MIB) + "\n")
    (tmp_path / "memory.stat").write_text(f"anon {600 * MIB}\nfile {300 * MIB}\ninactive_file {200 * MIB}\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    source = cgroup_source(str(tmp_path))
    assert isinstance(source, CgroupV2)
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
        own = own_cgroups()
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
    own = own_cgroups()
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
    mounts = parse_mountinfo(DOCKER_V1_MOUNTINFO)
    mine = parse_proc_cgroup(DOCKER_V1_CGROUP)
    assert mine["memory"] == mine["cpuacct"] == "/docker/3f1a"
    assert locate(mine["memory"], "memory", mounts) == Path("/sys/fs/cgroup/memory")
    assert locate(mine["cpuacct"], "cpuacct", mounts) == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert locate("/docker/3f1a/step-2", "memory", mounts) == Path("/sys/fs/cgroup/memory/step-2")
    assert locate("/docker/other", "memory", mounts) is None  # not visible from this container
    assert locate("/docker/3f1a", "", mounts) is None  # no cgroup v2 mount
    v2 = parse_mountinfo(V2_MOUNTINFO)
    assert parse_proc_cgroup("0::/ci/job-7\n") == {"": "/ci/job-7"}
    assert locate("/ci/job-7", "", v2) == Path("/sys/fs/cgroup/ci/job-7")
    assert locate("/ci/job-7", "memory", v2) is None
    # a later mount on the same point hides the earlier one; octal escapes in paths are undone
    shadowed = parse_mountinfo(
        "40 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "63 40 0:32 /kube/pod\\040a /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    )
    assert [m.root.as_posix() for m in shadowed] == ["/kube/pod a"]
    assert locate("/kube/x", "memory", shadowed) is None


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
