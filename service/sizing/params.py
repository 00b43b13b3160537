"""The sizing parameters, declared once: their defaults, bounds and docs (rules S5, S9).

The route's query parameters, the fast path's query parsing, the backtest's parameter grid, the CLI's
flags and the OpenAPI document all read them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Standard library only: the CLI (also on a runner, where `ci-sizer collect` runs without the
# service's dependencies) reads these too.

CpuPercentile = Literal["peak", "p99", "p95", "p75", "p50", "avg"]
STAT_NAMES: tuple[CpuPercentile, ...] = ("peak", "p99", "p95", "p75", "p50", "avg")


@dataclass(frozen=True)
class Bound:
    """One integer parameter: its default, its inclusive bounds and what it means."""

    name: str
    default: int
    ge: int
    le: int
    doc: str

    def ok(self, value: int) -> bool:
        return self.ge <= value <= self.le


RUNS = Bound("runs", 5, 1, 100, "newest clean runs to analyse (rule S5)")
BUFFER = Bound("buffer", 20, 0, 1000, "CPU headroom in percent (rule S9)")
DEFAULT_CPU_PERCENTILE: CpuPercentile = "p95"
CPU_PERCENTILE_DOC = "CPU stat to size from (rule S9)"


@dataclass(frozen=True)
class SizingParams:
    """The parameters one answer is computed with; ``SizingParams()`` is the default set."""

    runs: int = RUNS.default
    buffer: int = BUFFER.default
    cpu_percentile: CpuPercentile = DEFAULT_CPU_PERCENTILE

    def __post_init__(self) -> None:
        for bound in (RUNS, BUFFER):
            value = getattr(self, bound.name)
            if not bound.ok(value):
                raise ValueError(f"{bound.name} must be from {bound.ge} to {bound.le}, not {value}")
        if self.cpu_percentile not in STAT_NAMES:
            raise ValueError(f"cpu_percentile must be one of {', '.join(STAT_NAMES)}")


DEFAULT = SizingParams()
