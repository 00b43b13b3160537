"""The sizing answer as a type: what ``compute`` returns, what the formats render and what the cache
keeps. ``as_dict`` gives the wire shape (``SizingPublic``), field for field and in the same order."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

Phase = Literal["unknown", "learning", "confident"]
Source = Literal["algorithm", "org", "repo", "workflow", "job"]
OverrideScope = Literal["job", "workflow", "repo", "org", "global"]
SizingPolicy = Literal["seed", "efficient", "growth"]


@dataclass(slots=True)
class Sources:
    request: Source
    limit: Source


@dataclass(slots=True)
class Cpu:
    request: str
    limit: str
    request_millicores: int
    limit_millicores: int
    enforced: bool
    source: Sources


@dataclass(slots=True)
class Memory:
    request: str
    limit: str
    request_bytes: int
    limit_bytes: int
    source: Sources


@dataclass(slots=True)
class Observed:
    cpu_millicores: float | None
    memory_bytes: int | None


@dataclass(slots=True)
class Oom:
    consecutive: int
    backoff_factor: int
    capped: bool


@dataclass(slots=True)
class RunnerCeiling:
    capped: bool
    fields: list[str]


@dataclass(slots=True)
class Grow:
    """How far a run may grow in place (rules G1-G5, docs/sizing.md): the guard reads these three."""

    max: str
    max_bytes: int
    threshold_percent: int
    step: str
    step_bytes: int


@dataclass(slots=True)
class Container:
    name: str
    cpu: Cpu
    memory: Memory
    observed: Observed
    oom: Oom
    #: present when runner ceilings are configured for the org
    runner_ceiling: RunnerCeiling | None = None
    #: None: this container must not grow (rule G1)
    grow: Grow | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "cpu": {
                "request": self.cpu.request,
                "limit": self.cpu.limit,
                "request_millicores": self.cpu.request_millicores,
                "limit_millicores": self.cpu.limit_millicores,
                "enforced": self.cpu.enforced,
                "source": {"request": self.cpu.source.request, "limit": self.cpu.source.limit},
            },
            "memory": {
                "request": self.memory.request,
                "limit": self.memory.limit,
                "request_bytes": self.memory.request_bytes,
                "limit_bytes": self.memory.limit_bytes,
                "source": {"request": self.memory.source.request, "limit": self.memory.source.limit},
            },
            "observed": {"cpu_millicores": self.observed.cpu_millicores, "memory_bytes": self.observed.memory_bytes},
            "oom": {
                "consecutive": self.oom.consecutive,
                "backoff_factor": self.oom.backoff_factor,
                "capped": self.oom.capped,
            },
        }
        if self.runner_ceiling is not None:
            out["runner_ceiling"] = {"capped": self.runner_ceiling.capped, "fields": list(self.runner_ceiling.fields)}
        g = self.grow
        out["grow"] = (
            None
            if g is None
            else {
                "max": g.max,
                "max_bytes": g.max_bytes,
                "threshold_percent": g.threshold_percent,
                "step": g.step,
                "step_bytes": g.step_bytes,
            }
        )
        return out


@dataclass(slots=True)
class Meta:
    phase: Phase
    clean_samples: int
    runs_analyzed: int
    runs: int
    buffer: int
    cpu_percentile: str
    override_scope: OverrideScope
    cpu_sizing_mode: Literal["observe", "enforce"]
    memory_qos: Literal["guaranteed", "burstable"]
    policy: SizingPolicy
    node_ceiling_bytes: int | None
    generated_at: str
    degraded: bool = False


@dataclass(slots=True)
class Answer:
    org: str
    repo: str
    workflow: str
    job: str
    containers: list[Container]
    meta: Meta

    def as_dict(self) -> dict[str, Any]:
        m = self.meta
        return {
            "org": self.org,
            "repo": self.repo,
            "workflow": self.workflow,
            "job": self.job,
            "containers": [c.as_dict() for c in self.containers],
            "meta": {
                "phase": m.phase,
                "clean_samples": m.clean_samples,
                "runs_analyzed": m.runs_analyzed,
                "runs": m.runs,
                "buffer": m.buffer,
                "cpu_percentile": m.cpu_percentile,
                "override_scope": m.override_scope,
                "cpu_sizing_mode": m.cpu_sizing_mode,
                "memory_qos": m.memory_qos,
                "policy": m.policy,
                "node_ceiling_bytes": m.node_ceiling_bytes,
                "generated_at": m.generated_at,
                "degraded": m.degraded,
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Answer:
        """The type from the wire shape (``as_dict``'s inverse)."""

        def container(c: dict[str, Any]) -> Container:
            cpu, memory, ceiling, grow = c["cpu"], c["memory"], c.get("runner_ceiling"), c.get("grow")
            return Container(
                name=c["name"],
                cpu=Cpu(**{**cpu, "source": Sources(**cpu["source"])}),
                memory=Memory(**{**memory, "source": Sources(**memory["source"])}),
                observed=Observed(**c["observed"]),
                oom=Oom(**c["oom"]),
                runner_ceiling=None if ceiling is None else RunnerCeiling(**ceiling),
                grow=None if grow is None else Grow(**grow),
            )

        return cls(
            org=d["org"],
            repo=d["repo"],
            workflow=d["workflow"],
            job=d["job"],
            containers=[container(c) for c in d["containers"]],
            meta=Meta(**d["meta"]),
        )

    def pod_requests(self) -> tuple[int, int]:
        """Requests summed over the containers: the job's pod size (millicores, bytes)."""
        return (
            sum(c.cpu.request_millicores for c in self.containers),
            sum(c.memory.request_bytes for c in self.containers),
        )

    def marked_degraded(self) -> Answer:
        """A copy marked ``meta.degraded`` (the cached answer itself is left as it was)."""
        return replace(self, meta=replace(self.meta, degraded=True))
