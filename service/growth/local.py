"""The local actuator, for runners on VMs and hosts where the collector runs as root: the build starts in
a cgroup of its own below the collector's (``ci-sizer-<pid>``), limited to the answer's memory limit,
and the guard raises that limit itself, by writing it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from service.growth.cgroups import Memory, child
from service.growth.guard import Record


class CgroupActuator:
    name = "cgroup"
    inline = True

    def __init__(self, memory: Memory) -> None:
        self.memory = memory

    def grow(self, current: int, target: int, record: Record, cancelled: threading.Event) -> bool:
        try:
            self.memory.set_limit(target)
        except OSError as exc:
            record("error", current, target, f"{self.memory.path} is not writable: {exc.strerror or exc}")
            return False
        record("grown", current, target, "")
        return True

    def close(self) -> None:
        pass


def build_cgroup(parent: Path, limit: int) -> Memory:
    """The build's own cgroup below ``parent``, at ``limit`` bytes (OSError / ValueError when it cannot be made)."""
    return child(parent, f"ci-sizer-{os.getpid()}", limit)
