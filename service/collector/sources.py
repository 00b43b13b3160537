"""Where readings come from: a cgroup v2 directory, a cgroup v1 memory and cpuacct pair, or the
wrapped command's process tree read from /proc; ``cgroup_source`` picks the cgroup for ``--cgroup``.

A cgroup that holds the collector is read minus the collector's own CPU time and anonymous memory."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from service.collector.mounts import _cgroup_of, _mounts, locate, own_cgroups

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
CGROOT = Path("/sys/fs/cgroup")


class NoReadings(ValueError):
    """The source cannot be read: the run is not measured, and nothing is posted."""


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
        # descendants before their parents: a child reaped between the two reads is then counted twice
        # (alive, then in its parent's cutime), never missed (the parent read before the reap, the child
        # gone after it). A double count is lowered to the next readings' (sampling.cpu_samples); a missed
        # one lowered every reading before it to the dip, and its CPU came back at once at the end
        for pid in reversed(self._tree()):
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
