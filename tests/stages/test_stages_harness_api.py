"""``POST /api/v1/stages:compute`` with the harness generation and the new options (rules H8-H14 of
``docs/stages.md``) on SQLite and PostgreSQL, and the same through ``ci-sizer stage``.

The rules come from harness/harness-core, 332-ci-manager/service/src/main/java/io/harness/ci/execution/
integrationstage/K8InitializeStepUtils.java, 878-ng-common-utilities/src/main/java/io/harness/steps/matrix/
StrategyHelper.java, clients/pipeline-service/pms-sdk-core/src/main/java/io/harness/steps/matrix/
{MatrixConfigServiceHelper,ParallelismStrategyConfigService,ForLoopStrategyConfigService}.java,
879-pipeline-ci-commons/src/main/java/io/harness/ci/utils/QuantityUtils.java and
332-ci-manager/service/src/main/java/io/harness/ci/execution/buildstate/providers/InternalContainerParamsProvider.java.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.cli import main

from ..helpers import MIB

URL = "/api/v1/stages:compute"
HARNESS = {"generation": "harness"}


async def compute(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(URL, json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def limits(a: dict[str, Any]) -> list[tuple[int, int]]:
    return [(s["cpu"]["limit_millicores"], s["memory"]["limit_bytes"] // MIB) for s in a["steps"]]


def container(a: dict[str, Any]) -> tuple[int, int]:
    sc = a["stage_container"]
    return sc["cpu"]["limit_millicores"], sc["memory"]["limit_bytes"] // MIB


# K8InitializeStepUtilsTest.testStepsWithStrategy (332-ci-manager/service/src/test/.../integrationstage/),
# fixtures 332-ci-manager/service/src/test/resources/strategy/*.json, defaults 200m/200Mi (CIExecutionRule)
UPSTREAM = {
    "stage": [
        {"name": "run4", "cpu": "200m", "memory": "200Mi", "strategy": {"repeat": {"times": 3, "maxConcurrency": 2}}},
        {
            "name": "sg",
            "strategy": {"matrix": {"memory": ["200Mi", "300Mi", "400Mi"], "maxConcurrency": 2}},
            "group": [
                {
                    "parallel": [
                        {"name": "run2", "cpu": "200m", "memory": "<+matrix.memory>", "strategy": {"parallelism": 3}},
                        {"name": "run3", "cpu": "200m", "memory": "200Mi"},
                    ]
                }
            ],
        },
    ],
    "options": HARNESS,
}


async def test_upstream_strategy_vector(client: httpx.AsyncClient) -> None:
    # H8/H9: getStageRequest = (1600, 2500) upstream; the stage container adds the 100m/100Mi add-on (H3)
    a = await compute(client, UPSTREAM)
    assert container(a) == (1700, 2600)
    assert len(a["steps"]) == 15  # the upstream test's stepContainers.size()
    loops = {(lp["name"], lp["iteration"]): lp for lp in a["loops"]}
    assert loops[("sg", None)]["max_concurrency"] == 2
    assert loops[("sg", None)]["request"]["memory_bytes"] == 2500 * MIB
    assert loops[("run4", None)]["request"]["cpu_millicores"] == 400
    assert loops[("run2", "2")]["copies"] == 3
    # H8: the matrix value reached each copy of run2; H10: run3 gets (room - sum of 4 members) // 4
    by_name = {(s["name"], s["iteration"]): s for s in a["steps"]}
    assert by_name[("run2", "1/2")]["own"]["memory"] == "300Mi"
    assert by_name[("run3", "0")]["memory"]["limit"] == "625Mi"
    assert by_name[("run2", "0/0")]["memory"]["limit"] == "200Mi"  # a looped step keeps its own
    assert "looped group 'sg' (the top 2 of its 3 copies)" in a["decided_by"]["cpu"]["explanation"]
    # H13: the setup-addon init container is listed; it does not raise this pod's request
    assert a["init_containers"] == [
        {
            "name": "setup-addon",
            "cpu": {"request": "100m", "limit": "100m", "request_millicores": 100, "limit_millicores": 100},
            "memory": {"request": "100Mi", "limit": "100Mi", "request_bytes": 100 * MIB, "limit_bytes": 100 * MIB},
        }
    ]
    assert a["pod"]["request"]["cpu_millicores"] == 1700 + 15 * 10


async def test_matrix_exclude_and_default_concurrency(client: httpx.AsyncClient) -> None:
    # H8: 2 x 2 combinations less {os: mac, jdk: 11} = 3 copies; maxConcurrency defaults to all 3
    body = {
        "stage": [
            {
                "name": "test",
                "cpu": "<+matrix.jdk>",
                "strategy": {"matrix": {"os": ["linux", "mac"], "jdk": [1, 2], "exclude": [{"os": "mac", "jdk": 1}]}},
            }
        ],
        "options": HARNESS,
    }
    a = await compute(client, body)
    assert [(s["iteration"], s["own"]["cpu_millicores"]) for s in a["steps"]] == [
        ("0_0", 1000),
        ("0_1", 2000),
        ("1_1", 2000),
    ]
    assert a["loops"][0]["max_concurrency"] == 3
    assert container(a)[0] == 5000 + 100
    # an exclude entry naming a key the matrix lacks ends the reading (MatrixConfigServiceHelper.shouldExclude):
    # the entry after it is ignored, so all 4 combinations run
    body["stage"][0]["strategy"]["matrix"]["exclude"] = [{"arch": "arm"}, {"os": "mac", "jdk": 1}]
    a = await compute(client, body)
    assert len(a["steps"]) == 4


async def test_parallelism_has_no_max_concurrency(client: httpx.AsyncClient) -> None:
    # H8 (ParallelismStrategyConfigService: maxConcurrency = the copies): 4 x 250m all count
    a = await compute(
        client, {"stage": [{"cpu": "250m", "strategy": {"parallelism": 4}}, {"cpu": "1"}], "options": HARNESS}
    )
    assert container(a)[0] == 1000 + 100
    assert [s["cpu"]["limit_millicores"] for s in a["steps"]] == [250, 250, 250, 250, 1000]


async def test_approval_in_parallel_loses_its_share(client: httpx.AsyncClient) -> None:
    # H10/H11: parallel(approval, 100m) ; 1: extra 1000 - 100 = 900 over 2 members: the step gets 450
    body = {
        "stage": [{"parallel": [{"name": "approve", "non_ci": True}, {"cpu": "100m"}]}, {"cpu": "1"}],
        "options": HARNESS,
    }
    a = await compute(client, body)
    assert a["non_ci_steps"] == [{"name": "approve", "path": "/stage/0/parallel/0", "iteration": None}]
    assert [s["cpu"]["limit_millicores"] for s in a["steps"]] == [100 + 450, 1000]
    assert a["pod"]["request"]["cpu_millicores"] == 1100 + 2 * 10  # no container for the approval


@pytest.mark.parametrize(
    ("cpu", "doc", "harness"),
    [("1.2345", 1235, 1235), ("250.5m", 251, 251), ("100.4m", 101, 100), ("1.2341", 1235, 1234), (0.0015, 2, 2)],
)
async def test_cpu_rounding_by_generation(client: httpx.AsyncClient, cpu: Any, doc: int, harness: int) -> None:
    # H7 rounds CPU up; H14 (QuantityUtils.getCpuQuantityValueInUnit) is Math.round on a double
    for options, want in (({}, doc), (HARNESS, harness)):
        a = await compute(client, {"stage": [{"cpu": cpu}], "options": options})
        assert a["steps"][0]["own"]["cpu_millicores"] == want


async def test_harness_memory_rounds_up_and_needs_a_unit(client: httpx.AsyncClient) -> None:
    # H14 (QuantityUtils.getStorageQuantityValueInUnit): ceil to MiB; only M, G, Mi, Gi (STORAGE_PATTERN)
    a = await compute(client, {"stage": [{"memory": "129M"}, {"memory": "0.1Gi"}], "options": HARNESS})
    assert [s["own"]["memory_bytes"] // MIB for s in a["steps"]] == [124, 103]
    r = await client.post(URL, json={"stage": [{"memory": "512Ki"}, {"memory": 1073741824}], "options": HARNESS})
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in r.json()["errors"]] == ["body/stage/0/memory", "body/stage/1/memory"]


async def test_disable_resource_optimization(client: httpx.AsyncClient) -> None:
    # H12: V4 with CI_DISABLE_RESOURCE_OPTIMIZATION: each step keeps its own limit; the stage container stays 3600/3600
    body = {
        "stage": [
            {"parallel": [{"cpu": "1000m", "memory": "500Mi"}, {"cpu": "2000m", "memory": "3000Mi"}]},
            {"cpu": "3500m", "memory": "2000Mi"},
        ],
        "options": {"disable_resource_optimization": True},
    }
    a = await compute(client, body)
    assert limits(a) == [(1000, 500), (2000, 3000), (3500, 2000)]
    assert container(a) == (3600, 3600)


async def test_extra_addon_raises_a_small_pod(client: httpx.AsyncClient) -> None:
    # H13: a 300m/400Mi setup-addon (CI_EXTRA_ADDON_RESOURCE) exceeds 200m + 10m / 200Mi + 10Mi
    body: dict[str, Any] = {"stage": [{"cpu": "100m", "memory": "100Mi"}]}
    a = await compute(client, body)
    assert (a["pod"]["request"]["cpu_millicores"], a["pod"]["request"]["memory_bytes"] // MIB) == (210, 210)
    a = await compute(client, {**body, "options": {"extra_addon_resource": True}})
    assert a["init_containers"][0]["cpu"]["limit"] == "300m"
    assert (a["pod"]["request"]["cpu_millicores"], a["pod"]["request"]["memory_bytes"] // MIB) == (300, 400)
    assert container(a) == (200, 200)  # the stage container does not change


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"stage": [{"strategy": {"parallelism": 2}}]}, "body/stage/0/strategy"),  # doc generation
        ({"stage": [{"non_ci": True}]}, "body/stage/0/non_ci"),
        (
            {"stage": [{"strategy": {"parallelism": 2, "matrix": {"a": [1]}}}], "options": HARNESS},
            "body/stage/0/strategy",
        ),
        (
            {"stage": [{"strategy": {"matrix": {"a": [1], "maxConcurrency": 0}}}], "options": HARNESS},
            "body/stage/0/strategy/matrix",
        ),
        (
            {"stage": [{"strategy": {"matrix": {"a": [1], "exclude": [{"a": 1}]}}}], "options": HARNESS},
            "body/stage/0/strategy/matrix/exclude",
        ),
        (
            {"stage": [{"strategy": {"matrix": {"a": list(range(50)), "b": list(range(50))}}}], "options": HARNESS},
            "body/stage",
        ),
        (
            {"stage": [{"strategy": {"repeat": {"times": 2, "items": ["x"]}}}], "options": HARNESS},
            "body/stage/0/strategy/repeat",
        ),
        ({"stage": [{"non_ci": True, "cpu": "1"}], "options": HARNESS}, "body/stage/0"),
        ({"stage": [{"cpu": "<+matrix.cpu>"}], "options": HARNESS}, "body/stage/0/cpu"),
        ({"stage": [{"parallel": [{"parallel": [{}]}]}], "options": HARNESS}, "body/stage/0/parallel/0"),
        ({"stage": [{}], "options": {"generation": "v2"}}, "body/options/generation"),
    ],
)
async def test_invalid_harness_inputs_are_problem_json(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    r = await client.post(URL, json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert field in [e["field"] for e in r.json()["errors"]]


def test_cli_harness_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stage = tmp_path / "stage.yaml"
    stage.write_text(json.dumps(UPSTREAM["stage"]))
    assert main(["stage", str(stage), "--generation", "harness", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert container(a) == (1700, 2600)
    assert main(["stage", str(stage), "--generation", "harness"]) == 0
    out = capsys.readouterr().out
    assert "run2 [1/2]" in out
    assert "loop sg: 3 copies, 2 at once: 1600m CPU, 2500Mi memory" in out
    assert "setup-addon" in out
    assert main(["stage", str(stage)]) == 2  # the doc generation has no strategies
    assert "/stage/0/strategy: a strategy needs generation harness" in capsys.readouterr().err
    flags = ["--generation", "harness", "--disable-resource-optimization", "--extra-addon-resource", "--json"]
    assert main(["stage", str(stage), *flags]) == 0
    a = json.loads(capsys.readouterr().out)
    assert {s["cpu"]["limit_millicores"] for s in a["steps"]} == {200}  # H12: no step gets extra
    assert a["init_containers"][0]["memory"]["limit"] == "400Mi"
    assert a["options"]["disable_resource_optimization"] is True
