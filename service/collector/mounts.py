"""Finding cgroups: the cgroup mounts of /proc/self/mountinfo and the cgroups of /proc/self/cgroup.

A container sees its own cgroup as the root of a mount, so a cgroup's directory is found under the
mount whose root holds it most closely."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


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
