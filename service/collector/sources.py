"""``ci-sizer collect``: measure a build and post the run, without a server of its own.

Wraps a command (``ci-sizer collect -- make build``) or watches a cgroup (``--cgroup PATH``),
samples CPU and memory every ``--interval`` seconds, and posts the run at the end. It exits with
the wrapped command's exit code and never fails the build because the sizer is unreachable: it
retries with backoff for at most ``--timeout`` seconds in all, then spools the payload to a file and
says so (``--flush DIR`` sends spooled runs later).

It needs only the standard library, so that it runs from a plain ``pip install .``; the CLI imports
nothing else for ``collect``.

Sources, best first:

- cgroup v2 (``cpu.stat`` usage_usec, ``memory.current`` minus ``memory.stat`` inactive_file,
  ``memory.events`` oom_kill, ``memory.max``);
- cgroup v1 (``cpuacct.usage``, ``memory.usage_in_bytes`` minus total_inactive_file,
  ``memory.oom_control`` oom_kill, ``memory.limit_in_bytes``);
- the wrapped command's process tree from ``/proc`` (CPU time of the tree, including reaped
  children; memory as the sum of the processes' proportional set sizes).

It measures the wrapped command, not itself: the process tree is rooted at the command, and a
cgroup that holds the collector is read minus the collector's own CPU time and anonymous memory.
A source that gives no readings is reported in one line and nothing is posted: never a run of zeros.

Memory is the working set, as the kubelet counts it, not a peak that includes page cache.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
CGROOT = Path("/sys/fs/cgroup")


class NoReadings(ValueError):
    """The source cannot be read: the run is not measured, and nothing is posted."""


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


def _own_usage() -> tuple[float, int]:
    """The collector's own CPU time (every thread) and anonymous resident memory."""
    anon = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
    return time.process_time(), anon


def _holds_self(directory: Path, own: Path | None) -> bool:
    """Whether the cgroup ``directory`` holds the collector (in it or in a cgroup below it)."""
    if own is not None:
        with contextlib.suppress(OSError):
            return own.resolve().is_relative_to(directory.resolve())
    with contextlib.suppress(OSError):
        return str(os.getpid()) in (directory / "cgroup.procs").read_text().split()
    return False


class CgroupV2:
    def __init__(self, path: Path) -> None:
        self.path = path
        own = own_cgroups()
        self.minus_self = _holds_self(path, own.get(""))

    def read(self) -> Reading:
        usage = _kv(self.path / "cpu.stat")["usage_usec"] / 1e6
        current = int((self.path / "memory.current").read_text())
        inactive = _kv(self.path / "memory.stat").get("inactive_file", 0)
        events = self.path / "memory.events"
        oom = _kv(events).get("oom_kill") if events.exists() else None
        raw_max = (self.path / "memory.max").read_text().strip() if (self.path / "memory.max").exists() else "max"
        working_set = max(0, current - inactive)
        if self.minus_self:
            own_cpu, own_anon = _own_usage()
            usage, working_set = max(0.0, usage - own_cpu), max(0, working_set - own_anon)
        return Reading(usage, working_set, oom, None if raw_max == "max" else int(raw_max))

    def alive(self) -> bool:
        events = self.path / "cgroup.events"
        if events.exists():
            return _kv(events).get("populated", 1) == 1
        return bool((self.path / "cgroup.procs").read_text().strip())

    def __str__(self) -> str:
        return f"cgroup {self.path}"


