"""Runner ceilings: per-org maxima that a CI runner enforces on what a job may ask for.

GitLab's Kubernetes executor fails a job whose ``KUBERNETES_*`` variables exceed the runner's
``*_overwrite_max_allowed``; other runners have their own limits. Operators list them in a file
(``CI_SIZER_RUNNER_CEILINGS_FILE``, TOML or YAML); every answer for that org is clamped to them,
pins included, and each container says whether it was (``runner_ceiling.capped``)::

    [[ceilings]]
    org = "acme"          # or "*": every org without an entry of its own (field by field)
    cpu_limit = "4"
    memory_limit = "16Gi"
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator

from service.quantity import format_cpu, format_memory, parse_cpu_millicores, parse_memory_bytes
from service.settings import read_config_file
from service.sizing.answer import Container, RunnerCeiling

FIELDS = ("cpu_request", "cpu_limit", "memory_request", "memory_limit")


class CeilingsFileError(ValueError):
    """The ceilings file cannot be read or is invalid."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    org: str
    cpu_request: str | None = None
    cpu_limit: str | None = None
    memory_request: str | None = None
    memory_limit: str | None = None

    @field_validator("cpu_request", "cpu_limit")
    @classmethod
    def _cpu(cls, v: str | None) -> str | None:
        if v is not None and parse_cpu_millicores(v) <= 0:
            raise ValueError("must be a positive CPU quantity")
        return v

    @field_validator("memory_request", "memory_limit")
    @classmethod
    def _memory(cls, v: str | None) -> str | None:
        if v is not None and parse_memory_bytes(v) <= 0:
            raise ValueError("must be a positive memory quantity")
        return v


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ceilings: list[_Entry] = []


@dataclass(frozen=True)
class Ceiling:
    """Maxima in millicores and bytes; None: no maximum for that field."""

    cpu_request: int | None = None
    cpu_limit: int | None = None
    memory_request: int | None = None
    memory_limit: int | None = None


def load(path: Path | None) -> dict[str, Ceiling]:
    if path is None:
        return {}
    parsed = read_config_file(path, _File, "ceilings", CeilingsFileError)
    out: dict[str, Ceiling] = {}
    for e in parsed.ceilings:
        if e.org in out:
            raise CeilingsFileError(f"ceilings file {path} lists org {e.org!r} twice")
        out[e.org] = Ceiling(
            cpu_request=None if e.cpu_request is None else parse_cpu_millicores(e.cpu_request),
            cpu_limit=None if e.cpu_limit is None else parse_cpu_millicores(e.cpu_limit),
            memory_request=None if e.memory_request is None else parse_memory_bytes(e.memory_request),
            memory_limit=None if e.memory_limit is None else parse_memory_bytes(e.memory_limit),
        )
    return out


def for_org(ceilings: Mapping[str, Ceiling], org: str) -> Ceiling | None:
    """The org's own entry, its gaps filled from ``*``; None when neither exists."""
    own, default = ceilings.get(org), ceilings.get("*")
    if own is None or default is None:
        return own or default
    return Ceiling(*(getattr(own, f) if getattr(own, f) is not None else getattr(default, f) for f in FIELDS))


def clamp(container: Container, ceiling: Ceiling) -> None:
    """Clamp one container of an answer in place and say so in ``runner_ceiling``."""
    capped: list[str] = []
    cpu, memory = container.cpu, container.memory
    for side in ("request", "limit"):
        maximum = getattr(ceiling, f"cpu_{side}")
        if maximum is not None and getattr(cpu, f"{side}_millicores") > maximum:
            setattr(cpu, f"{side}_millicores", maximum)
            setattr(cpu, side, format_cpu(maximum))
            capped.append(f"cpu.{side}")
    if cpu.request_millicores > cpu.limit_millicores:  # a request never above its limit
        cpu.request_millicores, cpu.request = cpu.limit_millicores, cpu.limit
    for side in ("request", "limit"):
        maximum = getattr(ceiling, f"memory_{side}")
        if maximum is not None and getattr(memory, f"{side}_bytes") > maximum:
            setattr(memory, f"{side}_bytes", maximum)
            setattr(memory, side, format_memory(maximum))
            capped.append(f"memory.{side}")
    if memory.request_bytes > memory.limit_bytes:
        memory.request_bytes, memory.request = memory.limit_bytes, memory.limit
    container.runner_ceiling = RunnerCeiling(capped=bool(capped), fields=capped)
