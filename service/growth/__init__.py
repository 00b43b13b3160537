"""Growth: ``ci-sizer collect --grow`` raises a running build's memory limit before the kernel kills it.

The collector wraps the build; with ``--grow`` it also learns the container's ``grow`` block (the most
the limit may grow to, the threshold, the step; ``block``) and a guard watches the build's cgroup many
times a second (``guard``, ``cgroups``). When the working set reaches the threshold of the limit in
force, an actuator raises the limit by a step:

- ``kube``: an in-place resize of the build's container through the pod's ``resize`` subresource,
  with the official Kubernetes client (the ``grow`` extra, imported only then);
- ``local``: on a VM or host where the collector runs as root, the build starts in a cgroup of its own
  at the answer's limit, and the guard raises that limit itself.

The run is posted with its growth events, the limit it ended with and its true peak. The guard never
makes a build fail that would otherwise have passed: when anything it needs is missing (no grow block,
no permission, the API down, a cgroup not writable) it says so in one line and the build runs as it
would have without ``--grow``. Standard library only, like the collector, except ``kube``'s client.
docs/integrations/growth.md says what growth needs and how to turn it off."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from service.growth.block import MIB, Plan, learn
from service.growth.cgroups import Memory, own_memory_dir
from service.growth.guard import Guard, NotResizable, Report

__all__ = ["MODES", "Guard", "Options", "Report", "prepare", "spawn"]

MODES = ("auto", "kubernetes", "cgroup")


@dataclass
class Options:
    mode: str = "auto"  #: auto: kubernetes in a pod (CI_SIZER_POD_NAME set), else cgroup when root
    answer_file: Path | None = None  #: the JSON answer the recipe saved; else GET from url
    url: str | None = None
    token: str | None = None
    names: tuple[str, str, str, str] = ("", "", "", "")  #: org, repo, workflow, job
    container: str = "build"  #: the answer's entry (the container's recorded name)
    pod_container: str | None = None  #: the container's name in the pod (default: ``container``)
    cgroup: str | None = None  #: kubernetes: the cgroup to watch (default: the collector's own)
    parent: Path | None = None  #: cgroup: where the build's cgroup is made (default: the collector's own)
    poll: float = 0.01
    notify: bool = True  #: cgroup v1: wake on the kernel's threshold notification as well as each poll
    timeout: float = 2.0
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)


def prepare(o: Options, say: Callable[[str], None]) -> Guard | None:
    """A guard ready to start, or None after one line saying why there is none."""
    mode = o.mode
    if mode == "auto":
        from service.growth.kube import POD_ENV

        if o.env.get(POD_ENV):
            mode = "kubernetes"
        elif o.env.get("KUBERNETES_SERVICE_HOST"):  # in a pod, but not told which one
            say(f"ci-sizer: growth is off: in a Kubernetes pod without {POD_ENV} (set it from the downward API); "
                "the build runs without growth")  # fmt: skip
            return None
        elif os.geteuid() == 0:
            mode = "cgroup"
        else:
            say(f"ci-sizer: growth is off: not in a pod ({POD_ENV} is not set) and not root (no cgroup of its own "
                "for the build); the build runs without growth")  # fmt: skip
            return None
    if mode == "kubernetes" and importlib.util.find_spec("kubernetes") is None:
        say("ci-sizer: growth is off: the Kubernetes client is not installed (pip install 'ci-sizer[grow]'); "
            "the build runs without growth")  # fmt: skip
        return None
    plan = learn(
        answer_file=o.answer_file, url=o.url, token=o.token, names=o.names, container=o.container,
        timeout=o.timeout, say=say,
    )  # fmt: skip
    if plan is None:
        return None
    try:
        guard = _kubernetes(o, plan, say) if mode == "kubernetes" else _local(o, plan, say)
    except (OSError, ValueError) as exc:  # NotResizable is a ValueError
        say(f"ci-sizer: growth is off: {exc}; the build runs without growth")
        return None
    except Exception as exc:  # the client's own failures: nothing the guard needs may stop the build
        say(f"ci-sizer: growth is off: {type(exc).__name__}: {exc}; the build runs without growth")
        return None
    b = plan.block
    start = guard.memory.limit()
    say(
        f"ci-sizer: growth on ({guard.actuator.name}, {guard.memory}): limit {_mib(start)}, up to {_mib(b.max_bytes)} "
        f"by {_mib(b.step_bytes)} at {b.threshold_percent}%"
    )
    return guard


def _mib(n: int | None) -> str:
    return "none" if n is None else f"{n / MIB:.0f} MiB"


def _kubernetes(o: Options, plan: Plan, say: Callable[[str], None]) -> Guard:
    from service.growth.kube import KubeActuator, pod_identity

    pod, namespace = pod_identity(o.env)
    watched = Path(o.cgroup) if o.cgroup and o.cgroup != "self" else own_memory_dir()
    memory = Memory(watched)
    limit = memory.limit()
    if limit is None or limit >= plan.block.max_bytes:
        memory.close()
        raise NotResizable(f"{memory} has limit {_mib(limit)}: nothing to grow up to {_mib(plan.block.max_bytes)}")
    try:
        actuator = KubeActuator(
            pod=pod, namespace=namespace, container=o.pod_container or o.container, timeout=o.timeout
        )
    except BaseException:
        memory.close()
        raise
    minus_self = own_memory_dir().resolve().is_relative_to(watched.resolve())
    return Guard(
        memory=memory, block=plan.block, actuator=actuator, poll=o.poll, say=say, minus_self=minus_self, notify=o.notify
    )


def _local(o: Options, plan: Plan, say: Callable[[str], None]) -> Guard:
    from service.growth.local import CgroupActuator, build_cgroup

    if plan.limit_bytes is None:
        raise NotResizable("the answer gives no memory limit to start the build at")
    if plan.limit_bytes >= plan.block.max_bytes:
        raise NotResizable(f"the answer's limit {_mib(plan.limit_bytes)} leaves nothing to grow")
    parent = o.parent or own_memory_dir()
    try:
        memory = build_cgroup(parent, plan.limit_bytes)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise NotResizable(f"no cgroup for the build below {parent} ({type(exc).__name__}: {why})") from None
    actuator = CgroupActuator(memory)
    return Guard(memory=memory, block=plan.block, actuator=actuator, poll=o.poll, say=say, owned=True, notify=o.notify)


def spawn(
    command: list[str], guard: Guard | None, say: Callable[[str], None]
) -> tuple[subprocess.Popen[bytes], Guard | None]:
    """Start the build, and the guard (for the local actuator the build's process enters the guard's
    cgroup between fork and exec). A build that cannot enter starts as it would have, unguarded.
    OSError when the command itself cannot run."""
    if guard is None:
        return subprocess.Popen(command), None
    try:
        fd = guard.enter_fd()
    except OSError as exc:
        say(f"ci-sizer: growth is off: cannot open {guard.memory.path}/cgroup.procs ({exc.strerror}); "
            "the build runs without growth")  # fmt: skip
        guard.stop()
        return subprocess.Popen(command), None
    guard.start()  # watching (and, on cgroup v1, armed) before the build allocates anything
    try:
        if fd is None:
            return subprocess.Popen(command), guard
        return subprocess.Popen(command, preexec_fn=lambda: os.write(fd, b"0")), guard
    except subprocess.SubprocessError:  # the child could not enter the cgroup, and never ran
        say(f"ci-sizer: growth is off: the build cannot enter {guard.memory}; the build runs without growth")
        guard.stop()
        return subprocess.Popen(command), None
    except OSError:
        guard.stop()
        raise
    finally:
        if fd is not None:
            os.close(fd)
