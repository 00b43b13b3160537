"""The sampler's CPU rates (service/collector/sampling.py) against a source whose reads take time, on a
clock the test moves: no sleeps, nothing timed."""

from __future__ import annotations

from typing import Any

import pytest

from service.collector import sampling, sources
from service.collector.sampling import Sampler, cpu_samples
from service.collector.sources import Reading

RATE = 1.5  # cores, steady


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SlowTree:
    """A process tree read a file at a time: its CPU is counted during the read, which takes the next of
    ``durations`` (a busy machine: some reads take most of an interval)."""

    def __init__(self, clock: Clock, durations: list[float]) -> None:
        self.clock, self.durations = clock, iter(durations)

    def read(self) -> Reading:
        took = next(self.durations)
        self.clock.now += took / 2
        cpu = RATE * self.clock.now
        self.clock.now += took / 2
        return Reading(cpu_seconds=cpu, working_set_bytes=1 << 20)


def test_a_slow_read_does_not_skew_the_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(sampling.time, "monotonic", clock)
    # reads of 0 to 150 ms, every 200 ms: stamped at their ends, the rates of this steady 1.5 cores ranged
    # from 1.18 to 2.06 cores (the test below), stamped at their middles they are all 1.5
    sampler = Sampler(SlowTree(clock, [0.0, 0.15, 0.0, 0.15, 0.01, 0.12, 0.0, 0.15, 0.0]), interval=0.2)
    for _ in range(9):
        sampler._take()
        clock.now += 0.2
    samples = cpu_samples(sampler._cpu, sampler.interval)
    assert len(samples) == 8
    assert samples == pytest.approx([RATE * 1000] * 8)


def test_the_end_stamp_is_what_skewed_them() -> None:
    # the same reads stamped at their ends: what the sampler did before (the test above is not vacuous)
    now, readings = 100.0, []
    for took in [0.0, 0.15, 0.0, 0.15, 0.01, 0.12, 0.0, 0.15, 0.0]:
        readings.append((now + took, RATE * (now + took / 2)))
        now += took + 0.2
    samples = cpu_samples(readings, 0.2)
    assert max(samples) > 1.3 * RATE * 1000
    assert min(samples) < 0.8 * RATE * 1000


class ReapedWhileRead:
    """/proc for a parent (1) and its child (2), each with 1 s of CPU of its own: the child is reaped
    right after the first stat file of a reading is read, its time moving to the parent's cutime."""

    def __init__(self) -> None:
        self.stat = {1: [100, 0, 0, 0], 2: [100, 0, 0, 0]}  # utime, stime, cutime, cstime in ticks
        self.reads = 0

    def path(self, name: str) -> Any:
        proc = self

        class FakePath:
            def read_text(self) -> str:
                pid = int(name.split("/")[2])
                if pid not in proc.stat:
                    raise FileNotFoundError(name)
                fields = ["S", "0", *["0"] * 9, *map(str, proc.stat[pid]), "0"]
                text = f"{pid} (x) {' '.join(fields)}"
                proc.reads += 1
                if proc.reads == 1:  # the reap, between this read and the next
                    proc.stat[1][2] += sum(proc.stat.pop(2)[:2])
                return text

        return FakePath()


def test_a_child_reaped_during_a_read_is_never_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    # test_sending.py's spooled run measured 2.98 CPU-s for 2.11 (tests/collector/helpers.py's check): the
    # parent was read before its child's reap and the child after it, so the reading missed the child's
    # second; every reading before that dip was lowered to it, and the second came back in the last interval
    proc = ReapedWhileRead()
    monkeypatch.setattr(sources, "Path", proc.path)
    monkeypatch.setattr(sources, "_pss", lambda pid: 0)
    tree = sources.ProcTree(1)
    monkeypatch.setattr(tree, "_tree", lambda: [1, 2])  # as _tree lists them: a parent before its children
    reading = tree.read()
    assert reading.cpu_seconds >= 200 / sources.CLK_TCK  # both seconds: counted twice at worst, never once