class CgroupV1:
    #: memory.limit_in_bytes reads as a huge page-aligned number when there is no limit
    UNLIMITED = 1 << 62

    def __init__(self, memory: Path, cpuacct: Path) -> None:
        self.memory = memory
        self.cpuacct = cpuacct
        own = own_cgroups()
        self.minus_self_memory = _holds_self(memory, own.get("memory"))
        self.minus_self_cpu = _holds_self(cpuacct, own.get("cpuacct"))

    def read(self) -> Reading:
        usage = int((self.cpuacct / "cpuacct.usage").read_text()) / 1e9
        current = int((self.memory / "memory.usage_in_bytes").read_text())
        stat = _kv(self.memory / "memory.stat")
        inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
        oom = _kv(self.memory / "memory.oom_control").get("oom_kill")
        limit = int((self.memory / "memory.limit_in_bytes").read_text())
        working_set = max(0, current - inactive)
        if self.minus_self_memory or self.minus_self_cpu:
            own_cpu, own_anon = _own_usage()
            if self.minus_self_cpu:
                usage = max(0.0, usage - own_cpu)
            if self.minus_self_memory:
                working_set = max(0, working_set - own_anon)
        return Reading(usage, working_set, oom, None if limit >= self.UNLIMITED else limit)

    def alive(self) -> bool:
        return bool((self.memory / "cgroup.procs").read_text().strip())

    def __str__(self) -> str:
        return f"cgroup {self.memory} (CPU from {self.cpuacct})"


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
                if pid == self.pid:  # reaped: its time is in the kernel's final account, not zero
                    raise ProcessLookupError(f"process {pid} has been reaped") from None
                continue  # exited between listing and reading
        return Reading(cpu, memory)

    def alive(self) -> bool:
        return Path(f"/proc/{self.pid}").exists()

    def __str__(self) -> str:
        return "the command's processes"


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def _own_peak_rss() -> int:
    """The collector's largest resident set so far (VmHWM). A command it starts inherits it as the
    floor of its ``ru_maxrss``: the kernel carries the parent's high-water mark across fork and exec."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 1 << 62  # unknown: never trust ru_maxrss


Source = CgroupV2 | CgroupV1 | ProcTree


# --------------------------------------------------------------------------- finding cgroups


@dataclass(frozen=True)
class Mount:
    """A cgroup filesystem mount (a line of /proc/self/mountinfo)."""

    root: PurePosixPath  #: the cgroup mounted there (a container sees its own cgroup as a mount's root)
    point: Path
    v2: bool
    options: frozenset[str]  #: a v1 hierarchy's controllers are among its super options


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), text)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup mounts, a later mount on the same point hiding the earlier one."""
    found: dict[Path, Mount] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if not sep or len(f) < 5 or len(r) < 3 or r[0] not in ("cgroup", "cgroup2"):
            continue
        point = Path(_unescape(f[4]))
        found.pop(point, None)
        found[point] = Mount(PurePosixPath(_unescape(f[3])), point, r[0] == "cgroup2", frozenset(r[2].split(",")))
    return list(found.values())


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/PID/cgroup as hierarchy -> cgroup path: ``""`` for the v2 one, else each v1 controller."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and not controllers:
            out[""] = path
        for c in filter(None, controllers.split(",")):
            out[c] = path
    return out


def _serves(mount: Mount, hierarchy: str) -> bool:
    return mount.v2 if hierarchy == "" else not mount.v2 and hierarchy in mount.options


def locate(cgroup: str, hierarchy: str, mounts: list[Mount]) -> Path | None:
    """The directory of ``cgroup`` in ``hierarchy`` (``""``: v2, else a v1 controller) under the mount
    whose root holds it most closely; None when no mount shows it."""
    path = PurePosixPath(cgroup)
    best: Mount | None = None
    for m in mounts:
        if _serves(m, hierarchy) and path.is_relative_to(m.root):
            if best is None or len(m.root.parts) > len(best.root.parts):
                best = m
    return None if best is None else best.point / path.relative_to(best.root)


def _cgroup_of(directory: Path, hierarchy: str, mounts: list[Mount]) -> str | None:
    """The cgroup a directory under a mount of ``hierarchy`` is (the inverse of ``locate``)."""
    best: Mount | None = None
    for m in mounts:
        if _serves(m, hierarchy) and directory.is_relative_to(m.point):
            if best is None or len(m.point.parts) > len(best.point.parts):
                best = m
    return None if best is None else str(best.root / directory.relative_to(best.point))


