"""``POST /api/v1/stages:compute`` (``shared/spec/stage.md``, rules H1-H7) on SQLite and PostgreSQL:
the vectors end to end, recommendations as step limits, invalid trees, fail-open, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.cli import main

from ..helpers import JOB, MIB, container, post_runs, run, sizing, sizing_path, sqlite_with
from ..stage_vectors import VECTORS

URL = "/api/v1/stages:compute"
DEAD_PG = "postgresql+asyncpg://nobody@127.0.0.1:1/none"


async def compute(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(URL, json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def limits(a: dict[str, Any]) -> list[tuple[int, int]]:
    return [(s["cpu"]["limit_millicores"], s["memory"]["limit_bytes"] // MIB) for s in a["steps"]]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
async def test_vectors_over_http(client: httpx.AsyncClient, vector: dict[str, Any]) -> None:
    # rules H1-H5, vectors V1-V7, in quantities and base units
    a = await compute(client, vector["body"])
    cpu, mem = vector["container"]
    sc = a["stage_container"]
    assert sc["cpu"]["limit_millicores"] == sc["cpu"]["request_millicores"] == cpu
    assert sc["memory"]["limit_bytes"] == mem * MIB
    assert sc["memory"]["limit"] == f"{mem}Mi" if mem % 1024 else f"{mem // 1024}Gi"
    assert limits(a) == vector["limits"]
    assert all(s["source"]["cpu"] in ("declared", "default") for s in a["steps"])


async def test_quantities_round_up_to_whole_units(client: httpx.AsyncClient) -> None:
    # rule H7: 100.5m -> 101m; 1.5Mi + 1 byte -> 2Mi; a bare number is cores / bytes
    a = await compute(client, {"stage": [{"cpu": "100.5m", "memory": str(3 * MIB // 2 + 1)}, {"cpu": 0.25}]})
    assert limits(a) == [(250, 500), (250, 500)]  # H5: both top-level steps get the stage value
    own = [(s["own"]["cpu_millicores"], s["own"]["memory_bytes"]) for s in a["steps"]]
    assert own == [(101, 2 * MIB), (250, 500 * MIB)]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"stage": []}, "body/stage"),  # an empty stage
        ({"stage": [{"parallel": []}]}, "body/stage/0/parallel"),  # an empty block
        ({"stage": [{"group": [{"group": []}]}]}, "body/stage/0/group/0/group"),
        ({"stage": [{"cpu": "-1"}]}, "body/stage/0/cpu"),  # negative
        ({"stage": [{"memory": "0"}]}, "body/stage/0/memory"),  # zero
        ({"stage": [{"cpu": "lots"}]}, "body/stage/0/cpu"),  # not a quantity
        ({"stage": [{"cpu": True}]}, "body/stage/0/cpu"),
        ({"stage": [{"name": "x", "image": "alpine"}]}, "body/stage/0/image"),  # unknown key
        ({"stage": [{"parallel": [{}], "group": [{}]}]}, "body/stage/0/group"),  # both kinds
        ({"stage": [{}], "options": {"fast": True}}, "body/options/fast"),
        ({"stage": [{"background": "yes"}]}, "body/stage/0/background"),
        ({"stage": [{"job": {"org": "acme"}}]}, "body/stage/0/job/repo"),
    ],
)
async def test_invalid_trees_are_problem_json(client: httpx.AsyncClient, body: dict[str, Any], field: str) -> None:
    r = await client.post(URL, json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert field in [e["field"] for e in r.json()["errors"]]


async def test_too_deep_and_too_large_are_422(client: httpx.AsyncClient) -> None:
    item: dict[str, Any] = {}
    for _ in range(33):
        item = {"group": [item]}
    r = await client.post(URL, json={"stage": [item]})
    assert r.status_code == 422
    assert "deeper than 32" in r.json()["detail"]
    r = await client.post(URL, json={"stage": [{}] * 2001})
    assert r.status_code == 422
    assert "more than 2000 items" in r.json()["detail"]


async def test_absurd_nesting_is_a_clean_4xx(client: httpx.AsyncClient) -> None:
    body = '{"stage": [' + '{"group": [' * 5000 + "{}" + "]}" * 5000 + "]}"
    r = await client.post(URL, content=body, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500
    assert r.headers["content-type"] == "application/problem+json"


# --------------------------------------------------------------------------- H1 with use_recommendations

OTHER = {**JOB, "job": "lint"}


def ref(job: dict[str, str], container_name: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = dict(job)
    if container_name is not None:
        out["container"] = container_name
    return out


async def learned(client: httpx.AsyncClient) -> None:
    # JOB: two clean runs with one container (learning phase: 3x the peak, rule S8)
    await post_runs(client, run(1, container(cpu=500.0, mem=600 * MIB)), run(2, container(cpu=300.0, mem=400 * MIB)))


async def test_steps_sized_from_recommendations(client: httpx.AsyncClient) -> None:
    await learned(client)
    rec = (await sizing(client))["containers"][0]
    body = {
        "stage": [
            {"name": "build", "job": ref(JOB)},
            {"name": "pinned-cpu", "job": ref(JOB, "build"), "cpu": "250m"},
            {"name": "unseen", "job": ref(OTHER)},
        ],
        "options": {"use_recommendations": True},
    }
    a = await compute(client, body)
    build, pinned, unseen = a["steps"]
    assert build["source"]["cpu"] == build["source"]["memory"] == "recommendation"
    assert build["source"]["phase"] == "learning"
    assert build["own"]["cpu_millicores"] == rec["cpu"]["limit_millicores"]
    assert build["own"]["memory_bytes"] == rec["memory"]["limit_bytes"]
    # field by field: the declared CPU wins, memory still comes from the job
    assert (pinned["source"]["cpu"], pinned["source"]["memory"]) == ("declared", "recommendation")
    assert pinned["own"]["cpu_millicores"] == 250
    # H1: a job in the unknown phase gives the defaults, and says so
    assert unseen["source"]["cpu"] == "default"
    assert unseen["source"]["phase"] == "unknown"
    assert unseen["own"]["cpu_millicores"] == 400
    # the stage container follows from the recommended limits: the largest sequential item + add-on
    biggest = max(rec["cpu"]["limit_millicores"], 400)
    assert a["stage_container"]["cpu"]["limit_millicores"] == biggest + 100
    assert a["degraded"] is False

    # without use_recommendations the job reference is ignored
    body["options"] = {}
    a = await compute(client, body)
    assert [s["source"]["cpu"] for s in a["steps"]] == ["default", "declared", "default"]


async def test_recommendations_include_overrides(client: httpx.AsyncClient) -> None:
    # H1 "overrides included": a job-scope pin of the CPU limit is the step's CPU limit
    await learned(client)
    r = await client.put(sizing_path().replace("/sizing/", "/sizing/overrides/"), json={"cpu_limit": "3"})
    assert r.status_code in (200, 201), r.text
    a = await compute(client, {"stage": [{"job": ref(JOB)}], "options": {"use_recommendations": True}})
    [step] = a["steps"]
    assert step["own"]["cpu_millicores"] == 3000
    assert step["source"]["override_scope"] == "job"
    assert a["stage_container"]["cpu"]["limit"] == "3100m"


async def test_ambiguous_or_unknown_container_is_422(client: httpx.AsyncClient) -> None:
    await post_runs(client, *(run(n, container("build"), container("docker", mem=100 * MIB)) for n in (1, 2)))
    body = {"stage": [{"job": ref(JOB)}], "options": {"use_recommendations": True}}
    r = await client.post(URL, json=body)
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "body/stage/0/job/container"
    assert "build, docker" in r.json()["errors"][0]["message"]
    body["stage"] = [{"job": ref(JOB, "nope")}]
    r = await client.post(URL, json=body)
    assert r.status_code == 422
    assert "no container 'nope'" in r.json()["errors"][0]["message"]
    body["stage"] = [{"job": ref(JOB, "docker")}]
    a = await compute(client, body)
    assert a["steps"][0]["source"]["memory"] == "recommendation"


async def test_recommendations_fail_open() -> None:
    # a database that cannot be reached: the steps take the defaults and the answer says degraded
    from service.main import create_app
    from service.settings import Settings

    app = create_app(Settings(database_url=DEAD_PG, sizing_deadline_ms=2000))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            a = await compute(client, {"stage": [{"job": ref(JOB)}, {}], "options": {"use_recommendations": True}})
    assert a["degraded"] is True
    assert a["steps"][0]["source"]["cpu"] == "default"
    assert "did not answer" in a["steps"][0]["source"]["note"]
    assert a["stage_container"]["cpu"]["limit"] == "500m"


# --------------------------------------------------------------------------- CLI


def test_cli_prints_the_same_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stage = tmp_path / "stage.yaml"
    stage.write_text(
        "stage:\n"
        "  - {name: db, background: true, cpu: 3, memory: 900Mi}\n"
        "  - name: tests\n"
        "    parallel: [{name: unit}, {name: lint}]\n"
        "  - name: package\n"
    )
    assert main(["stage", str(stage), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert a["total_with_background"]["cpu"] == "3900m"  # V6 in a file
    assert main(["stage", str(stage)]) == 0
    out = capsys.readouterr().out
    assert "package" in out
    assert "800m" in out  # the sequential step's limit (H5)
    assert "stage with background: 3900m CPU, 2000Mi memory" in out
    assert "parallel block 'tests'" in out
    assert main(["stage", str(stage), "--increase-default-resources", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stage_container"]["cpu"]["limit"] == "2100m"


def test_cli_errors_name_the_item(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"parallel": []}, {"cpu": "-2"}]))
    assert main(["stage", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "/stage/0/parallel" in err
    assert "/stage/1/cpu: must be greater than zero" in err
    assert main(["stage", str(tmp_path / "missing.yaml")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_cli_uses_recommendations_from_the_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the stored runs of a SQLite file size the step, as the API would
    async def seed(client: httpx.AsyncClient) -> int:
        await learned(client)
        limit: int = (await sizing(client))["containers"][0]["cpu"]["limit_millicores"]
        return limit

    url, cpu_limit = sqlite_with(tmp_path / "cli.db", seed)
    stage = tmp_path / "s.yaml"
    stage.write_text(json.dumps({"stage": [{"job": ref(JOB)}]}))
    assert main(["stage", str(stage), "--use-recommendations", "--database-url", url, "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert a["steps"][0]["source"]["cpu"] == "recommendation"
    assert a["steps"][0]["own"]["cpu_millicores"] == cpu_limit
