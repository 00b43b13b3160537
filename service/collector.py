"""``ci-sizer collect``: measure a build and post the run, without a server of its own.

Wraps a command (``ci-sizer collect -- make build``) or watches a cgroup (``--cgroup PATH``),
samples CPU and memory every ``--interval`` seconds, and posts the run at the end. It exits with
the wrapped command's exit code and never fails the build because the sizer is unreachable: it
retries with backoff, then spools the payload to a file and says so (``--flush DIR`` sends
spooled runs later).

Sources, best first:

- cgroup v2 (``cpu.stat`` usage_usec, ``memory.current`` minus ``memory.stat`` inactive_file,
  ``memory.events`` oom_kill, ``memory.max``);
- cgroup v1 (``cpuacct.usage``, ``memory.usage_in_bytes`` minus total_inactive_file,
  ``memory.oom_control`` oom_kill, ``memory.limit_in_bytes``);
- the wrapped command's process tree from ``/proc`` (CPU time of the tree, including reaped
  children; memory as the sum of the processes' proportional set sizes).

Memory is the working set, as the kubelet counts it, not a peak that includes page cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
CGROOT = Path("/sys/fs/cgroup")


# --------------------------------------------------------------------------- sources


@dataclass
class Reading:
    cpu_seconds: float  #: cumulative CPU time of what is measured
    working_set_bytes: int
    oom_kills: int | None = None
    limit_bytes: int | None = None


def _kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


class CgroupV2:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> Reading:
        usage = _kv(self.path / "cpu.stat")["usage_usec"] / 1e6
        current = int((self.path / "memory.current").read_text())
        inactive = _kv(self.path / "memory.stat").get("inactive_file", 0)
        events = self.path / "memory.events"
        oom = _kv(events).get("oom_kill") if events.exists() else None
        raw_max = (self.path / "memory.max").read_text().strip() if (self.path / "memory.max").exists() else "max"
        return Reading(usage, max(0, current - inactive), oom, None if raw_max == "max" else int(raw_max))

    def alive(self) -> bool:
        events = self.path / "cgroup.events"
        if events.exists():
            return _kv(events).get("populated", 1) == 1
        return bool((self.path / "cgroup.procs").read_text().strip())


class CgroupV1:
    #: memory.limit_in_bytes reads as a huge page-aligned number when there is no limit
    UNLIMITED = 1 << 62

    def __init__(self, memory: Path, cpuacct: Path) -> None:
        self.memory = memory
        self.cpuacct = cpuacct

    def read(self) -> Reading:
        usage = int((self.cpuacct / "cpuacct.usage").read_text()) / 1e9
        current = int((self.memory / "memory.usage_in_bytes").read_text())
        stat = _kv(self.memory / "memory.stat")
        inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
        oom = _kv(self.memory / "memory.oom_control").get("oom_kill")
        limit = int((self.memory / "memory.limit_in_bytes").read_text())
        return Reading(usage, max(0, current - inactive), oom, None if limit >= self.UNLIMITED else limit)

    def alive(self) -> bool:
        return bool((self.memory / "cgroup.procs").read_text().strip())


class ProcTree:
    """A process and its descendants, read from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo += children.get(pid, [])
        return out

    def read(self) -> Reading:
        cpu = 0.0
        memory = 0
        for pid in self._tree():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                # utime, stime, cutime, cstime: a child reaped inside the tree moves to its parent's c*time
                cpu += sum(int(x) for x in fields[11:15]) / CLK_TCK
                memory += _pss(pid)
            except (OSError, IndexError, ValueError):
                continue  # exited between listing and reading
        return Reading(cpu, memory)

    def alive(self) -> bool:
        return Path(f"/proc/{self.pid}").exists()


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


Source = CgroupV2 | CgroupV1 | ProcTree


def cgroup_source(spec: str, cpu_spec: str | None = None) -> Source:
    """``--cgroup``: a cgroup v2 directory, a cgroup v1 memory directory (CPU from the matching
    cpuacct directory, or ``--cpu-cgroup``), or ``self`` for the collector's own cgroup."""
    if spec == "self":
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        v1 = {c: p for _, cs, p in (line.split(":", 2) for line in lines) for c in cs.split(",") if c}
        if "memory" in v1 and (CGROOT / "memory").is_dir():
            return CgroupV1(CGROOT / "memory" / v1["memory"].lstrip("/"), _cpuacct(v1.get("cpuacct", "/")))
        unified = next(p for h, cs, p in (line.split(":", 2) for line in lines) if h == "0")
        return CgroupV2(CGROOT / unified.lstrip("/"))
    path = Path(spec)
    if (path / "memory.current").exists():
        return CgroupV2(path)
    if (path / "memory.usage_in_bytes").exists():
        if cpu_spec is not None:
            cpu = Path(cpu_spec)
        else:
            rel = path.relative_to(CGROOT / "memory") if path.is_relative_to(CGROOT / "memory") else Path("/")
            cpu = _cpuacct(str(rel))
        return CgroupV1(path, cpu)
    raise ValueError(f"{spec} is not a cgroup v2 directory nor a cgroup v1 memory directory")


