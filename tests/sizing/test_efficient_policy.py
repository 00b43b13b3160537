"""Issue 25 in the service: the ``efficient`` sizing policy (rules E1-E13) chosen by the setting
(``CI_SIZER_SIZING_POLICY`` / ``--sizing-policy``) or a per-scope override (``sizing_policy``, the most
specific scope wins, NULL inherits), echoed in ``meta.policy`` and ``/api/v1/info``; the org's
first-run prior (E6) stored in ``fleet_priors`` with each ingested run, surviving a restart. Through
the HTTP API on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text

from service.cli.common import CliError, Parser, add_settings_flags, settings_from
from service.db import build_engine

from ..conftest import ClientFactory
from ..helpers import GIB, JOB, MIB, container, post_runs, run, sizing

ORG_PATH = "/api/v1/sizing/overrides/" + JOB["org"]
JOB_PATH = "/api/v1/sizing/overrides/" + "/".join(
    s.replace("/", "%2F") for s in (JOB["org"], JOB["repo"], JOB["workflow"], JOB["job"])
)


def job(name: str) -> dict[str, str]:
    return {**JOB, "job": name}


def clean_runs(n: int, *, mem: int, cpu: float = 300.0, j: dict[str, str] | None = None, start: int = 0) -> list[Any]:
    return [run(start + k, container(cpu=cpu, mem=mem, limit=4 * GIB), job=j) for k in range(n)]


def memory(answer: dict[str, Any]) -> tuple[int, int]:
    m = answer["containers"][0]["memory"]
    return m["request_bytes"], m["limit_bytes"]


async def _prior_row(db_url: str, org: str) -> tuple[int, int] | None:
    engine = build_engine(db_url)
    try:
        async with engine.connect() as conn:
            row = (
                await conn.execute(text("SELECT sampled_jobs, peak_bytes FROM fleet_priors WHERE org = :o"), {"o": org})
            ).first()
    finally:
        await engine.dispose()
    return None if row is None else (int(row[0]), int(row[1]))


# --------------------------------------------------------------------------- the setting


@pytest.mark.parametrize("qos", ["guaranteed", "burstable"])
async def test_setting_chooses_the_policy_and_meta_says_which(make_client: ClientFactory, qos: str) -> None:
    # three clean runs peaking at 500Mi, 300m: the seed is confident (S9: 500Mi + 20 % -> 1Gi, a power
    # of two); efficient: confident too, but with three samples E13 keeps E3's learning 20 %: 600Mi, E8
    # request = the need (500Mi) in burstable, E9.
    async with make_client(memory_qos=qos) as client:
        await post_runs(client, *clean_runs(3, mem=500 * MIB))
        seed = await sizing(client)
        info = (await client.get("/api/v1/info")).json()
    assert seed["meta"]["policy"] == "seed"
    assert info["sizing_policy"] == "seed"
    assert memory(seed)[1] == GIB
    async with make_client(memory_qos=qos, sizing_policy="efficient") as client:
        eff = await sizing(client)
        info = (await client.get("/api/v1/info")).json()
    assert eff["meta"]["policy"] == "efficient"
    assert info["sizing_policy"] == "efficient"
    assert eff["meta"]["phase"] == "confident"
    request = 600 * MIB if qos == "guaranteed" else 500 * MIB
    assert memory(eff) == (request, 600 * MIB)
    c = eff["containers"][0]["cpu"]
    assert c["request_millicores"] == 300  # E7: no buffer on the request


def test_cli_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    p = Parser(prog="serve")
    add_settings_flags(p, serve=True)
    assert settings_from(p.parse_args([])).sizing_policy == "seed"
    assert settings_from(p.parse_args(["--sizing-policy", "efficient"])).sizing_policy == "efficient"
    with pytest.raises(CliError, match="--sizing-policy"):
        settings_from(p.parse_args(["--sizing-policy", "greedy"]))
    monkeypatch.setenv("CI_SIZER_SIZING_POLICY", "efficient")
    assert settings_from(p.parse_args([])).sizing_policy == "efficient"
    monkeypatch.setenv("CI_SIZER_SIZING_POLICY", "nope")
    with pytest.raises(CliError, match="CI_SIZER_SIZING_POLICY"):
        settings_from(p.parse_args([]))


# --------------------------------------------------------------------------- the override field


async def test_override_opts_a_scope_in_and_the_most_specific_wins(client: httpx.AsyncClient) -> None:
    await post_runs(client, *clean_runs(3, mem=500 * MIB))
    assert (await sizing(client))["meta"]["policy"] == "seed"

    r = await client.put(ORG_PATH, json={"sizing_policy": "efficient"})  # a policy alone is an override
    assert r.status_code == 201, r.text
    assert r.json()["sizing_policy"] == "efficient"
    assert r.json()["memory_limit"] is None
    etag = r.headers["ETag"]
    answer = await sizing(client)
    assert answer["meta"]["policy"] == "efficient"
    assert memory(answer)[1] == 600 * MIB  # three samples: E13's 20 %
    assert answer["meta"]["override_scope"] == "global"  # O4 names the scope of pinned values only

    # the job scope says seed: it wins over the org (O2 style)
    r = await client.put(JOB_PATH, json={"sizing_policy": "seed", "cpu_limit": "2"})
    assert r.status_code == 201, r.text
    answer = await sizing(client)
    assert answer["meta"]["policy"] == "seed"
    assert memory(answer)[1] == GIB
    # NULL at the job scope inherits the org's again
    r = await client.put(JOB_PATH, json={"cpu_limit": "2"})
    assert r.status_code == 200, r.text
    assert r.json()["sizing_policy"] is None
    assert (await sizing(client))["meta"]["policy"] == "efficient"

    # GET and the list show it; the ETag covers it
    got = await client.get(ORG_PATH)
    assert got.json()["sizing_policy"] == "efficient"
    assert got.headers["ETag"] == etag
    listed = (await client.get("/api/v1/sizing/overrides")).json()["items"]
    assert {o["scope"]: o["sizing_policy"] for o in listed} == {"org": "efficient", "job": None}
    r = await client.put(ORG_PATH, json={"sizing_policy": "seed"}, headers={"If-Match": etag})
    assert r.status_code == 200, r.text
    assert r.headers["ETag"] != etag
    r = await client.put(ORG_PATH, json={"sizing_policy": "efficient"}, headers={"If-Match": etag})
    assert r.status_code == 412  # the old ETag no longer matches: the policy changed
    assert (await sizing(client))["meta"]["policy"] == "seed"


async def test_override_rejects_an_unknown_policy(client: httpx.AsyncClient) -> None:
    r = await client.put(ORG_PATH, json={"sizing_policy": "greedy"})
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    assert (await client.get(ORG_PATH)).status_code == 404  # nothing half-written
    r = await client.put(ORG_PATH, json={"sizing_policy": None})
    assert r.status_code == 422  # nothing pinned at all


# --------------------------------------------------------------------------- the first-run prior (E6)


async def test_first_run_prior_is_stored_guarded_and_survives_a_restart(
    make_client: ClientFactory, db_url: str
) -> None:
    new = job("new-job")
    async with make_client(sizing_policy="efficient") as client:
        await post_runs(client, *clean_runs(2, mem=100 * MIB, j=job("a")))
        # one job with a sample: no prior yet (E6, PRIOR_MIN_JOBS = 2), the 4Gi default
        assert memory(await sizing(client, new)) == (4 * GIB, 4 * GIB)
        assert await _prior_row(db_url, JOB["org"]) == (1, 100 * MIB)
        await post_runs(client, *clean_runs(1, mem=300 * MIB, j=job("b"), start=10))
        # two jobs with a sample: the org's highest peak + 50 % (E6), 300Mi -> 450Mi
        assert memory(await sizing(client, new)) == (450 * MIB, 450 * MIB)
        assert await _prior_row(db_url, JOB["org"]) == (2, 300 * MIB)
        # a killed run (E1) leaves the prior as it is, and a duplicate is not counted twice
        killed = run(20, container(cpu=300.0, mem=3 * GIB, limit=2 * GIB, oom_killed=True), job=job("c"))
        await post_runs(client, killed)
        assert await _prior_row(db_url, JOB["org"]) == (2, 300 * MIB)
        again = clean_runs(1, mem=200 * MIB, j=job("a"), start=30)[0]
        await post_runs(client, again)
        assert (await client.post("/api/v1/runs", json=again)).json()["result"] == "duplicate"
        assert await _prior_row(db_url, JOB["org"]) == (2, 300 * MIB)
        # S1's 95 % clause alone leaves a run a sample (E1): job d's first sample, 3 jobs now
        near = run(40, container(cpu=300.0, mem=980 * MIB, limit=GIB), job=job("d"))
        await post_runs(client, near)
        assert await _prior_row(db_url, JOB["org"]) == (3, 980 * MIB)
        first = await sizing(client, new)
        assert first["meta"]["phase"] == "unknown"
        assert memory(first) == (1010 * MIB, 1010 * MIB)  # 980Mi + 3 % = 1009.4Mi, a whole MiB (E3, E8)
        # job c, killed at 2Gi before its first sample: E5 doubles the limit it was killed at, not the prior
        assert memory(await sizing(client, job("c"))) == (4 * GIB, 4 * GIB)
        # seed is untouched by the prior
        seed_org = {**new, "org": "other"}
        assert memory(await sizing(client, seed_org)) == (4 * GIB, 4 * GIB)
    async with make_client(sizing_policy="efficient") as client:  # a restart: a new app, the same database
        assert memory(await sizing(client, new)) == (1010 * MIB, 1010 * MIB)
    async with make_client() as client:  # the seed's answer does not read it
        assert memory(await sizing(client, new)) == (4 * GIB, 4 * GIB)


async def test_a_new_prior_is_seen_without_waiting_for_the_cache(make_client: ClientFactory) -> None:
    """An answer made from the prior is not cached: another job's run moves the prior at once."""
    new = job("fresh")
    async with make_client(sizing_policy="efficient") as client:
        for k, name in enumerate(("a", "b", "c")):
            await post_runs(client, *clean_runs(1, mem=100 * MIB, j=job(name), start=k))
        assert memory(await sizing(client, new))[1] == 103 * MIB
        await post_runs(client, *clean_runs(1, mem=400 * MIB, j=job("d"), start=9))
        assert memory(await sizing(client, new))[1] == 412 * MIB
