"""Issue 19: the sizing parameters are declared once (sizing/params.py) and the answer is a type
(sizing/answer.py) whose wire shape is the API's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.backtests.schemas import BacktestCreate
from service.keys import ScopeKey
from service.sizing import service as sizing_service
from service.sizing.answer import Answer
from service.sizing.ceilings import Ceiling
from service.sizing.history import History
from service.sizing.params import BUFFER, DEFAULT, RUNS, SizingParams

OPENAPI = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def _sizing_query_params() -> dict[str, dict[str, object]]:
    doc = json.loads(OPENAPI.read_text())
    op = doc["paths"]["/api/v1/sizing/{org}/{repo}/{workflow}/{job}"]["get"]
    return {p["name"]: p for p in op["parameters"] if p["in"] == "query"}


def test_the_openapi_document_reads_the_declared_bounds_and_defaults() -> None:
    """Rules S5, S9: the route's runs/buffer bounds, defaults and docs are SizingParams' own."""
    params = _sizing_query_params()
    for bound in (RUNS, BUFFER):
        schema = params[bound.name]["schema"]
        assert (schema["minimum"], schema["maximum"], schema["default"]) == (bound.ge, bound.le, bound.default)
        assert params[bound.name]["description"] == bound.doc
    assert params["cpu_percentile"]["schema"]["default"] == DEFAULT.cpu_percentile


def test_the_backtest_grid_uses_the_same_bounds() -> None:
    assert BacktestCreate().runs == [RUNS.default]
    assert BacktestCreate().buffer == [BUFFER.default]
    with pytest.raises(ValueError, match="less than or equal"):
        BacktestCreate(runs=[RUNS.le + 1])
    with pytest.raises(ValueError, match="greater than or equal"):
        BacktestCreate(buffer=[BUFFER.ge - 1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"runs": 0}, "runs must be from 1"),
        ({"buffer": 1001}, "buffer must be from 0"),
        ({"cpu_percentile": "p42"}, "cpu_percentile"),
    ],
)
def test_sizing_params_refuse_what_the_route_refuses(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SizingParams(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("ceilings", [{}, {"*": Ceiling(cpu_request=100, memory_limit=1 << 30)}])
def test_the_typed_answer_round_trips_through_its_wire_shape(ceilings: dict[str, Ceiling]) -> None:
    key = ScopeKey("o", "r", "w", "j")
    policy = sizing_service.Policy(ceilings=ceilings)
    answer = sizing_service.compute(key=key, history=History(), pins={}, params=DEFAULT, policy=policy)
    wire = answer.as_dict()
    assert ("runner_ceiling" in wire["containers"][0]) == bool(ceilings)  # present only when configured
    if ceilings:
        assert wire["containers"][0]["cpu"]["request_millicores"] == 100
        assert wire["containers"][0]["runner_ceiling"] == {"capped": True, "fields": ["cpu.request", "memory.limit"]}
    assert Answer.from_dict(wire) == answer
    assert Answer.from_dict(wire).as_dict() == wire
    degraded = sizing_service.degraded(key=key, last=answer, params=DEFAULT, policy=policy)
    assert degraded.meta.degraded
    assert not answer.meta.degraded  # the answer it was made from is not changed
