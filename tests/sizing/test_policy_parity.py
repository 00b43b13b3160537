"""One home for the policy (issue 19): the backtest's recommendation before each run is what
``GET /api/v1/sizing`` answers once the runs before it are ingested, overrides included.

Random histories go through the real API (ingest, overrides, sizing) on SQLite and PostgreSQL; the
backtest side reads the same runs back through the backtest service's own loader and pin resolution
and asks the core for its recommendation before each run (``backtest.recommend_before``, the call
``backtest_walk`` scores). Both cores run it through the ``CI_SIZER_PURE_PYTHON`` pass of CI.
Rules S3-S17 and O2-O3; for the efficient policy (issue 25, the org opted in by an override) E1-E13,
the first-run prior (E6) across jobs, the window of 30 samples (E2) and the runs' durations (E11) included; the growth policy (G8)
and the grow block (G1-G5, issue 40), with runs that grew (G6) or were killed too late (G7).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import core
from service.backtests import service as backtest
from service.db import build_engine
from service.keys import ScopeKey
from service.main import create_app
from service.settings import Settings

from ..helpers import GIB, MIB, T0, container, examples, run, sizing_path

SCOPES = ("org", "repo", "workflow", "job")
CODES = {"seed": core.POLICY_CI_SIZER, "efficient": core.POLICY_EFFICIENT, "growth": core.POLICY_GROWTH}
STATS = ("peak", "p99", "p95", "p75", "p50", "avg")


@st.composite
def a_container(draw: st.DrawFn, name: str) -> dict[str, Any]:
    stats = sorted(draw(st.lists(st.integers(1, 4000), min_size=6, max_size=6)), reverse=True)
    mem = draw(st.integers(16, 6000)) * MIB
    limit = draw(st.one_of(st.none(), st.sampled_from([512 * MIB, GIB, 2 * GIB, 4 * GIB, 8 * GIB])))
    killed = draw(st.booleans()) if draw(st.integers(0, 4)) == 0 else None
    c = container(name, cpu=dict(zip(STATS, map(float, stats), strict=True)), mem=mem, limit=limit, oom_killed=killed)
    growth = draw(st.sampled_from([None, None, "grown", "too_late"])) if limit is not None else None
    if growth is not None:  # issue 40: a container that grew to its limit (G6), or was killed too late (G7)
        at = "2026-11-20T09:59:00Z"
        c["growths"] = [{"at": at, "from_bytes": limit // 2, "to_bytes": limit, "result": growth}]
    return c


@st.composite
def a_run(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(["build", "helper", "svc"]), min_size=1, max_size=3, unique=True))
    r: dict[str, Any] = {"containers": [draw(a_container(n)) for n in names]}
    if draw(st.integers(0, 3)) == 0:
        r["node_memory_bytes"] = draw(st.sampled_from([4 * GIB, 8 * GIB, 16 * GIB]))
    # rule E11 reads each run's duration: none (no started_at), short enough for its cheap margins, or long
    seconds = draw(st.sampled_from([None, None, 1, 2, 10, 30, 600]))
    if seconds is not None:
        r["seconds"] = seconds
    return r


@st.composite
def pins(draw: st.DrawFn) -> dict[str, dict[str, str]]:
    out = {}
    for scope in draw(st.lists(st.sampled_from(SCOPES), unique=True, max_size=3)):
        body = {}
        for kind, lo, hi, unit in (("cpu", 1, 4000, "m"), ("memory", 128, 9000, "Mi")):  # 128Mi: the pin floor
            # a scope's own request is never above its own limit (rule O1)
            values = sorted(draw(st.lists(st.integers(lo, hi), min_size=2, max_size=2)))
            for field, v in zip(("request", "limit"), values, strict=True):
                if draw(st.booleans()):
                    body[f"{kind}_{field}"] = f"{v}{unit}"
        if body:
            out[scope] = body
    return out


def _override_path(key: ScopeKey, scope: str) -> str:
    parts = (key.org, key.repo, key.workflow, key.job)[: SCOPES.index(scope) + 1]
    return "/api/v1/sizing/overrides/" + "/".join(parts)


async def _scenario(
    db_url: str,
    runs: list[dict[str, Any]],
    pinned: dict[str, dict[str, str]],
    params: Any,
    *,
    ignore_pins: bool = False,
    policy: str = "seed",
) -> None:
    key = ScopeKey(f"o{uuid.uuid4().hex[:10]}", "web", "ci.yml", "build")
    job = {"org": key.org, "repo": key.repo, "workflow": key.workflow, "job": key.job}
    app = create_app(
        Settings(database_url=db_url, sizing_deadline_ms=30_000, write_timeout_seconds=30, sizing_cache_entries=0)
    )
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            if policy != "seed":  # the org opts in (issue 25), the pins as drawn
                pinned = {**pinned, "org": {**pinned.get("org", {}), "sizing_policy": policy}}
            for scope, body in pinned.items():
                r = await client.put(_override_path(key, scope), json=body)
                assert r.status_code in (200, 201), r.text
            answers = []
            for n, r in enumerate(runs):
                got = await client.get(sizing_path(job), params=params)
                assert got.status_code == 200, got.text
                answers.append(got.json())
                posted = await client.post("/api/v1/runs", json=run(n, *r["containers"], job=job, **_extra(r, n)))
                assert posted.status_code == 201, posted.text
    engine = build_engine(db_url)
    try:
        async with engine.connect() as conn:
            series = await backtest.load(conn=conn, org=key.org, since=None, until=None, max_memory=None)
            overrides = await backtest.load_pins(conn=conn, org=key.org)
    finally:
        await engine.dispose()
    wanted = backtest.Params(runs=params["runs"], buffer=params["buffer"], cpu_percentile=params["cpu_percentile"])
    pin8 = backtest.pins_for([] if ignore_pins else overrides, key)
    by_name = {s.container: s for s in series}
    for i, answer in enumerate(answers):
        if answer["meta"]["phase"] == "unknown":
            continue  # defaults: the backtest sizes containers it has not yet seen the same way
        listed = {c["name"] for c in answer["containers"]}
        for name, s in by_name.items():
            sized = backtest.recommend_before(s, i, wanted, pin8, code=CODES[policy])
            if sized.phase < 0:  # not in the analysed runs: the answer does not list it either
                assert name not in listed, (i, name)
                continue
            c = next(c for c in answer["containers"] if c["name"] == name)
            live = (
                c["cpu"]["request_millicores"],
                c["cpu"]["limit_millicores"],
                c["memory"]["request_bytes"],
                c["memory"]["limit_bytes"],
            )
            assert live == (sized.cpu_request, sized.cpu_limit, sized.memory_request, sized.memory_limit), (i, name)
            assert c["oom"]["consecutive"] == sized.consecutive, (i, name)
            # issue 40: the grow block from the same core functions (G1: a memory pin, none; G2: the
            # node ceiling before the run, else --max-backoff-memory's default)
            ceiling = s.columns["ceiling"][i]
            bound = ceiling if ceiling >= 0 else 64 * GIB
            want = backtest.grow_before(s, i, wanted, sized.memory_limit, bound, code=CODES[policy])
            if pin8[6] > 0 or pin8[7] > 0 or want[0] < 0:
                assert c["grow"] is None, (i, name)
            else:
                got = c["grow"]
                assert (got["max_bytes"], got["threshold_percent"], got["step_bytes"]) == tuple(want), (i, name)
        assert answer["meta"]["policy"] == policy


def _extra(r: dict[str, Any], n: int) -> dict[str, Any]:
    extra: dict[str, Any] = {"node_memory_bytes": r["node_memory_bytes"]} if "node_memory_bytes" in r else {}
    if "seconds" in r:  # rule E11: started that long before it finished (helpers.run: n minutes after T0)
        started = T0 + timedelta(minutes=n) - timedelta(seconds=r["seconds"])
        extra["started_at"] = started.isoformat().replace("+00:00", "Z")
    return extra


@settings(
    max_examples=examples(25),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    runs=st.lists(a_run(), min_size=1, max_size=8),
    pinned=pins(),
    n_runs=st.integers(1, 5),
    buffer=st.integers(0, 100),
    percentile=st.sampled_from(["peak", "p99", "p95", "p75", "p50", "avg"]),
)
@pytest.mark.parametrize("policy", ["seed", "efficient", "growth"])
def test_backtest_and_live_answer_agree(
    db_url: str,
    policy: str,
    runs: list[dict[str, Any]],
    pinned: dict[str, dict[str, str]],
    n_runs: int,
    buffer: int,
    percentile: str,
) -> None:
    params = {"runs": n_runs, "buffer": buffer, "cpu_percentile": percentile}
    asyncio.run(_scenario(db_url, runs, pinned, params, policy=policy))


@pytest.mark.parametrize("field", ["memory_limit", "cpu_request"])
def test_parity_catches_a_divergence(db_url: str, field: str) -> None:
    """The comparison can fail: a backtest that left out the job's pins disagrees with the answer."""
    runs = [{"containers": [container("build", cpu=300.0, mem=700 * MIB)]} for _ in range(4)]
    pinned = {"job": {field: "3Gi" if field.startswith("memory") else "1500m"}}
    params = {"runs": 5, "buffer": 20, "cpu_percentile": "p95"}
    asyncio.run(_scenario(db_url, runs, pinned, params))
    with pytest.raises(AssertionError):
        asyncio.run(_scenario(db_url, runs, pinned, params, ignore_pins=True))


