"""The OOM backoff is bounded (rules S13-S15), end to end on SQLite and PostgreSQL.

A 3 GiB job (confident: 3Gi x 1.1 -> 3380Mi -> limit 4Gi) then OOM-suspect run after run: S14
alone would double its limit without end (4096Gi after 10 runs with no node ceiling known, and a
500 from 64 runs on, when 2**k no longer fits the JSON encoder).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ..helpers import GIB, container, run, sizing

CLEAN = 3


async def _history(client: httpx.AsyncClient, streak: int, **newest: Any) -> dict[str, Any]:
    runs = [run(n, container(mem=3 * GIB)) for n in range(1, CLEAN + 1)]
    runs += [run(CLEAN + n, container(mem=3 * GIB, oom_killed=True)) for n in range(1, streak + 1)]
    runs[-1].update(newest)
    r = await client.post("/api/v1/runs:batch", json={"runs": runs})
    assert r.status_code == 200, r.text
    assert r.json()["created"] == len(runs)
    answer = await sizing(client)
    assert answer["meta"]["phase"] == "confident"
    c: dict[str, Any] = answer["containers"][0]
    assert c["oom"]["consecutive"] == streak  # rule S13: the streak is still counted in full
    return c


@pytest.mark.parametrize("streak", [64, 70, 200])
async def test_a_long_streak_is_answered(client: httpx.AsyncClient, streak: int) -> None:
    # it was a 500 (2**64 does not fit a JSON integer); the factor stops at 2^10
    c = await _history(client, streak)
    assert c["oom"]["backoff_factor"] == 1024
    assert c["oom"]["capped"] is True
    assert c["memory"]["limit_bytes"] == 64 * GIB


async def test_without_a_node_ceiling_the_backoff_stops_at_the_default_maximum(client: httpx.AsyncClient) -> None:
    # 4Gi x 2^10 = 4096Gi before; now the documented default of CI_SIZER_MAX_BACKOFF_MEMORY, 64Gi
    c = await _history(client, 10)
    assert (c["memory"]["limit"], c["memory"]["request"]) == ("64Gi", "64Gi")
    assert c["oom"] == {"consecutive": 10, "backoff_factor": 1024, "capped": True}


async def test_a_short_streak_is_rule_s14_as_written(client: httpx.AsyncClient) -> None:
    # below the maximum nothing changes: 4Gi x 2^3
    c = await _history(client, 3)
    assert c["memory"]["limit"] == "32Gi"
    assert c["oom"] == {"consecutive": 3, "backoff_factor": 8, "capped": False}


async def test_the_backoff_maximum_is_a_setting(make_client: Any) -> None:
    async with make_client(max_backoff_memory="16Gi") as client:
        c = await _history(client, 4)
    assert c["memory"]["limit"] == "16Gi"
    assert c["oom"]["capped"] is True


async def test_a_node_ceiling_is_the_bound_when_known(make_client: Any) -> None:
    # rule S15: 90% of a 512Gi node = 460.8Gi -> 471859Mi; above the backoff maximum, it is the bound
    async with make_client() as client:
        c = await _history(client, 12, node_memory_bytes=512 * GIB)
    assert c["memory"]["limit_bytes"] == 512 * GIB * 9 // (10 << 20) << 20
    assert c["oom"] == {"consecutive": 12, "backoff_factor": 1024, "capped": True}
