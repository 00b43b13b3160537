"""A pod as Kubernetes counts it (``shared/spec/placement.md``, PK7, P7-P8): requests aggregated over
containers, sidecars and init containers plus overhead, the non-zero requests the Fit scorers
score, limits and the containers without one; the pod of a job's recommended containers; and the
pod as the reply describes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service import core
from service.placement.schemas import PlacementContainer, PlacementPod
from service.quantity import format_cpu, format_memory
from service.sizing.answer import Answer

NONZERO_CPU = 100  # millicores: what a container without a CPU request counts when scoring (P7)
NONZERO_MEMORY = 200 * core.MIB  # P7


@dataclass(frozen=True)
class PodTotals:
    """One pod in the units the core takes: requests as the fit filter counts them, non-zero
    requests as NodeResourcesFit scores them, limits, containers without a limit, and the
    extended resources it requests (by name)."""

    req_cpu: int
    req_mem: int
    nz_cpu: int
    nz_mem: int
    lim_cpu: int
    lim_mem: int
    miss_cpu: int
    miss_mem: int
    extended: dict[str, int] = field(default_factory=dict)

    def as_tuple(self, ext_names: Sequence[str] = ()) -> tuple[int, ...]:
        return (
            self.req_cpu,
            self.req_mem,
            self.nz_cpu,
            self.nz_mem,
            self.lim_cpu,
            self.lim_mem,
            self.miss_cpu,
            self.miss_mem,
            *(self.extended.get(name, 0) for name in ext_names),
        )


def _request(c: PlacementContainer, resource: str) -> int | None:
    """A container's request; a limit without a request is the request (PK7, SetDefaults_Pod)."""
    value: int | None = getattr(c.requests, resource)
    return getattr(c.limits, resource) if value is None else value


def _aggregate(pod: PlacementPod, value: Callable[[PlacementContainer], int]) -> int:
    """``AggregateContainerRequests`` of k8s.io/component-helpers (PK7): the containers' sum plus
    every sidecar (an init container with ``restart_policy: Always``); a regular init container
    counts its own value plus the sidecars started before it; the pod takes the larger."""
    total = sum(value(c) for c in pod.container_list())
    sidecars = init_max = 0
    for c in pod.init_containers:
        v = value(c)
        if c.restart_policy == "Always":
            total += v
            sidecars += v
            init_max = max(init_max, sidecars)
        else:
            init_max = max(init_max, v + sidecars)
    return max(total, init_max)


def pod_totals(pod: PlacementPod, *, placing: bool) -> PodTotals:
    """Kubernetes' pod arithmetic (PK7): requests aggregated as ``_aggregate`` does, plus
    overhead; a container without a request (after a limit set it) counts 100m/200Mi when the Fit
    scorers score, an explicit 0 stays 0. The limit of the pod being placed follows the same rule
    (P8); the limits of pods already on a node are the sum of their containers' limits, as the
    proposal in 003 computes them."""
    cs, oh = pod.container_list(), pod.overhead

    def rq(resource: str, unset: int) -> int:
        def one(c: PlacementContainer) -> int:
            v = _request(c, resource)
            return unset if v is None else v

        return _aggregate(pod, one) + (getattr(oh, resource) or 0)

    def lim(resource: str) -> tuple[int, int]:
        if placing:
            total = _aggregate(pod, lambda c: getattr(c.limits, resource) or 0) + (getattr(oh, resource) or 0)
            running = [*cs, *(c for c in pod.init_containers if c.restart_policy == "Always")]
            return total, sum(getattr(c.limits, resource) is None for c in running)
        given = [getattr(c.limits, resource) for c in cs]
        return sum(v for v in given if v is not None), sum(v is None for v in given)

    names = {n for c in (*cs, *pod.init_containers) for n in (*c.requests.extended, *c.limits.extended)}
    extended = {}
    for name in sorted(names):

        def ext(c: PlacementContainer, name: str = name) -> int:
            return c.requests.extended.get(name, c.limits.extended.get(name, 0))

        value = _aggregate(pod, ext) + oh.extended.get(name, 0)
        if value:
            extended[name] = value
    lim_cpu, miss_cpu = lim("cpu")
    lim_mem, miss_mem = lim("memory")
    return PodTotals(
        rq("cpu", 0), rq("memory", 0), rq("cpu", NONZERO_CPU), rq("memory", NONZERO_MEMORY),
        lim_cpu, lim_mem, miss_cpu, miss_mem, extended,
    )  # fmt: skip


def pod_from_answer(answer: Answer, *, cpu_limit: str = "as-applied") -> PlacementPod:
    """A pod of the job's recommended containers; CPU limits only where the sizer enforces them,
    or everywhere with ``cpu_limit="enforce"`` (the limits enforce mode would give, PK9)."""
    containers = []
    for c in answer.containers:
        containers.append(
            PlacementContainer.model_validate(
                {
                    "requests": {
                        "cpu": f"{c.cpu.request_millicores}m",
                        "memory": str(c.memory.request_bytes),
                    },
                    "limits": {
                        "cpu": f"{c.cpu.limit_millicores}m" if c.cpu.enforced or cpu_limit == "enforce" else None,
                        "memory": str(c.memory.limit_bytes),
                    },
                }
            )
        )
    return PlacementPod(containers=containers)


def _total(cpu: int, memory: int) -> dict[str, Any]:
    return {"cpu": format_cpu(cpu), "cpu_millicores": cpu, "memory": format_memory(memory), "memory_bytes": memory}


def describe_pod(t: PodTotals, source: str, phase: str | None = None, degraded: bool = False) -> dict[str, Any]:
    return {
        "requests": _total(t.req_cpu, t.req_mem),
        "limits": _total(t.lim_cpu, t.lim_mem),
        "containers_without_limit": {"cpu": t.miss_cpu, "memory": t.miss_mem},
        "source": source,
        "phase": phase,
        "degraded": degraded,
    }
