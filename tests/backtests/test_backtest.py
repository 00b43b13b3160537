"""Backtests over HTTP and the CLI on SQLite and PostgreSQL, on constructed histories whose figures
are worked out by hand; the frontier and the override resolution on their own."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.backtests import service as backtest
from service.cli import main
from service.keys import ScopeKey
from service.tables import Override

from ..helpers import GIB, JOB, MIB, container, poll, post_runs, sqlite_with

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


def timed(n: int, *, cpu: float, mem: int, limit: int | None = None, minutes: float = 10) -> dict[str, Any]:
    start = T0 + timedelta(hours=n)
    return {
        **JOB,
        "run_id": f"r{n}",
        "started_at": start.isoformat().replace("+00:00", "Z"),
        "finished_at": (start + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z"),
        "containers": [container(cpu=cpu, mem=mem, limit=limit)],
    }


# Two runs of 10 minutes (600 s), CPU flat (all six stats equal, so the mean use is the stat too):
#   run 0: 100m, 100Mi, reported limit 1Gi   run 1: 600m, 600Mi, reported limit 512Mi
# ci-sizer, buffer 20: run 0 unknown -> 500m/4Gi; run 1 learning from run 0: 3 x 100m = 300m (limit
# 500m), 3 x 100Mi = 300Mi -> limit 512Mi, guaranteed. Run 1's 600Mi peak exceeds 512Mi (OOM risk)
# and its 600m exceeds 500m (throttled). Waste: CPU (500-100) x 600; memory (4Gi-100Mi) x 600; run 1
# would have been OOM-killed, so all it reserved is waste too (issue 25): CPU 300 x 600, memory 512Mi x 600.
# efficient (E1-E10): run 0 no sample and no org prior -> 500m/4Gi; run 1 learning from run 0: CPU request
# 100m (no buffer, E7), limit 120m -> 500m; memory 100Mi + 50 % (one sample) = 150Mi (E3, E8), request =
# limit; run 1's 600Mi is over it (killed: CPU 100 x 600 and memory 150Mi x 600 wasted), its 600m over 500m.
HISTORY = [timed(0, cpu=100.0, mem=100 * MIB, limit=GIB), timed(1, cpu=600.0, mem=600 * MIB, limit=512 * MIB)]


async def test_backtest_by_hand(client: httpx.AsyncClient) -> None:
    await post_runs(client, *HISTORY)
    r = await client.post("/api/v1/backtests", json={"org": JOB["org"], "buffer": [20, 40]})
    assert r.status_code == 202, r.text
    a = await poll(client, r.headers["Location"])
    assert a["status"] == "done", a["error"]
    result = a["result"]
    assert (result["jobs"], result["runs"]) == (1, 2)
    rows = {p["label"]: p for p in result["policies"]}
    ci = rows["ci-sizer runs=5 buffer=20 cpu=p95 qos=guaranteed"]
    assert (ci["runs_scored"], ci["oom_risk_runs"], ci["cpu_limit_runs"], ci["throttled_runs"]) == (2, 1, 2, 1)
    assert ci["cpu_waste_core_hours"] == pytest.approx((400 + 300) * 600 / 1000 / 3600, abs=1e-3)
    assert ci["memory_waste_gib_hours"] == pytest.approx((4 * GIB - 100 * MIB + 512 * MIB) * 600 / GIB / 3600, abs=1e-3)
    eff = rows["efficient runs=5 buffer=20 cpu=p95 qos=guaranteed"]
    assert eff["kind"] == "efficient"
    assert (eff["runs_scored"], eff["oom_risk_runs"], eff["cpu_limit_runs"], eff["throttled_runs"]) == (2, 1, 2, 1)
    assert eff["cpu_waste_core_hours"] == pytest.approx((400 + 100) * 600 / 1000 / 3600, abs=1e-3)
    assert eff["memory_waste_gib_hours"] == pytest.approx(
        (4 * GIB - 100 * MIB + 150 * MIB) * 600 / GIB / 3600, abs=1e-3
    )
    # the recorded limits: run 0 had 1Gi for 100Mi (no risk, waste (1Gi - 100Mi) x 600), run 1 512Mi for
    # 600Mi (killed: its 512Mi x 600 is waste)
    rec = rows["recorded limits"]
    assert (rec["runs_scored"], rec["oom_risk_runs"], rec["throttle_share"]) == (2, 1, None)
    assert rec["memory_waste_gib_hours"] == pytest.approx((GIB - 100 * MIB + 512 * MIB) * 600 / GIB / 3600, abs=1e-3)
    # the fixed default: 4Gi never at risk, 600m > 500m throttled once
    fixed = rows["fixed 500m / 4Gi"]
    assert (fixed["oom_risk_runs"], fixed["throttled_runs"]) == (0, 1)
    assert {"max memory + 15%, p95 CPU (KRR-like)", "p90 of peaks + 15% (VPA-like)"} <= set(rows)
    # buffer 40 changes nothing in the learning phase (3x the peak, rule S8)
    assert rows["ci-sizer runs=5 buffer=40 cpu=p95 qos=guaranteed"]["oom_risk_runs"] == 1
    # per job
    [job] = result["per_job"]
    assert job["job"] == JOB["job"]
    assert job["policies"][0]["oom_risk_runs"] == 1


async def test_current_overrides_apply(client: httpx.AsyncClient) -> None:
    # a job-scope memory limit pin of 1Gi: run 1 (600Mi) is no longer at risk under ci-sizer
    await post_runs(client, *HISTORY)
    path = "/api/v1/sizing/overrides/" + "/".join(
        s.replace("/", "%2F") for s in (JOB["org"], JOB["repo"], JOB["workflow"], JOB["job"])
    )
    r = await client.put(path, json={"memory_limit": "1Gi"})
    assert r.status_code in (200, 201), r.text
    r = await client.post("/api/v1/backtests", json={"org": JOB["org"], "baselines": False})
    a = await poll(client, r.headers["Location"])
    ci, eff = a["result"]["policies"][:2]
    assert ci["oom_risk_runs"] == 0
    assert eff["oom_risk_runs"] == 0  # the pins apply to the efficient policy too (O2-O3)
    assert [p["kind"] for p in a["result"]["policies"]] == ["ci-sizer", "efficient", "recorded"]
    r = await client.post("/api/v1/backtests", json={"org": JOB["org"], "baselines": False, "efficient": False})
    a = await poll(client, r.headers["Location"])
    assert [p["kind"] for p in a["result"]["policies"]] == ["ci-sizer", "recorded"]


async def test_backtest_bad_input(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/v1/backtests", json={"buffer": list(range(10)), "runs": list(range(1, 11))})
    assert r.status_code == 422
    assert "at most 50 parameter sets" in r.json()["detail"] + json.dumps(r.json()["errors"])
    r = await client.post("/api/v1/backtests", json={"cpu_percentile": ["p42"]})
    assert r.status_code == 422
    r = await client.get("/api/v1/backtests/nope")
    assert r.status_code == 404


def test_frontier() -> None:
    # (risk, waste): (0, 10) and (5, 1) are both best at something; (5, 10) and (6, 1) are beaten
    assert backtest.frontier([(0, 10), (5, 1), (5, 10), (6, 1), None]) == [True, True, False, False, False]
    assert backtest.frontier([(1, 1), (1, 1)]) == [True, True]  # equals do not beat each other


def test_pins_for_takes_the_most_specific() -> None:
    key = ScopeKey("acme", "web", "ci", "build")

    def o(scope: str, **values: int) -> Override:
        levels = {"org": ("acme", "", "", ""), "repo": ("acme", "web", "", ""), "job": ("acme", "web", "ci", "build")}
        org, repo, workflow, job = levels[scope]
        return Override(scope=scope, org=org, repo=repo, workflow=workflow, job=job, updated_by="t", **values)

    pins = backtest.pins_for(
        [o("org", memory_limit_bytes=GIB, cpu_limit_millicores=900), o("job", memory_limit_bytes=2 * GIB),
         Override(scope="repo", org="acme", repo="other", updated_by="t", cpu_request_millicores=5)],
        key,
    )  # fmt: skip
    # memory limit from the job (rank 4), CPU limit from the org (rank 1); the other repo's pin does not apply
    assert pins == (-1, 900, -1, 2 * GIB, 0, 1, 0, 4)


def test_cli_backtest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def seed(client: httpx.AsyncClient) -> None:
        await post_runs(client, *HISTORY)

    url, _ = sqlite_with(tmp_path / "bt.db", seed)
    assert main(["backtest", "--database-url", url, "--buffer", "10,20", "--cpu-percentile", "p95,p99"]) == 0
    out = capsys.readouterr().out
    assert "2 runs of 1 jobs" in out
    assert out.count("ci-sizer runs=5") >= 4
    assert "VPA-like" in out
    assert main(["backtest", "--database-url", url, "--json", "--no-baselines"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["kind"] for p in report["policies"]] == ["ci-sizer", "efficient", "recorded"]
    assert report["policies"][0]["oom_risk_runs"] == 1
    assert "efficient runs=5" in report["policies"][1]["label"]
    assert main(["backtest", "--database-url", url, "--json", "--no-baselines", "--no-efficient"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["kind"] for p in report["policies"]] == ["ci-sizer", "recorded"]
    assert main(["backtest", "--database-url", url, "--buffer", "ten"]) == 2
    assert main(["backtest", "--database-url", url, "--org", "nobody"]) == 1


async def test_runs_are_runs_and_both_shares_have_one_denominator(client: httpx.AsyncClient) -> None:
    # issue 34: two runs of a pod with a sidecar are 2 runs (4 container-runs); the KRR-like row has a
    # CPU limit on a job's first run only, and its throttled share is out of every scored run as well
    history = []
    for body in HISTORY:
        body = json.loads(json.dumps(body))
        body["containers"].append(container("redis", cpu=50.0, mem=80 * MIB, limit=GIB))
        history.append(body)
    await post_runs(client, *history)
    r = await client.post("/api/v1/backtests", json={"org": JOB["org"]})
    a = await poll(client, r.headers["Location"])
    result = a["result"]
    assert (result["runs"], result["container_runs"], result["containers"]) == (2, 4, 2)
    for p in result["policies"]:
        if p["throttle_share"] is not None:
            assert p["throttle_share"] == round(p["throttled_runs"] / p["runs_scored"], 4), p["label"]
    krr = next(p for p in result["policies"] if "KRR" in p["label"])
    assert krr["cpu_limit_runs"] < krr["runs_scored"]  # the case the old denominator got wrong
    text = backtest.render(result)
    assert text.startswith("2 runs of 1 jobs (2 containers, 4 container-runs;")


async def test_a_backtest_of_nothing_is_refused(client: httpx.AsyncClient) -> None:
    await post_runs(client, *HISTORY)
    r = await client.post("/api/v1/backtests", json={"org": "nobody"})
    assert r.status_code == 422
    assert r.json()["errors"] == [{"field": "body/org", "message": "no stored run of org 'nobody'"}]
    r = await client.post("/api/v1/backtests", json={"org": JOB["org"], "since": "2027-01-01T00:00:00Z"})
    assert r.status_code == 422
    assert "that finished between since and until" in r.json()["detail"]
    assert (await client.post("/api/v1/backtests", json={"org": JOB["org"]})).status_code == 202
