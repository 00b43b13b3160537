"""Wire schemas of backtests."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from service.sizing.params import BUFFER, DEFAULT_CPU_PERCENTILE, RUNS
from service.wire import CpuPercentile, Name, Strict, Timestamp, to_naive_utc

# the grid's items, strict (a JSON number, never a numeric string), bounded as the live answer's parameters
RunsItem = Annotated[int, Field(strict=True, ge=RUNS.ge, le=RUNS.le)]
BufferItem = Annotated[int, Field(strict=True, ge=BUFFER.ge, le=BUFFER.le)]


class BacktestCreate(Strict):
    org: Name | None = Field(default=None, description="one org's jobs; leave out for all (a token for every org)")
    since: Timestamp | None = None
    until: Timestamp | None = None
    runs: list[RunsItem] = Field(default=[RUNS.default], min_length=1, max_length=10)
    buffer: list[BufferItem] = Field(default=[BUFFER.default], min_length=1, max_length=10)
    cpu_percentile: list[CpuPercentile] = Field(default=[DEFAULT_CPU_PERCENTILE], min_length=1, max_length=6)
    memory_qos: list[Literal["guaranteed", "burstable"]] = Field(default=["guaranteed"], min_length=1, max_length=2)
    baselines: Annotated[bool, Field(strict=True)] = Field(
        default=True, description="add the fixed default and the approximations of other right-sizers"
    )
    efficient: Annotated[bool, Field(strict=True)] = Field(
        default=True, description="add the efficient sizing policy (rules E1-E13) beside each seed parameter set"
    )

    @field_validator("since", "until")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else to_naive_utc(value)

    @model_validator(mode="after")
    def _bounded(self) -> BacktestCreate:
        sets = len(self.runs) * len(self.buffer) * len(self.cpu_percentile) * len(self.memory_qos)
        if sets > 50:
            raise ValueError(f"at most 50 parameter sets in one backtest, not {sets}")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("since must be before until")
        return self
