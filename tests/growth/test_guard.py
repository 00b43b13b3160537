"""The guard's decisions, turn by turn, on a cgroup v2 directory's files as the kernel writes them (this
machine's memory controller is cgroup v1, which the tests in test_local.py and test_kubernetes.py use
for real): growth at the threshold of the limit in force, none for page cache, the OOM kills it sees,
the events as the wire contract §2 has them, and the Kubernetes conditions it follows."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from service.growth.block import GrowBlock
from service.growth.cgroups import Memory
from service.growth.guard import MAX_EVENTS, Guard, Record
from service.growth.kube import _condition
from service.growth.local import CgroupActuator

from .helpers import MIB


def _v2(path: Path, *, current: int, inactive: int = 0, oom_kill: int = 0, limit: int | str = 256 * MIB) -> Path:
    path.mkdir(exist_ok=True)
    (path / "memory.current").write_text(f"{current}\n")
    (path / "memory.stat").write_text(f"anon {current - inactive}\nfile {inactive}\ninactive_file {inactive}\n")
    (path / "memory.events").write_text(f"low 0\nhigh 0\nmax 0\noom 0\noom_kill {oom_kill}\noom_group_kill 0\n")
    (path / "memory.max").write_text(f"{limit}\n")
    return path


def _guard(cg: Path, said: list[str], block: GrowBlock | None = None) -> Guard:
    memory = Memory(cg)
    return Guard(memory=memory, block=block or GrowBlock(1 << 30, 80, 128 * MIB), actuator=CgroupActuator(memory),
                 poll=0.01, say=said.append)  # fmt: skip


def test_grows_at_the_threshold_of_the_limit_in_force(tmp_path: Path) -> None:
    said: list[str] = []
    cg = _v2(tmp_path / "cg", current=200 * MIB)
    guard = _guard(cg, said)
    guard._tick()
    assert (cg / "memory.max").read_text() == f"{256 * MIB}\n"  # below 80 % of 256 MiB
    _v2(cg, current=210 * MIB)
    guard._tick()
    assert (cg / "memory.max").read_text() == str(384 * MIB)  # written as memory.max, v2's limit
    guard._tick()  # 210 MiB is below 80 % of the new limit: nothing more
    _v2(cg, current=700 * MIB, limit=384 * MIB)
    guard._tick()  # far past: enough steps at once to put it under the threshold again
    assert (cg / "memory.max").read_text() == str(896 * MIB)
    report = guard.stop()
    assert [(e.from_bytes, e.to_bytes, e.result) for e in report.events] == [
        (256 * MIB, 384 * MIB, "grown"),
        (384 * MIB, 896 * MIB, "grown"),
    ]
    assert report.peak_bytes == 700 * MIB
    assert report.limit_bytes == 896 * MIB
    assert report.oom_kills == 0
    assert said == [
        "ci-sizer: growth (cgroup): 256 MiB -> 384 MiB: grown",
        "ci-sizer: growth (cgroup): 384 MiB -> 896 MiB: grown",
    ]
    event = report.growths()[0]
    assert set(event) == {"at", "from_bytes", "to_bytes", "result"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event["at"])  # RFC 3339, as finished_at


def test_page_cache_is_not_grown_for(tmp_path: Path) -> None:
    # 250 MiB charged, 100 MiB of it inactive page cache the kernel reclaims before it kills
    cg = _v2(tmp_path / "cg", current=250 * MIB, inactive=100 * MIB)
    guard = _guard(cg, [])
    guard._tick()
    report = guard.stop()
    assert report.events == []
    assert report.peak_bytes == 150 * MIB  # the working set, as the kubelet counts it


def test_an_oom_kill_is_reported_too_late(tmp_path: Path) -> None:
    cg = _v2(tmp_path / "cg", current=100 * MIB, oom_kill=2)  # kills before the guard started are not its own
    said: list[str] = []
    guard = _guard(cg, said)
    guard._tick()
    _v2(cg, current=255 * MIB, oom_kill=3)
    guard._tick()  # the turn that sees the kill does not grow for the victim's memory
    guard._tick()  # nor the next ones while it is still charged (freed slowly on a busy machine)
    guard._tick()
    report = guard.stop()
    assert [(e.from_bytes, e.to_bytes, e.result) for e in report.events] == [(256 * MIB, 256 * MIB, "too_late")]
    assert report.limit_bytes == 256 * MIB  # the limit the build was killed at, as posted
    assert report.oom_kills == 1
    assert said == ["ci-sizer: growth (cgroup): 256 MiB: too_late"]


def test_no_limit_nothing_to_grow_and_a_cgroup_that_is_not_writable(tmp_path: Path) -> None:
    cg = _v2(tmp_path / "cg", current=900 * MIB, limit="max")
    guard = _guard(cg, [])
    guard._tick()
    assert guard.stop().events == []
    said: list[str] = []
    cg = _v2(tmp_path / "ro", current=250 * MIB)
    guard = _guard(cg, said)
    (cg / "memory.max").unlink()  # a limit that cannot be written (as root, permissions would not refuse)
    (cg / "memory.max").mkdir()
    guard._tick()
    guard._tick()  # asked once: a cgroup that refused a write is not asked again
    report = guard.stop()
    assert [(e.from_bytes, e.to_bytes, e.result) for e in report.events] == [(256 * MIB, 384 * MIB, "error")]
    assert said[0].startswith(f"ci-sizer: growth (cgroup): 256 MiB -> 384 MiB: error ({cg} is not writable: ")


def test_the_events_are_bounded(tmp_path: Path) -> None:
    said: list[str] = []
    cg = _v2(tmp_path / "cg", current=100 * MIB)
    guard = _guard(cg, said)
    for _ in range(MAX_EVENTS + 5):
        guard.record("deferred", 256 * MIB, 384 * MIB)
    said.clear()
    assert len(guard.stop().events) == MAX_EVENTS
    assert said == [f"ci-sizer: 5 growth event(s) past the first {MAX_EVENTS} are not posted"]


class _Waiting:
    """An actuator that answers only when told to (as a kubelet does, later)."""

    name = "test"
    inline = False

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.answer = threading.Event()

    def grow(self, current: int, target: int, record: Record, cancelled: threading.Event) -> bool:
        self.asked.append(target)
        self.answer.wait(5)
        record("grown", current, target, "")
        return True

    def close(self) -> None:
        pass


def test_one_ask_at_a_time(tmp_path: Path) -> None:
    cg = _v2(tmp_path / "cg", current=230 * MIB)
    memory = Memory(cg)
    actuator = _Waiting()
    guard = Guard(
        memory=memory, block=GrowBlock(1 << 30, 80, 128 * MIB), actuator=actuator, poll=0.01, say=lambda m: None
    )
    guard._tick()
    guard._tick()
    guard._tick()  # above the threshold all along, the answer not in yet: asked once
    actuator.answer.set()
    report = guard.stop()
    assert actuator.asked == [384 * MIB]
    assert [e.result for e in report.events] == ["grown"]


def test_a_condition_about_an_older_resize_is_not_this_one_s() -> None:
    pending = {"type": "PodResizePending", "status": "True", "reason": "Deferred", "observedGeneration": 2}
    pod = {"status": {"conditions": [pending]}}
    assert _condition(pod, "PodResizePending", 3) is None  # the kubelet has not seen generation 3 yet
    assert _condition(pod, "PodResizePending", 2) == pending
    without = {"status": {"conditions": [{k: v for k, v in pending.items() if k != "observedGeneration"}]}}
    assert _condition(without, "PodResizePending", 3) is not None  # a kubelet that does not say: taken as is
    assert _condition({"status": {"conditions": [{**pending, "status": "False"}]}}, "PodResizePending", 2) is None


def test_after_a_kill_growth_resumes_once_the_victim_s_memory_is_freed(tmp_path: Path) -> None:
    # a build that goes on after one of its processes was killed (make -k, a test runner's worker): the
    # next rise past the threshold is the build's own again, and is grown for
    cg = _v2(tmp_path / "cg", current=100 * MIB)
    guard = _guard(cg, [])
    guard._tick()
    _v2(cg, current=256 * MIB, oom_kill=1)
    guard._tick()
    guard._tick()  # still charged: nothing asked
    _v2(cg, current=90 * MIB)  # freed
    guard._tick()
    _v2(cg, current=230 * MIB)  # past 80 % of 256 MiB
    guard._tick()
    report = guard.stop()
    assert [(e.from_bytes, e.to_bytes, e.result) for e in report.events] == [
        (256 * MIB, 256 * MIB, "too_late"),
        (256 * MIB, 384 * MIB, "grown"),
    ]