def _cpuacct(rel: str) -> Path:
    for name in ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"):
        base = CGROOT / name
        if base.is_dir():
            return base / rel.lstrip("/")
    raise ValueError("no cgroup v1 cpuacct hierarchy is mounted")


# --------------------------------------------------------------------------- sampling


@dataclass
class Measurement:
    cpu_samples_millicores: list[float] = field(default_factory=list)
    memory_peak_bytes: int = 0
    memory_limit_bytes: int | None = None
    oom_kill_events: int | None = None
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None


class Sampler:
    """Reads a source every ``interval`` seconds in a thread until stopped."""

    def __init__(self, source: Source, interval: float) -> None:
        self.source = source
        self.interval = interval
        self.result = Measurement()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._first: Reading | None = None
        self._last: tuple[float, Reading] | None = None

    def start(self) -> Sampler:
        self._take()
        self._thread.start()
        return self

    def _take(self, reading: Reading | None = None) -> None:
        if reading is None:
            try:
                reading = self.source.read()
            except (OSError, KeyError, ValueError):
                return  # the source went away (the process exited): keep what we have
        now = time.monotonic()
        r = self.result
        if self._first is None:
            self._first = reading
        if self._last is not None:
            t0, prev = self._last
            if now > t0:
                r.cpu_samples_millicores.append(max(0.0, (reading.cpu_seconds - prev.cpu_seconds) / (now - t0) * 1000))
        self._last = (now, reading)
        r.memory_peak_bytes = max(r.memory_peak_bytes, reading.working_set_bytes)  # sampled, or maxrss at exit
        if reading.limit_bytes is not None:
            r.memory_limit_bytes = reading.limit_bytes
        if reading.oom_kills is not None and self._first.oom_kills is not None:
            r.oom_kill_events = reading.oom_kills - self._first.oom_kills

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._take()

    def stop(self, final: Reading | None = None) -> Measurement:
        """``final``: what the kernel reported when the wrapped command was reaped (its whole CPU
        time and largest resident set), for a process tree that can no longer be read."""
        self._stop.set()
        self._thread.join()
        self._take(final)
        self.result.finished_at = datetime.now(UTC)
        if not self.result.cpu_samples_millicores:
            self.result.cpu_samples_millicores.append(0.0)
        return self.result


# --------------------------------------------------------------------------- identity


@dataclass
class Identity:
    org: str
    repo: str
    workflow: str
    job: str
    run_id: str


def identity_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """What the CI system says about the job: GitHub Actions, GitLab, Buildkite, Jenkins."""
    g = env.get
    if g("GITHUB_ACTIONS") == "true":
        owner, _, repo = (g("GITHUB_REPOSITORY") or "/").partition("/")
        ref = g("GITHUB_WORKFLOW_REF", "")  # owner/repo/.github/workflows/ci.yml@refs/heads/main
        workflow = ref.split("@", 1)[0].split("/", 2)[2] if ref.count("/") >= 2 else g("GITHUB_WORKFLOW", "")
        return {
            "org": g("GITHUB_REPOSITORY_OWNER") or owner,
            "repo": repo,
            "workflow": workflow,
            "job": g("GITHUB_JOB", ""),
            "run_id": f"{g('GITHUB_RUN_ID', '')}-{g('GITHUB_RUN_ATTEMPT', '1')}",
        }
    if g("GITLAB_CI") == "true":
        return {
            "org": g("CI_PROJECT_NAMESPACE", ""),
            "repo": g("CI_PROJECT_NAME", ""),
            "workflow": g("CI_CONFIG_PATH") or ".gitlab-ci.yml",
            "job": g("CI_JOB_NAME", ""),
            "run_id": g("CI_JOB_ID", ""),
        }
    if g("BUILDKITE") == "true":
        return {
            "org": g("BUILDKITE_ORGANIZATION_SLUG", ""),
            "repo": g("BUILDKITE_PIPELINE_SLUG", ""),
            "workflow": "pipeline.yml",
            "job": g("BUILDKITE_STEP_KEY") or g("BUILDKITE_LABEL", ""),
            "run_id": f"{g('BUILDKITE_JOB_ID', '')}-{g('BUILDKITE_RETRY_COUNT', '0')}",
        }
    if g("JENKINS_URL"):
        parts = g("JOB_NAME", "").split("/")
        return {
            "org": parts[0] if len(parts) > 2 else "jenkins",
            "repo": parts[-2] if len(parts) > 1 else parts[0],
            "workflow": "Jenkinsfile",
            "job": g("STAGE_NAME") or parts[-1],
            "run_id": g("BUILD_TAG", ""),
        }
    return {}


