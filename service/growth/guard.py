"""The guard: a thread that watches one cgroup's memory many times a second (and, on cgroup v1, wakes
as soon as usage crosses the threshold), asks an actuator for a larger limit when the working set
reaches the threshold, and keeps the run's growth events (the wire contract §2), its true peak and
the kernel's OOM kills.

An actuator that acts at once (a cgroup write) acts within the watcher's turn; one that must wait
for someone else (the kubelet) acts in a worker thread, and the guard asks for nothing more until it
has an outcome. Nothing here raises into the build: a cgroup that stops answering ends the watching
with one line."""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from service.growth.block import MIB, GrowBlock
from service.growth.cgroups import Memory, remove

#: the contract's bound on events per container
MAX_EVENTS = 100
RESULTS = ("grown", "deferred", "infeasible", "too_late", "error")


class NotResizable(ValueError):
    """Nothing can be grown here (said in one line; the build runs without growth)."""


Record = Callable[[str, int, int, str], None]  #: (result, from_bytes, to_bytes, detail)


class Actuator(Protocol):
    name: str
    #: True: ``grow`` returns at once (within the watcher's turn); False: it waits, in a worker thread
    inline: bool

    def grow(self, current: int, target: int, record: Record, cancelled: threading.Event) -> bool:
        """Raise the limit from ``current`` to ``target``, recording each outcome; False when the
        guard must ask for nothing more (refused for good, or broken)."""
        ...

    def close(self) -> None: ...


@dataclass
class Event:
    at: datetime
    from_bytes: int
    to_bytes: int
    result: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "from_bytes": self.from_bytes,
            "to_bytes": self.to_bytes,
            "result": self.result,
        }


@dataclass
class Report:
    """What the guard saw of the run: its events, the limit it ended with, its true peak working set,
    and how many OOM kills the kernel made (None where the cgroup does not count them)."""

    events: list[Event] = field(default_factory=list)
    limit_bytes: int | None = None
    peak_bytes: int = 0
    oom_kills: int | None = None

    def growths(self) -> list[dict[str, Any]]:
        return [e.as_dict() for e in self.events]


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