def _mounts() -> list[Mount]:
    try:
        return parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return []


def own_cgroups() -> dict[str, Path]:
    """The collector's own cgroup directories: ``""`` (v2), ``memory`` and ``cpuacct`` (v1)."""
    try:
        mine = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    except OSError:
        return {}
    mounts = _mounts()
    out: dict[str, Path] = {}
    for hierarchy in ("", "memory", "cpuacct"):
        if hierarchy in mine and (found := locate(mine[hierarchy], hierarchy, mounts)) is not None:
            out[hierarchy] = found
    return out


def cgroup_source(spec: str, cpu_spec: str | None = None) -> Source:
    """``--cgroup``: a cgroup v2 directory, a cgroup v1 memory directory (CPU from the matching
    cpuacct directory, or ``--cpu-cgroup``), or ``self`` for the collector's own cgroup (found through
    /proc/self/mountinfo, so that a container's view, where its cgroup is a mount's root, works).
    Raises ValueError (NoReadings when there is no CPU or memory to read)."""
    if spec == "self":
        own = own_cgroups()
        if "memory" in own:
            cpu = Path(cpu_spec) if cpu_spec is not None else own.get("cpuacct")
            if cpu is None:
                raise NoReadings("no cgroup v1 cpuacct hierarchy shows the collector's cgroup (give --cpu-cgroup)")
            return CgroupV1(own["memory"], cpu)
        if "" in own:
            return CgroupV2(own[""])
        raise NoReadings("no mounted cgroup hierarchy shows the collector's cgroup")
    path = Path(spec)
    if (path / "memory.current").exists():
        return CgroupV2(path)
    if (path / "memory.usage_in_bytes").exists():
        if cpu_spec is not None:
            return CgroupV1(path, Path(cpu_spec))
        cpu = _matching_cpuacct(path)
        if cpu is None:
            raise NoReadings(f"no cgroup v1 cpuacct directory matches {path} (give --cpu-cgroup)")
        return CgroupV1(path, cpu)
    raise ValueError(f"{spec} is not a cgroup v2 directory nor a cgroup v1 memory directory")


def _matching_cpuacct(memory: Path) -> Path | None:
    """The cpuacct directory of the cgroup a v1 memory directory is, if it exists."""
    mounts = _mounts()
    cgroup = _cgroup_of(memory, "memory", mounts)
    if cgroup is not None:
        cpu = locate(cgroup, "cpuacct", mounts)
    elif memory.is_relative_to(CGROOT / "memory"):  # no mountinfo: the same path in the usual layout
        rel = memory.relative_to(CGROOT / "memory")
        cpu = next((CGROOT / n / rel for n in ("cpuacct", "cpu,cpuacct", "cpuacct,cpu") if (CGROOT / n).is_dir()), None)
    else:
        cpu = None
    return cpu if cpu is not None and (cpu / "cpuacct.usage").exists() else None


# --------------------------------------------------------------------------- sampling


@dataclass
class Measurement:
    cpu_samples_millicores: list[float] = field(default_factory=list)
    memory_peak_bytes: int = 0
    memory_limit_bytes: int | None = None
    oom_kill_events: int | None = None
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None
    readings: int = 0  #: how many times the source could be read
    error: str | None = None  #: why the source could not be read, the last time it could not

    def empty(self) -> bool:
        """No CPU interval or no memory was ever read: posting it would post zeros."""
        return not self.cpu_samples_millicores or self.memory_peak_bytes <= 0


