"""One cgroup's memory as the guard reads and raises it, many times a second.

- cgroup v2: ``memory.current``, ``memory.stat`` (inactive_file), ``memory.events`` (oom_kill),
  ``memory.max``;
- cgroup v1: ``memory.usage_in_bytes``, ``memory.stat`` (total_inactive_file), ``memory.oom_control``
  (oom_kill), ``memory.limit_in_bytes``; and the kernel's usage threshold notification: an eventfd
  registered through ``cgroup.event_control`` wakes the guard as soon as usage crosses the threshold
  (Documentation/admin-guide/cgroup-v1/memory.rst, "Memory thresholds"), where polling alone would
  wait for the next poll.

The files are kept open and read with ``pread`` at offset 0 (the kernel writes them afresh each
time): about 2 us a read here, against 30 us to open, read and close.

``child`` makes the cgroup a local guard starts the build in."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

from service.collector.mounts import own_cgroups

#: memory.limit_in_bytes (v1) reads as a huge page-aligned number when there is no limit
UNLIMITED = 1 << 62


def _value(raw: bytes, key: bytes) -> int | None:
    for line in raw.splitlines():
        name, _, value = line.partition(b" ")
        if name == key:
            return int(value)
    return None


class Memory:
    """A cgroup's memory files (v1 or v2, by the names they have)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.v2 = (path / "memory.current").exists()
        if not self.v2 and not (path / "memory.usage_in_bytes").exists():
            raise ValueError(f"{path} is not a cgroup v2 directory nor a cgroup v1 memory directory")
        usage, limit, events = (
            ("memory.current", "memory.max", "memory.events")
            if self.v2
            else ("memory.usage_in_bytes", "memory.limit_in_bytes", "memory.oom_control")
        )
        self._limit_name = limit
        self._fds: list[int] = []
        self._usage = self._open(usage)
        self._stat = self._open("memory.stat")
        self._limit = self._open(limit)
        self._events = self._open(events) if (path / events).exists() else None
        self._inactive = b"inactive_file" if self.v2 else b"total_inactive_file"

    def _open(self, name: str) -> int:
        fd = os.open(self.path / name, os.O_RDONLY | os.O_CLOEXEC)
        self._fds.append(fd)
        return fd

    def usage(self) -> int:
        """Bytes charged, page cache included: what the kernel holds against the limit."""
        return int(os.pread(self._usage, 64, 0))

    def working_set(self, usage: int) -> int:
        """Usage minus the inactive page cache, as the kubelet counts a container's working set: the
        kernel reclaims that cache before it kills, so a build reading many files is not grown for it."""
        inactive = _value(os.pread(self._stat, 1 << 16, 0), self._inactive) or 0
        return max(0, usage - inactive)

    def limit(self) -> int | None:
        raw = os.pread(self._limit, 64, 0).strip()
        if raw == b"max":
            return None
        value = int(raw)
        return None if value >= UNLIMITED else value

    def oom_kills(self) -> int | None:
        """How many processes the kernel has killed for this cgroup's limit (v1 from kernel 4.13)."""
        if self._events is None:
            return None
        return _value(os.pread(self._events, 4096, 0), b"oom_kill")

    def set_limit(self, limit: int) -> None:
        """Raise (or set) the limit; OSError when the cgroup is not writable."""
        try:
            (self.path / self._limit_name).write_text(str(limit))
        except OSError as exc:
            # v1 keeps memory+swap at or above memory: raise that first when it is what stands in the way
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if self.v2 or exc.errno != errno.EINVAL or not memsw.exists():
                raise
            memsw.write_text(str(limit))
            (self.path / self._limit_name).write_text(str(limit))

    def notify_at(self, threshold: int) -> int | None:
        """v1: an eventfd the kernel signals when usage crosses ``threshold`` bytes (either way), or
        None where there is no such notification (v2, or a cgroup mounted read-only as in a pod).
        Closing the eventfd unregisters it."""
        if self.v2 or not hasattr(os, "eventfd"):
            return None
        efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            with open(self.path / "cgroup.event_control", "w") as control:
                control.write(f"{efd} {self._usage} {threshold}")
        except OSError:
            os.close(efd)
            return None
        return efd

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def __str__(self) -> str:
        return f"cgroup {self.path}"


def own_memory_dir() -> Path:
    """The collector's own memory cgroup directory (v1 memory hierarchy, else v2); ValueError if none."""
    own = own_cgroups()
    found = own.get("memory") or own.get("")
    if found is None:
        raise ValueError("no mounted cgroup hierarchy shows the collector's memory cgroup")
    return found


def child(parent: Path, name: str, limit: int) -> Memory:
    """A new cgroup ``name`` below ``parent`` with a memory limit of ``limit`` bytes. On v2 the parent
    must let its children have the memory controller (it does when it is delegated: systemd's
    ``Delegate=yes``); it is enabled here when the parent allows it. OSError / ValueError otherwise,
    and nothing is left behind."""
    if (parent / "cgroup.subtree_control").exists():  # v2
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        if "memory" not in enabled:
            (parent / "cgroup.subtree_control").write_text("+memory")  # EBUSY when the parent holds processes
    path = parent / name
    path.mkdir()
    try:
        memory = Memory(path)
        memory.set_limit(limit)
    except (OSError, ValueError):
        remove(path)
        raise
    return memory


def remove(path: Path, wait: float = 1.0) -> bool:
    """Remove an empty cgroup, waiting up to ``wait`` seconds for the processes it held to be gone."""
    deadline = time.monotonic() + wait
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