def payload(identity: Identity, m: Measurement, container: str) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": container,
        "cpu_samples_millicores": [round(v, 3) for v in m.cpu_samples_millicores],
        "memory_peak_bytes": m.memory_peak_bytes,
    }
    if m.memory_limit_bytes is not None:
        c["memory_limit_bytes"] = m.memory_limit_bytes
    if m.oom_kill_events is not None:
        c["oom_kill_events"] = m.oom_kill_events
    body: dict[str, Any] = {
        "org": identity.org,
        "repo": identity.repo,
        "workflow": identity.workflow,
        "job": identity.job,
        "run_id": identity.run_id,
        "started_at": m.started_at.isoformat().replace("+00:00", "Z"),
        "finished_at": (m.finished_at or datetime.now(UTC)).isoformat().replace("+00:00", "Z"),
        "containers": [c],
    }
    node = _node_memory()
    if node is not None:
        body["node_memory_bytes"] = node
    return body


def _node_memory() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


# --------------------------------------------------------------------------- sending


def send(
    url: str,
    token: str | None,
    body: dict[str, Any],
    *,
    retries: int,
    backoff: float,
    say: Callable[[str], None],
) -> bool | None:
    """Post a run. True: stored (201/200). False: refused for good (4xx: retrying cannot help).
    None: not reached (network, 5xx, 429) after every retry."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    delay = backoff
    for attempt in range(retries + 1):
        try:
            r = httpx.post(url.rstrip("/") + "/api/v1/runs", json=body, headers=headers, timeout=10)
            if r.status_code in (200, 201):
                return True
            if r.status_code < 500 and r.status_code != 429:
                say(f"ci-sizer: the sizer refused the run ({r.status_code}): {r.text[:300]}")
                return False
            reason = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            reason = type(exc).__name__
        if attempt < retries:
            say(f"ci-sizer: posting the run failed ({reason}); retrying in {delay:g}s")
            time.sleep(delay)
            delay *= 2
    return None


def spool(directory: Path, body: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"run-{uuid.uuid4().hex}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)  # a spooled file is whole or absent
    return path


def flush(directory: Path, url: str, token: str | None, *, say: Callable[[str], None]) -> int:
    """Send every spooled run; a sent (or refused) one is removed. Returns how many remain (an
    unreadable file is reported and kept). A missing directory is a ``ValueError``."""
    if not directory.is_dir():
        raise ValueError(f"--flush {directory}: no such directory")
    remaining = 0
    for path in sorted(directory.glob("run-*.json")):
        try:
            body = json.loads(path.read_text())
        except (OSError, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError
            say(f"ci-sizer: {path.name}: not a spooled run, left in place ({type(exc).__name__}: {exc})")
            remaining += 1
            continue
        outcome = send(url, token, body, retries=0, backoff=0, say=say)
        if outcome is None:
            remaining += 1
            continue
        path.unlink()
        say(f"ci-sizer: {'sent' if outcome else 'dropped (refused)'} {path.name}")
    return remaining


# --------------------------------------------------------------------------- the command


def run_collect(
    *,
    command: list[str],
    identity: Identity,
    url: str | None,
    token: str | None,
    interval: float,
    cgroup: str | None,
    cpu_cgroup: str | None,
    container: str,
    spool_dir: Path,
    retries: int,
    backoff: float,
    say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> int:
    """Run (or watch), measure, post; the exit code is the wrapped command's."""
    code = 0
    if command:
        try:
            child = subprocess.Popen(command)
        except OSError as exc:
            say(f"ci-sizer: cannot run {command[0]!r}: {exc}")
            return 127
        source: Source = cgroup_source(cgroup, cpu_cgroup) if cgroup else ProcTree(child.pid)
        sampler = Sampler(source, interval).start()
        forward = {s: signal.signal(s, lambda n, _f: child.send_signal(n)) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            # wait4, not wait: the kernel's account of the command's CPU time and largest resident
            # set, including the children it reaped, closes the last interval exactly
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
        finally:
            for s, handler in forward.items():
                signal.signal(s, handler)
        final = None
        if isinstance(source, ProcTree):
            final = Reading(usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)
        measured = sampler.stop(final)
        code = child.returncode
        code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
    else:
        if not cgroup:
            say("ci-sizer: give a command after -- or a --cgroup to watch")
            return 2
        source = cgroup_source(cgroup, cpu_cgroup)
        sampler = Sampler(source, interval).start()
        stop = threading.Event()
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda _n, _f: stop.set())
        while not stop.wait(interval) and source.alive():
            pass
        measured = sampler.stop()
    body = payload(identity, measured, container)
    if not url:
        say("ci-sizer: no --url (CI_SIZER_URL); the run is only spooled")
        say(f"ci-sizer: spooled the run to {spool(spool_dir, body)}")
        return code
    outcome = send(url, token, body, retries=retries, backoff=backoff, say=say)
    if outcome is None:
        say(f"ci-sizer: the sizer is unreachable; spooled the run to {spool(spool_dir, body)} "
            f"(send later with: ci-sizer collect --flush {spool_dir})")  # fmt: skip
    elif outcome:
        samples = measured.cpu_samples_millicores
        say(f"ci-sizer: posted run {identity.run_id} ({len(samples)} samples, "
            f"peak {max(samples):.0f}m CPU, {measured.memory_peak_bytes / 2**20:.0f} MiB working set)")  # fmt: skip
    return code
