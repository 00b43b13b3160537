"""Sampling a source every ``interval`` seconds in a thread, and the CPU rate between readings."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from service.collector.sources import Reading, Source


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
        at = time.monotonic()
        if reading is None:
            try:
                reading = self.source.read()
            except (OSError, KeyError, ValueError) as exc:
                self.result.error = f"{type(exc).__name__}: {exc}"
                return  # the source went away (the process exited): keep what we have
            # timed at the middle of the read, not at its end: a process tree's read (a file per
            # process) can take a good part of an interval on a busy machine, and a reading stamped late
            # makes its interval long and the next one short (a rate of twice or more, seen in the mean)
            at = (at + time.monotonic()) / 2
        r = self.result
        r.readings += 1
        if self._first is None:
            self._first = reading
        self._cpu.append((at, reading.cpu_seconds))
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
