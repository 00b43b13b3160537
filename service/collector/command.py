"""``run_collect``: run (or watch), measure, post; the exit code is the wrapped command's."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from service.collector.outbox import send, spool
from service.collector.payload import Identity, payload
from service.collector.sampling import Measurement, Sampler
from service.collector.sources import NoReadings, ProcTree, Reading, Source, _own_peak_rss, cgroup_source

if TYPE_CHECKING:
    from service.growth import Options, Report


#: what the spawn may add to the collector's resident set after the high-water mark is read (a pipe,
#: the Popen object): a command's ru_maxrss above the mark by less than this is taken as inherited
INHERITED_SLACK_BYTES = 1 << 20


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
    grow: Options | None = None,
    say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> int:
    """Run (or watch), measure, post; the exit code is the wrapped command's. A cgroup that cannot
    be read still runs the command, unmeasured (watching one raises ValueError). With ``grow``, a
    guard raises the build's memory limit before the kernel kills it (``service.growth``)."""
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
    grown: Report | None = None
    if grow is not None and not command:
        say("ci-sizer: --grow guards a command run after --, not a watched cgroup; growth is off")
    if command:
        from service import growth

        guard = growth.prepare(grow, say) if grow is not None else None
        # the command's ru_maxrss starts at what the collector's memory was when it forked; VmHWM is
        # read before and after the spawn, since the kernel updates the high-water mark lazily (a
        # read after the collector freed memory can be below what the fork carried), and a page or so
        # that the spawn itself allocates is within the slack
        inherited = _own_peak_rss()
        try:
            child, guard = growth.spawn(command, guard, say)
        except OSError as exc:
            say(f"ci-sizer: cannot run {command[0]!r}: {exc}")
            return 127
        inherited = max(inherited, _own_peak_rss()) + INHERITED_SLACK_BYTES
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
        grown = guard.stop() if guard is not None else None
        if sampler is None:
            return code
        final = None
        if isinstance(source, ProcTree):
            # ru_maxrss never falls below the collector's own peak when it started the command:
            # it is the command's own only above that
            maxrss = usage.ru_maxrss * 1024
            final = Reading(usage.ru_utime + usage.ru_stime, maxrss if maxrss > inherited else 0)
        measured = sampler.stop(final)
        if grown is not None:
            _merge(measured, grown)
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
    body = payload(identity, measured, container, grown.growths() if grown is not None else None)
    if not url:
        say("ci-sizer: no --url (CI_SIZER_URL); the run is only spooled")
        say(f"ci-sizer: spooled the run to {spool(spool_dir, body)}")
        return code
    outcome = send(url, token, body, retries=retries, backoff=backoff, timeout=timeout, say=say)
    if outcome is False and "growths" in body["containers"][0]:
        # a sizer from before growth refuses the field: the run itself is still worth storing
        say("ci-sizer: posting the run again without its growth events (a sizer older than growth refuses them)")
        del body["containers"][0]["growths"]
        outcome = send(url, token, body, retries=0, backoff=0, timeout=timeout, say=say)
    if outcome is None:
        say(f"ci-sizer: the sizer is unreachable; spooled the run to {spool(spool_dir, body)} "
            f"(send later with: ci-sizer collect --flush {spool_dir})")  # fmt: skip
    elif outcome:
        samples = measured.cpu_samples_millicores
        say(f"ci-sizer: posted run {identity.run_id} ({len(samples)} samples, "
            f"peak {max(samples):.0f}m CPU, {measured.memory_peak_bytes / 2**20:.0f} MiB working set)")  # fmt: skip
    return code


def _merge(measured: Measurement, grown: Report) -> None:
    """What the guard saw, many times a second, over what was sampled: the true peak, the limit the build
    ended with, the kernel's OOM kills."""
    measured.memory_peak_bytes = max(measured.memory_peak_bytes, grown.peak_bytes)
    if grown.limit_bytes is not None:
        measured.memory_limit_bytes = grown.limit_bytes
    if grown.oom_kills is not None:
        measured.oom_kill_events = max(measured.oom_kill_events or 0, grown.oom_kills)