class Sampler:
    """Reads a source every ``interval`` seconds in a thread until stopped."""

    def __init__(self, source: Source, interval: float) -> None:
        self.source = source
        self.interval = interval
        self.result = Measurement()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._first: Reading | None = None
        self._cpu: list[tuple[float, float]] = []  #: (monotonic time, cumulative CPU seconds)

    def start(self) -> Sampler:
        self._take()
        self._thread.start()
        return self

    def _take(self, reading: Reading | None = None) -> None:
        if reading is None:
            try:
                reading = self.source.read()
            except (OSError, KeyError, ValueError) as exc:
                self.result.error = f"{type(exc).__name__}: {exc}"
                return  # the source went away (the process exited): keep what we have
        r = self.result
        r.readings += 1
        if self._first is None:
            self._first = reading
        self._cpu.append((time.monotonic(), reading.cpu_seconds))
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
        time, and its largest resident set when that is its own), for a process tree that can no
        longer be read."""
        self._stop.set()
        self._thread.join()
        self._take(final)
        self.result.finished_at = datetime.now(UTC)
        self.result.cpu_samples_millicores = cpu_samples(self._cpu, self.interval)
        return self.result


def cpu_samples(readings: list[tuple[float, float]], interval: float) -> list[float]:
    """Millicores over each interval between readings of cumulative CPU time.

    CPU time only grows, and the last reading is the most exact (the kernel's account at exit), so a
    reading above a later one (a process tree read while a child was being reaped counts the child
    twice) is lowered to it. An interval shorter than half the sampling interval (the last one,
    closed when the command ends) joins the one before it: a few ticks over a few milliseconds is
    not a rate."""
    points: list[tuple[float, float]] = []
    floor = float("inf")
    for t, cpu in reversed(readings):
        floor = min(floor, cpu)
        points.append((t, floor))
    points.reverse()
    kept = points[:1]
    for t, cpu in points[1:]:
        if t - kept[-1][0] < interval / 2 and len(kept) > 1:
            kept[-1] = (t, cpu)  # the short interval joins the previous one
        elif t > kept[-1][0]:
            kept.append((t, cpu))
    return [(c1 - c0) / (t1 - t0) * 1000 for (t0, c0), (t1, c1) in itertools.pairwise(kept)]


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


def _post_once(url: str, data: bytes, headers: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """One POST: (status, the start of the body), or (None, why it was not answered)."""
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read(300).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(300).decode("utf-8", "replace")
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return None, f"no answer in {timeout:.1f}s"
        return None, reason if isinstance(reason, str) else type(reason).__name__
    except TimeoutError:
        return None, f"no answer in {timeout:.1f}s"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return None, type(exc).__name__


def _post(url: str, data: bytes, headers: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """``_post_once`` that gives up after ``timeout`` seconds whatever the server does (a socket
    timeout bounds each read, not a slow trickle nor name resolution): the request runs in a daemon
    thread that is left behind."""
    answer: list[tuple[int | None, str]] = []
    worker = threading.Thread(target=lambda: answer.append(_post_once(url, data, headers, timeout)), daemon=True)
    worker.start()
    worker.join(timeout)
    return answer[0] if answer else (None, f"no answer in {timeout:.1f}s")


def send(
    url: str,
    token: str | None,
    body: dict[str, Any],
    *,
    retries: int,
    backoff: float,
    timeout: float,
    say: Callable[[str], None],
) -> bool | None:
    """Post a run, for at most ``timeout`` seconds in all, retries and their waits included.
    True: stored (201/200). False: refused for good (4xx: retrying cannot help). None: not reached
    (network, 5xx, 429) before the retries or the time ran out."""
    headers = {"Content-Type": "application/json", "User-Agent": "ci-sizer-collect"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode()
    deadline = time.monotonic() + timeout
    delay = backoff
    for attempt in range(retries + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        status, text = _post(url.rstrip("/") + "/api/v1/runs", data, headers, left)
        if status in (200, 201):
            return True
        if status is not None and status < 500 and status != 429:
            say(f"ci-sizer: the sizer refused the run ({status}): {text}")
            return False
        reason = f"HTTP {status}" if status is not None else text
        left = deadline - time.monotonic()
        if attempt < retries and left > 0:
            say(f"ci-sizer: posting the run failed ({reason}); retrying in {min(delay, left):.1f}s")
            time.sleep(min(delay, left))
            delay *= 2
        else:
            say(f"ci-sizer: posting the run failed ({reason})")
            break
    return None


def spool(directory: Path, body: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"run-{uuid.uuid4().hex}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)  # a spooled file is whole or absent
    return path


def flush(directory: Path, url: str, token: str | None, *, timeout: float, say: Callable[[str], None]) -> int:
    """Send every spooled run (each for at most ``timeout`` seconds); a sent (or refused) one is
    removed. Returns how many remain (an unreadable file is reported and kept). A missing directory
    is a ``ValueError``."""
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
        outcome = send(url, token, body, retries=0, backoff=0, timeout=timeout, say=say)
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
    timeout: float = 5.0,
    say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> int:
    """Run (or watch), measure, post; the exit code is the wrapped command's. A cgroup that cannot
    be read still runs the command, unmeasured (watching one raises ValueError)."""
    if not command and not cgroup:
        say("ci-sizer: give a command after -- or a --cgroup to watch")
        return 2
    source: Source | None = None
    if cgroup:
        try:
            source = cgroup_source(cgroup, cpu_cgroup)
            source.read()  # a cgroup that cannot be read is said now, never posted as zeros
        except (OSError, KeyError, ValueError) as exc:
            what = f"{source} gives no readings ({type(exc).__name__}: {exc})" if source else str(exc)
            if not command:
                raise NoReadings(f"{what}; nothing to watch") from None
            say(f"ci-sizer: {what}; the command runs unmeasured and nothing is posted")
            source = None
    code = 0
    if command:
        try:
            child = subprocess.Popen(command)
        except OSError as exc:
            say(f"ci-sizer: cannot run {command[0]!r}: {exc}")
            return 127
        inherited = _own_peak_rss()  # read after the spawn: at least what the command inherited
        if source is None and not cgroup:
            source = ProcTree(child.pid)
        sampler = Sampler(source, interval).start() if source is not None else None
        forward = {s: signal.signal(s, lambda n, _f: child.send_signal(n)) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            # wait4, not wait: the kernel's account of the command's CPU time and largest resident
            # set, including the children it reaped, closes the last interval exactly
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
        finally:
            for s, handler in forward.items():
                signal.signal(s, handler)
        code = child.returncode
        code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
        if sampler is None:
            return code
        final = None
        if isinstance(source, ProcTree):
            # ru_maxrss never falls below the collector's own peak when it started the command:
            # it is the command's own only above that
            maxrss = usage.ru_maxrss * 1024
            final = Reading(usage.ru_utime + usage.ru_stime, maxrss if maxrss > inherited else 0)
        measured = sampler.stop(final)
    else:
        assert source is not None
        watcher = Sampler(source, interval).start()
        stop = threading.Event()
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda _n, _f: stop.set())
        while not stop.wait(interval) and source.alive():
            pass
        measured = watcher.stop()
    if measured.empty():
        if not measured.readings:
            why = measured.error or "nothing to read"
        else:
            why = "no memory" if measured.memory_peak_bytes <= 0 else "no CPU interval"
            why += " (it ended before a sample)" if isinstance(source, ProcTree) else ""
        say(f"ci-sizer: {source} gave no readings: {why}; nothing is posted")
        return code
    body = payload(identity, measured, container)
    if not url:
        say("ci-sizer: no --url (CI_SIZER_URL); the run is only spooled")
        say(f"ci-sizer: spooled the run to {spool(spool_dir, body)}")
        return code
    outcome = send(url, token, body, retries=retries, backoff=backoff, timeout=timeout, say=say)
    if outcome is None:
        say(f"ci-sizer: the sizer is unreachable; spooled the run to {spool(spool_dir, body)} "
            f"(send later with: ci-sizer collect --flush {spool_dir})")  # fmt: skip
    elif outcome:
        samples = measured.cpu_samples_millicores
        say(f"ci-sizer: posted run {identity.run_id} ({len(samples)} samples, "
            f"peak {max(samples):.0f}m CPU, {measured.memory_peak_bytes / 2**20:.0f} MiB working set)")  # fmt: skip
    return code