async def _fleet_scenario(db_url: str, plan: list[tuple[str, dict[str, Any]]]) -> None:
    """Runs of several jobs of one org, one after another (``plan``: job name, container); before
    each run the live answer of that job (the org opted in to efficient) against the backtest's."""
    org = f"o{uuid.uuid4().hex[:10]}"
    app = create_app(Settings(database_url=db_url, sizing_deadline_ms=30_000, write_timeout_seconds=30))
    asked: list[tuple[ScopeKey, int, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            r = await client.put(f"/api/v1/sizing/overrides/{org}", json={"sizing_policy": "efficient"})
            assert r.status_code == 201, r.text
            for n, (name, c) in enumerate(plan):
                job = {"org": org, "repo": "web", "workflow": "ci.yml", "job": name}
                got = await client.get(sizing_path(job))
                assert got.status_code == 200, got.text
                i = seen.get(name, 0)
                asked.append((ScopeKey(org, "web", "ci.yml", name), i, got.json()))
                seen[name] = i + 1
                body = run(n, c, job=job)
                body["run_id"] = f"{name}-{i}"
                posted = await client.post("/api/v1/runs", json=body)
                assert posted.status_code == 201, posted.text
    engine = build_engine(db_url)
    try:
        async with engine.connect() as conn:
            series = await backtest.load(conn=conn, org=org, since=None, until=None, max_memory=None)
    finally:
        await engine.dispose()
    by_job = {s.job: s for s in series}
    pins = (-1, -1, -1, -1, 0, 0, 0, 0)
    for key, i, answer in asked:
        sized = backtest.recommend_before(by_job[key], i, backtest.Params(), pins, code=core.POLICY_EFFICIENT)
        [c] = answer["containers"]
        live = (c["memory"]["request_bytes"], c["memory"]["limit_bytes"], c["cpu"]["request_millicores"])
        assert live == (sized.memory_request, sized.memory_limit, sized.cpu_request), (key.job, i)
        assert answer["meta"]["policy"] == "efficient"


def test_efficient_parity_across_jobs_with_the_prior(db_url: str) -> None:
    """E6: new jobs' first runs are sized from the org's earlier jobs, in the backtest as live; a job
    with 40 runs, some near the limit (samples, E1) and some killed, reaches past E2's 30 samples."""
    plan: list[tuple[str, dict[str, Any]]] = []
    for k, name in enumerate(("a", "b", "c", "d", "e")):
        plan.append((name, container("build", cpu=100.0 + k, mem=(100 + 50 * k) * MIB, limit=GIB)))
    for k in range(40):
        if k % 7 == 3:
            c = container("build", cpu=200.0, mem=980 * MIB, limit=GIB)  # S1's 95 % clause only
        elif k % 9 == 5:
            c = container("build", cpu=200.0, mem=GIB + MIB, limit=GIB, oom_killed=True)
        else:
            c = container("build", cpu=150.0 + k, mem=(300 + 7 * k) * MIB, limit=2 * GIB)
        plan.append(("long", c))
    plan.append(("f", container("build", cpu=100.0, mem=64 * MIB, limit=GIB)))
    asyncio.run(_fleet_scenario(db_url, plan))
