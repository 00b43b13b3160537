"""``POST /api/v1/placement:advise`` over HTTP on SQLite and PostgreSQL: a pod given as a job
reference takes the sizer's recommendation, bad input is problem+json, the seed reproduces the pick."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ..helpers import JOB, MIB, container, post_runs, run, sizing

URL = "/api/v1/placement:advise"
DEAD_PG = "postgresql+asyncpg://nobody@127.0.0.1:9/nothing"


def nodes(*cpus: int) -> list[dict[str, Any]]:
    return [{"name": f"n{i}", "allocatable": {"cpu": c, "memory": "16Gi"}} for i, c in enumerate(cpus)]


async def advise(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(URL, json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def test_job_reference_takes_the_recommendation(client: httpx.AsyncClient) -> None:
    await post_runs(client, run(1, container(cpu=500.0, mem=600 * MIB)), run(2, container(cpu=300.0, mem=400 * MIB)))
    rec = (await sizing(client))["containers"][0]
    a = await advise(client, {"nodes": nodes(4, 8), "pod": {"job": JOB}, "profile": "ci-bin-pack"})
    pod = a["pod"]
    assert (pod["source"], pod["phase"], pod["degraded"]) == ("recommendation", "learning", False)
    assert pod["requests"]["cpu_millicores"] == rec["cpu"]["request_millicores"]
    assert pod["requests"]["memory_bytes"] == rec["memory"]["request_bytes"]
    assert pod["limits"]["memory_bytes"] == rec["memory"]["limit_bytes"]
    # the default CPU sizing mode observes: no CPU limit is set, so none is counted
    assert pod["containers_without_limit"] == {"cpu": 1, "memory": 0}
    assert a["pick"] == "n0"


async def test_pk9_job_pod_with_the_limits_enforce_would_give(client: httpx.AsyncClient) -> None:
    # PK9: in observe mode a sized pod carries no CPU limit, so limit-aware counts it as a whole node;
    # job_cpu_limit=enforce takes the CPU limit enforce mode would give (rule S12) instead
    await post_runs(client, run(1, container(cpu=500.0, mem=600 * MIB)), run(2, container(cpu=300.0, mem=400 * MIB)))
    rec = (await sizing(client))["containers"][0]
    profile = {"scorers": [{"name": "limit-aware", "resources": {"cpu": 1}}]}
    as_applied = await advise(client, {"nodes": nodes(4, 8), "pod": {"job": JOB}, "profile": profile})
    assert as_applied["pod"]["containers_without_limit"]["cpu"] == 1
    # L = the node's whole 4000m: (4000 - 4000) * 100 / 4000 = 0 on n0
    assert {c["name"]: c["scores"][0]["raw"] for c in as_applied["candidates"]}["n0"] == 0.0
    enforced = await advise(
        client, {"nodes": nodes(4, 8), "pod": {"job": JOB, "job_cpu_limit": "enforce"}, "profile": profile}
    )
    limit = rec["cpu"]["limit_millicores"]
    assert enforced["pod"]["containers_without_limit"]["cpu"] == 0
    assert enforced["pod"]["limits"]["cpu_millicores"] == limit
    assert {c["name"]: c["scores"][0]["raw"] for c in enforced["candidates"]}["n0"] == (4000 - limit) * 100 / 4000


async def test_unknown_job_takes_the_defaults(client: httpx.AsyncClient) -> None:
    a = await advise(client, {"nodes": nodes(4), "pod": {"job": {**JOB, "job": "never-seen"}}, "profile": "spread"})
    assert (a["pod"]["source"], a["pod"]["phase"]) == ("default", "unknown")
    assert (a["pod"]["requests"]["cpu"], a["pod"]["requests"]["memory"]) == ("500m", "4Gi")  # rule S7


async def test_seed_reproduces_the_pick(client: httpx.AsyncClient) -> None:
    body: dict[str, Any] = {"nodes": nodes(4, 4, 4, 4), "pod": {}, "profile": "spread"}
    first = await advise(client, body)
    again = await advise(client, {**body, "seed": first["seed"]})
    assert again["pick"] == first["pick"]
    assert len({(await advise(client, {**body, "seed": s}))["pick"] for s in range(30)}) > 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"nodes": nodes(4), "pod": {}}, "body"),  # neither chain nor profile
        ({"nodes": nodes(4), "pod": {}, "profile": "spread", "chain": {"strategies": "random"}}, "body"),
        ({"nodes": nodes(4) + nodes(4), "pod": {}, "profile": "spread"}, "body"),  # duplicate names
        ({"nodes": [], "pod": {}, "profile": "spread"}, "body/nodes"),
        ({"nodes": nodes(4), "pod": {}, "profile": "pack-it"}, "body/profile"),
        ({"nodes": nodes(4), "pod": {}, "chain": {"strategies": "fastest"}}, "body/chain/strategies/0"),
        ({"nodes": nodes(4), "pod": {"requests": {"cpu": "-1"}}, "profile": "spread"}, "body/pod/requests/cpu"),
        ({"nodes": nodes(4), "pod": {"requests": {}, "containers": [{}]}, "profile": "spread"}, "body/pod"),
        ({"nodes": nodes(4), "pod": {"job": JOB, "requests": {}}, "profile": "spread"}, "body/pod"),
        ({"nodes": [{"name": "w"}], "pod": {}, "profile": "spread"}, "body/nodes/0/allocatable"),
        (
            {"nodes": nodes(4), "pod": {}, "profile": {"scorers": [{"name": "least-allocated", "weight": -1}]}},
            "body/profile/scorers/0/weight",
        ),
        (
            {"nodes": [{"name": "w", "active_tasks": -1}], "pod": {}, "chain": {"strategies": "random"}},
            "body/nodes/0/active_tasks",
        ),
        (
            {"nodes": nodes(4), "pod": {}, "profile": {"scorers": [{"name": "requested-to-capacity-ratio"}]}},
            "body/profile/scorers/0",
        ),
        (
            {
                "nodes": nodes(4),
                "pod": {},
                "profile": {
                    "scorers": [
                        {
                            "name": "requested-to-capacity-ratio",
                            "shape": [{"utilization": 50, "score": 1}, {"utilization": 50, "score": 2}],
                        }
                    ]
                },
            },
            "body/profile/scorers/0",
        ),
        (
            {"nodes": nodes(4), "pod": {"containers": [{"restart_policy": "Always"}]}, "profile": "spread"},
            "body/pod",
        ),
        (
            {"nodes": nodes(4), "pod": {"requests": {"example.com/gpu": -1}}, "profile": "spread"},
            "body/pod/requests/extended/example.com/gpu",
        ),
        (
            {"nodes": nodes(4), "pod": {}, "chain": {"strategies": "random", "generation": "v8"}},
            "body/chain/generation",
        ),
    ],
)
async def test_bad_input_is_problem_json(client: httpx.AsyncClient, body: dict[str, Any], field: str) -> None:
    r = await client.post(URL, json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert field in [e["field"] for e in r.json()["errors"]], r.json()


async def test_job_reference_fails_open() -> None:
    from service.main import create_app
    from service.settings import Settings

    app = create_app(Settings(database_url=DEAD_PG, sizing_deadline_ms=2000))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            a = await advise(client, {"nodes": nodes(8), "pod": {"job": JOB}, "profile": "spread"})
    assert a["pod"]["degraded"] is True
    assert a["pod"]["requests"]["cpu"] == "500m"
    assert a["pick"] == "n0"
