"""Growth events at ingest (issue 40, the wire contract's section 2) on SQLite and PostgreSQL: validation
(I5), storage in ``run_growths`` with the run, idempotency with the events (I4), S1 for grown runs (rules
G6 and G7 of docs/sizing.md), the counter ``ci_sizer_growths_total`` and the PostgreSQL fast path."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select

from service.db import build_engine
from service.tables import RunContainer, RunGrowth

from ..helpers import GIB, MIB, container, run, sizing

AT = "2026-11-20T10:03:00.250Z"


def growth(frm: int, to: int, result: str, at: str = AT) -> dict[str, Any]:
    return {"at": at, "from_bytes": frm, "to_bytes": to, "result": result}


def grown(mem: int = 1000 * MIB, *events: dict[str, Any], name: str = "build", **extra: Any) -> dict[str, Any]:
    """A container that grew from 512Mi to 1Gi (by default) and peaked at ``mem``."""
    return {
        **container(name, mem=mem, limit=GIB, **extra),
        "growths": list(events) or [growth(512 * MIB, GIB, "grown")],
    }


async def stored(db_url: str) -> list[Any]:
    engine = build_engine(db_url)
    try:
        async with engine.connect() as conn:
            g = RunGrowth.__table__  # type: ignore[attr-defined]
            return list(await conn.execute(select(g).order_by(g.c.run_pk, g.c.position, g.c.seq)))
    finally:
        await engine.dispose()


def counted(result: str) -> float:
    return REGISTRY.get_sample_value("ci_sizer_growths_total", {"result": result}) or 0.0


async def test_events_are_stored_with_the_run_and_answered(client: httpx.AsyncClient, db_url: str) -> None:
    events = [
        growth(256 * MIB, 512 * MIB, "grown", "2026-11-20T10:03:00.250Z"),
        growth(512 * MIB, 768 * MIB, "deferred", "2026-11-20T11:04:10+01:00"),  # 10:04:10Z: any zone, stored UTC
    ]
    body = run(1, {**container("build", mem=500 * MIB, limit=512 * MIB), "growths": events}, container("helper"))
    r = await client.post("/api/v1/runs", json=body)
    assert r.status_code == 201, r.text
    build, helper = r.json()["containers"]
    assert build["growths"] == [
        {"at": "2026-11-20T10:03:00.250000Z", "from_bytes": 256 * MIB, "to_bytes": 512 * MIB, "result": "grown"},
        {"at": "2026-11-20T10:04:10.000000Z", "from_bytes": 512 * MIB, "to_bytes": 768 * MIB, "result": "deferred"},
    ]
    assert helper["growths"] == []
    rows = await stored(db_url)
    assert [(g.position, g.seq, g.from_bytes, g.to_bytes, g.result) for g in rows] == [
        (0, 0, 256 * MIB, 512 * MIB, "grown"),
        (0, 1, 512 * MIB, 768 * MIB, "deferred"),
    ]
    assert rows[1].at.isoformat() == "2026-11-20T10:04:10"


async def test_g6_a_grown_container_near_its_final_limit_is_clean(client: httpx.AsyncClient) -> None:
    # rule G6: 1000Mi of a 1Gi limit it grew to is 97.7 %: not OOM-suspect, since it grew and was not killed
    r = await client.post("/api/v1/runs", json=run(1, grown(1000 * MIB)))
    assert (r.json()["clean"], r.json()["oom_suspect_containers"]) == (True, [])
    # the same run without its events is suspect by S1's 95 % clause
    r = await client.post("/api/v1/runs", json=run(2, container(mem=1000 * MIB, limit=GIB)))
    assert r.json()["oom_suspect_containers"] == ["build"]
    # grown, then a resize deferred at the end: it still grew and was not killed (G6)
    both = grown(1000 * MIB, growth(512 * MIB, GIB, "grown"), growth(GIB, 2 * GIB, "deferred"))
    assert (await client.post("/api/v1/runs", json=run(3, both))).json()["clean"] is True
    # only refused resizes (no growth): S1's 95 % clause applies as before
    refused = grown(1000 * MIB, growth(GIB, 2 * GIB, "deferred"), growth(GIB, 2 * GIB, "infeasible"))
    assert (await client.post("/api/v1/runs", json=run(4, refused))).json()["clean"] is False
    # grown but OOM-killed afterwards (over the grow maximum): a kill is a kill
    killed = grown(GIB, oom_events=1)
    assert (await client.post("/api/v1/runs", json=run(5, killed))).json()["clean"] is False


async def test_g6_no_oom_backoff_after_grown_runs(client: httpx.AsyncClient) -> None:
    # three grown runs near their final limit: clean samples, no OOM streak (S13), the peak covered next
    for n in range(3):
        assert (await client.post("/api/v1/runs", json=run(n, grown(1000 * MIB)))).status_code == 201
    c = (await sizing(client))["containers"][0]
    assert (c["oom"]["consecutive"], c["memory"]["limit_bytes"]) == (0, 2 * GIB)  # 1000Mi x 1.2 -> 2Gi (S9, S12)
    assert (await sizing(client))["meta"]["phase"] == "confident"


async def test_g7_too_late_is_a_kill(client: httpx.AsyncClient, db_url: str) -> None:
    # the guard saw the kill before its growth took effect; the body says no more (no oom flags)
    late = {**container(mem=500 * MIB, limit=512 * MIB), "growths": [growth(512 * MIB, 768 * MIB, "too_late")]}
    r = await client.post("/api/v1/runs", json=run(1, late))
    assert r.json()["oom_suspect_containers"] == ["build"]
    engine = build_engine(db_url)
    try:
        async with engine.connect() as conn:
            c = RunContainer.__table__  # type: ignore[attr-defined]
            assert (await conn.execute(select(c.c.oom_killed))).scalar_one() is True  # every kill count sees it
    finally:
        await engine.dispose()
    answer = await sizing(client)
    assert answer["containers"][0]["oom"]["consecutive"] == 1  # S13: it starts the OOM backoff


async def test_g7_too_late_is_a_kill_for_the_efficient_policy(make_client: Any) -> None:
    async with make_client(sizing_policy="efficient") as client:
        for n in range(7):  # seven samples: E3's 3 % (E13), 103Mi, below the 105Mi the run was killed at
            assert (await client.post("/api/v1/runs", json=run(n, container(mem=100 * MIB)))).status_code == 201
        late = {**container(mem=100 * MIB, limit=105 * MIB), "growths": [growth(105 * MIB, 105 * MIB, "too_late")]}
        assert (await client.post("/api/v1/runs", json=run(7, late))).status_code == 201
        c = (await sizing(client))["containers"][0]
        assert (c["oom"]["consecutive"], c["memory"]["limit_bytes"]) == (1, 210 * MIB)  # E5: a kill doubles


async def test_i4_the_events_are_part_of_the_content(client: httpx.AsyncClient, db_url: str) -> None:
    body = run(1, grown())
    assert (await client.post("/api/v1/runs", json=body)).status_code == 201
    # the same content, the instant spelled in another zone: a duplicate, nothing new stored
    same = run(1, grown(1000 * MIB, growth(512 * MIB, GIB, "grown", "2026-11-20T11:03:00.25+01:00")))
    again = await client.post("/api/v1/runs", json=same)
    assert (again.status_code, again.json()["result"]) == (200, "duplicate")
    assert again.json()["containers"][0]["growths"][0]["result"] == "grown"
    assert len(await stored(db_url)) == 1
    # other events (or none) under the same run id: 409, nothing changed
    for other in (
        run(1, grown(1000 * MIB, growth(512 * MIB, 2 * GIB, "grown"))),
        run(1, container(mem=1000 * MIB, limit=GIB)),
    ):
        r = await client.post("/api/v1/runs", json=other)
        assert r.status_code == 409, r.text
    assert [g.to_bytes for g in await stored(db_url)] == [GIB]
    # a run without events keeps the hash it always had: growths [] is the same content as none
    plain = run(2, container(mem=300 * MIB))
    assert (await client.post("/api/v1/runs", json=plain)).status_code == 201
    with_empty = run(2, {**container(mem=300 * MIB), "growths": []})
    assert (await client.post("/api/v1/runs", json=with_empty)).status_code == 200


@pytest.mark.parametrize(
    ("events", "field"),
    [
        ([growth(GIB, 512 * MIB, "grown")], "growths/0"),  # a growth never lowers a limit
        ([growth(GIB, GIB, "grown")], "growths/0"),  # grown raises it
        ([growth(GIB, 2 * GIB, "shrunk")], "growths/0/result"),
        ([growth(0, GIB, "error")], "growths/0/from_bytes"),
        ([growth(GIB, (1 << 50) + 1, "deferred")], "growths/0/to_bytes"),
        ([{**growth(GIB, 2 * GIB, "grown"), "at": "yesterday"}], "growths/0/at"),
        ([{**growth(GIB, 2 * GIB, "grown"), "extra": 1}], "growths/0/extra"),
        ([growth(GIB, 2 * GIB, "grown", "2026-11-20T10:05:00Z"), growth(GIB, 2 * GIB, "error")], "growths"),
        ([growth(GIB, 2 * GIB, "error")] * 101, "growths"),  # at most 100 per container
    ],
)
async def test_i5_bad_events_are_422_naming_the_field_and_store_nothing(
    client: httpx.AsyncClient, db_url: str, events: list[dict[str, Any]], field: str
) -> None:
    r = await client.post("/api/v1/runs", json=run(1, {**container(), "growths": events}))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    fields = [e["field"] for e in r.json()["errors"]]
    assert any(f == f"body/containers/0/{field}" or f.startswith(f"body/containers/0/{field}/") for f in fields), fields
    assert await stored(db_url) == []
    assert (await sizing(client))["meta"]["clean_samples"] == 0


async def test_the_counter_counts_new_runs_events_once(client: httpx.AsyncClient) -> None:
    before = {r: counted(r) for r in ("grown", "deferred", "infeasible", "too_late", "error")}
    events = [
        growth(256 * MIB, 512 * MIB, "grown"),
        growth(512 * MIB, 768 * MIB, "grown"),
        growth(768 * MIB, GIB, "deferred"),
        growth(768 * MIB, GIB, "error"),
    ]
    body = run(1, {**container(mem=700 * MIB, limit=768 * MIB), "growths": events})
    assert (await client.post("/api/v1/runs", json=body)).status_code == 201
    assert (await client.post("/api/v1/runs", json=body)).status_code == 200  # a duplicate counts nothing
    batch = {"runs": [run(2, grown(oom_events=0)), run(3, grown(1000 * MIB, growth(GIB, 2 * GIB, "infeasible")))]}
    assert (await client.post("/api/v1/runs:batch", json=batch)).json()["created"] == 2
    after = {r: counted(r) - before[r] for r in before}
    assert after == {"grown": 3, "deferred": 1, "infeasible": 1, "too_late": 0, "error": 1}


async def test_a_pruned_run_takes_its_events_with_it(client: httpx.AsyncClient, db_url: str) -> None:
    assert (await client.post("/api/v1/runs", json=run(1, grown()))).status_code == 201
    engine = build_engine(db_url)
    try:
        async with engine.begin() as conn:
            from service.tables import Run

            await conn.execute(Run.__table__.delete())  # type: ignore[attr-defined]
        async with engine.connect() as conn:
            assert (await conn.execute(select(func.count()).select_from(RunGrowth.__table__))).scalar_one() == 0  # type: ignore[attr-defined]
    finally:
        await engine.dispose()


def test_the_pg_fast_path_hands_runs_with_growths_to_the_route() -> None:
    # the one-statement POST (runs/fastpath.py) keeps its cost for runs without events: one check of a
    # list per container; a run with events goes to the route, which stores them (the tests above run
    # through it on PostgreSQL, the fast path in front)
    import orjson

    from service.auth import TokenStore
    from service.runs.fastpath import FastRuns
    from service.settings import Settings

    class State:
        settings = Settings()

    fast = FastRuns(app=None, tokens=TokenStore(), state=State())  # type: ignore[arg-type]
    scope = {"headers": [(b"content-type", b"application/json")]}
    assert fast._accept(scope, orjson.dumps(run(1, container()))) is not None
    assert fast._accept(scope, orjson.dumps(run(1, grown()))) is None
