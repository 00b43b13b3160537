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

Modules, by concern:

- ``sources``: the readings (cgroup v2, cgroup v1, the command's process tree) and ``cgroup_source``;
- ``mounts``: finding cgroups through /proc/self/mountinfo and /proc/self/cgroup;
- ``sampling``: the sampler thread and the CPU rate between readings;
- ``payload``: the run's identity (from the CI environment) and the body that is posted;
- ``outbox``: posting with retries under a time bound, the spool and ``--flush``;
- ``command``: ``run_collect``, the ``collect`` command itself.

With ``--grow``, ``service.growth`` raises the build's memory limit before the kernel kills it, and the
run carries its growth events (docs/integrations/growth.md).
"""

from __future__ import annotations

from service.collector.command import run_collect
from service.collector.outbox import flush, spool
from service.collector.payload import Identity, identity_from_env

__all__ = ["Identity", "flush", "identity_from_env", "run_collect", "spool"]
