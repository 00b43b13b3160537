"""The golden scenarios of ``tests/golden/sizing.yaml``, end to end on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from service.quantity import parse_memory_bytes

from ..helpers import container, post_runs, run, sizing

SCENARIOS: list[dict[str, Any]] = yaml.safe_load((Path(__file__).parent.parent / "golden" / "sizing.yaml").read_text())


def _mem(value: Any) -> int:
    return parse_memory_bytes(str(value))


def _body(spec: dict[str, Any]) -> dict[str, Any]:
    containers = []
    for c in spec["c"]:
        containers.append(
            container(
                c.get("name", "build"),
                cpu=c.get("cpu", 100),
                mem=_mem(c.get("mem", "64Mi")),
                limit=_mem(c["limit"]) if "limit" in c else None,
                oom_killed=c.get("oom"),
            )
        )
    extra: dict[str, Any] = {}
    if "node" in spec:
        extra["node_memory_bytes"] = _mem(spec["node"])
    if "pod" in spec:
        extra["pod_memory_peak_bytes"] = _mem(spec["pod"])
    body = run(spec["n"], *containers, **extra)
    if "id" in spec:
        body["run_id"] = spec["id"]
    return body


def test_there_are_at_least_30_scenarios() -> None:
    assert len(SCENARIOS) >= 30


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
async def test_golden(make_client: Any, scenario: dict[str, Any]) -> None:
    async with make_client(**scenario.get("settings", {})) as client:
        await post_runs(client, *(_body(r) for r in scenario["runs"]))
        answer = await sizing(client, **scenario.get("params", {}))
    expect = scenario["expect"]
    meta = answer["meta"]
    for key in ("phase", "clean_samples", "runs_analyzed"):
        if key in expect:
            assert meta[key] == expect[key], key
    if "node_ceiling" in expect:
        assert meta["node_ceiling_bytes"] == _mem(expect["node_ceiling"])
    got = {c["name"]: c for c in answer["containers"]}
    assert list(got) == list(expect["containers"]), "containers"
    for name, want in expect["containers"].items():
        c = got[name]
        if "cpu" in want:
            assert [c["cpu"]["request"], c["cpu"]["limit"]] == [str(v) for v in want["cpu"]], (name, "cpu")
        if "mem" in want:
            assert [c["memory"]["request"], c["memory"]["limit"]] == [str(v) for v in want["mem"]], (name, "memory")
            assert c["memory"]["limit_bytes"] == _mem(want["mem"][1])
        if "oom" in want:
            assert [c["oom"]["consecutive"], c["oom"]["capped"]] == want["oom"], (
                name,
                "oom",
            )
        if "enforced" in want:
            assert c["cpu"]["enforced"] is want["enforced"]