class Guard:
    def __init__(
        self,
        *,
        memory: Memory,
        block: GrowBlock,
        actuator: Actuator,
        poll: float,
        say: Callable[[str], None],
        owned: bool = False,
        minus_self: bool = False,
        notify: bool = True,
    ) -> None:
        self.memory = memory
        self.block = block
        self.actuator = actuator
        self.poll = poll
        self.say = say
        self.owned = owned  #: the guard made this cgroup (the local actuator): it removes it at the end
        self.minus_self = minus_self  #: the cgroup holds the collector: its own memory is not the build's
        self.notify = notify  #: wake on the kernel's threshold notification too (cgroup v1), not only each poll
        self.report = Report()
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ci-sizer-growth", daemon=True)
        self._worker: threading.Thread | None = None
        self._pending: int | None = None  #: the limit asked for and not yet answered
        self._done = False  #: ask for nothing more
        #: a kill was seen and the usage has not yet fallen below the threshold since: the victim's memory
        #: is still charged while the kernel frees it, over one turn or several on a busy machine
        self._settling = False
        self._dropped = 0
        self._closed = False
        self._kills = self._kills_start = memory.oom_kills()
        self._armed_for: int | None = None
        self._efd: int | None = None

    # ------------------------------------------------------------------ the build's process

    def enter_fd(self) -> int | None:
        """For the local actuator: a descriptor of the cgroup's ``cgroup.procs``, written by the build's
        process between fork and exec so that it starts inside (``preexec``)."""
        if not self.owned:
            return None
        return os.open(self.memory.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

    # ------------------------------------------------------------------ events

    def record(self, result: str, from_bytes: int, to_bytes: int, detail: str = "") -> None:
        assert result in RESULTS, result
        with self._lock:
            if self._closed:
                return  # an answer that came after the run was reported is not part of it
            if len(self.report.events) >= MAX_EVENTS:
                self._dropped += 1
                return
            self.report.events.append(Event(datetime.now(UTC), from_bytes, to_bytes, result))
        what = f"{_mib(from_bytes)} -> {_mib(to_bytes)}" if to_bytes != from_bytes else _mib(from_bytes)
        self.say(f"ci-sizer: growth ({self.actuator.name}): {what}: {result}" + (f" ({detail})" if detail else ""))

    # ------------------------------------------------------------------ watching

    def start(self) -> Guard:
        self._thread.start()
        return self

    def _arm(self, limit: int | None) -> None:
        """(Re-)register the kernel's notification at the threshold of the limit in force."""
        if limit == self._armed_for:
            return
        if self._efd is not None:
            os.close(self._efd)  # unregisters it
        self._efd = None
        if self.notify and limit is not None:
            self._efd = self.memory.notify_at(self.block.threshold_bytes(limit))
        self._armed_for = limit

    def _wait(self) -> None:
        if self._efd is None:
            self._halt.wait(self.poll)
            return
        ready, _, _ = select.select([self._efd], [], [], self.poll)
        if ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self._efd, 8)

    def _run(self) -> None:
        try:
            self._arm(self.memory.limit())
            while not self._halt.is_set():
                self._wait()
                self._tick()
        except (OSError, ValueError) as exc:
            self.say(f"ci-sizer: growth stopped: {self.memory} cannot be read ({type(exc).__name__}: {exc})")
        except Exception as exc:  # a bug here must stop the watching, never the build
            self.say(f"ci-sizer: growth stopped: {type(exc).__name__}: {exc}")
        finally:
            if self._efd is not None:
                os.close(self._efd)
                self._efd = None

    def _tick(self) -> None:
        m = self.memory
        usage, limit = m.usage(), m.limit()
        kills = m.oom_kills()
        killed = kills is not None and self._kills is not None and kills > self._kills
        if killed:
            # the kernel killed before a growth took effect: what was being asked, else the limit itself
            for _ in range(kills - self._kills):  # type: ignore[operator]
                held = limit or 0
                self.record("too_late", held, max(self._pending or held, held))
            self._kills = kills
            self._settling = True
        threshold = self.block.threshold_bytes(limit) if limit is not None else None
        if self._settling and not killed and (threshold is None or usage < threshold):
            self._settling = False  # the victim's memory is gone: a new rise is the build's again
        if usage <= self.report.peak_bytes and (threshold is None or usage < threshold):
            return  # the working set is at most usage: no new peak, nothing to grow
        working_set = m.working_set(usage)
        self.report.peak_bytes = max(self.report.peak_bytes, working_set)
        if limit is None or self._pending is not None or self._done or self._settling:
            # (after a kill, the usage holds the victim's memory until the kernel has freed it: a growth
            # for it would raise the limit for a process that is gone)
            return
        target = self.block.next_target(working_set, limit)
        if target is None:
            return
        if self.actuator.inline:
            if not self.actuator.grow(limit, target, self.record, self._cancel):
                self._done = True
            self._arm(m.limit())
            return
        self._pending = target
        self._worker = threading.Thread(target=self._ask, args=(limit, target), name="ci-sizer-resize", daemon=True)
        self._worker.start()

    def _ask(self, current: int, target: int) -> None:
        try:
            keep = self.actuator.grow(current, target, self.record, self._cancel)
        except Exception as exc:  # an actuator's bug must not end the watching, nor reach the build
            self.record("error", current, target, f"{type(exc).__name__}: {exc}")
            keep = False
        if not keep:
            self._done = True
        self._pending = None

    # ------------------------------------------------------------------ the end

    def stop(self) -> Report:
        """Stop watching (after the build has ended): the last OOM kills, the limit it ended with, the
        cgroup removed when the guard made it."""
        self._halt.set()
        self._cancel.set()
        if self._thread.is_alive():
            self._thread.join()
        self._done = True
        try:
            self._tick()  # a kill between the last turn and the build's end
            self.report.limit_bytes = self.memory.limit()
            if self._kills is not None and self._kills_start is not None:
                self.report.oom_kills = self._kills - self._kills_start
        except (OSError, ValueError):
            pass
        if self._worker is not None:
            self._worker.join(1.0)  # an answer under way is waited for a moment, never more
        with self._lock:
            self._closed = True
        if self.minus_self:
            self.report.peak_bytes = max(0, self.report.peak_bytes - _own_anon())
        self.memory.close()
        self.actuator.close()
        if self.owned and not remove(self.memory.path):
            self.say(f"ci-sizer: {self.memory} still holds processes the build left behind; it is left in place")
        if self._dropped:
            self.say(f"ci-sizer: {self._dropped} growth event(s) past the first {MAX_EVENTS} are not posted")
        return self.report


def _own_anon() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0
