"""``?format=``: the sizing answer in each CI system's shape, parsed in that system's terms
(Kubernetes objects through the official client's models, quantities through its parser)."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import httpx
import pytest
import yaml
from kubernetes.client import ApiClient
from kubernetes.utils import parse_quantity

from .helpers import MIB, container, post_runs, run, sizing, sizing_path

BUILD_HELPER_SVC = [
    container("build", cpu=1500, mem=2048 * MIB),
    container("helper", cpu=100, mem=64 * MIB),
    container("svc-postgres", cpu=300, mem=400 * MIB),
    container("svc-redis", cpu=50, mem=700 * MIB),
]


def as_k8s(data: Any, kind: str) -> Any:
    """Deserialize through the Kubernetes client's models, as kubectl's client would."""
    return ApiClient().deserialize(json.dumps(data), kind, "application/json")


def cpu(q: str) -> int:
    return int(parse_quantity(q) * 1000)


def mem(q: str) -> int:
    return int(parse_quantity(q))


def check_resources(res: Any, c: dict[str, Any], *, enforced: bool) -> None:
    """A V1ResourceRequirements (or its dict) carries exactly the answer's numbers."""
    requests = res.requests if hasattr(res, "requests") else res["requests"]
    limits = res.limits if hasattr(res, "limits") else res["limits"]
    assert cpu(requests["cpu"]) == c["cpu"]["request_millicores"]
    assert mem(requests["memory"]) == c["memory"]["request_bytes"]
    assert mem(limits["memory"]) == c["memory"]["limit_bytes"]
    if enforced:
        assert cpu(limits["cpu"]) == c["cpu"]["limit_millicores"]
    else:
        assert "cpu" not in limits  # observe mode: a written CPU limit would throttle


async def fetch(client: httpx.AsyncClient, fmt: str) -> httpx.Response:
    r = await client.get(sizing_path(), params={"format": fmt})
    assert r.status_code == 200, r.text
    return r


@pytest.fixture(params=["observe", "enforce"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def answer_and(make_client: Any, mode: str, fmt: str) -> tuple[dict[str, Any], httpx.Response]:
    async with make_client(cpu_sizing_mode=mode) as client:
        await post_runs(client, *(run(n, *BUILD_HELPER_SVC) for n in range(3)))
        answer = await sizing(client)
        return answer, await fetch(client, fmt)


async def test_json_is_the_default_shape(make_client: Any) -> None:
    async with make_client() as client:
        await post_runs(client, run(1, *BUILD_HELPER_SVC))
        assert (await fetch(client, "json")).json() == await sizing(client)


async def test_k8s_resources_blocks(make_client: Any, mode: str) -> None:
    answer, r = await answer_and(make_client, mode, "k8s")
    assert r.headers["content-type"].startswith("application/yaml")
    doc = yaml.safe_load(r.text)
    for c, item in zip(answer["containers"], doc["containers"], strict=True):
        k = as_k8s(item, "V1Container")
        assert k.name == c["name"]
        check_resources(k.resources, c, enforced=mode == "enforce")


async def test_jenkins_pod_yaml_for_merge(make_client: Any, mode: str) -> None:
    answer, r = await answer_and(make_client, mode, "jenkins")
    pod = as_k8s(yaml.safe_load(r.text), "V1Pod")
    assert pod.kind == "Pod"
    assert [c.name for c in pod.spec.containers] == [c["name"] for c in answer["containers"]]
    for c, k in zip(answer["containers"], pod.spec.containers, strict=True):
        check_resources(k.resources, c, enforced=mode == "enforce")


async def test_argo_pod_spec_patch(make_client: Any, mode: str) -> None:
    answer, r = await answer_and(make_client, mode, "argo")
    assert r.headers["content-type"].startswith("text/plain")  # application/json is the spec's shape only
    patch = json.loads(r.text)  # podSpecPatch is a JSON (or YAML) string merged into the pod spec
    spec = as_k8s(patch, "V1PodSpec")
    names = [c.name for c in spec.containers]
    assert names == ["main", "helper", "svc-postgres", "svc-redis"]  # build runs in Argo's "main"
    for c, k in zip(answer["containers"], spec.containers, strict=True):
        check_resources(k.resources, c, enforced=mode == "enforce")


async def test_arc_hook_template(make_client: Any, mode: str) -> None:
    answer, r = await answer_and(make_client, mode, "arc")
    template = yaml.safe_load(r.text)
    spec = as_k8s(template["spec"], "V1PodSpec")
    assert spec.containers[0].name == "$job"  # the runner's container hook replaces $job
    check_resources(spec.containers[0].resources, answer["containers"][0], enforced=mode == "enforce")


async def test_tekton_step_specs(make_client: Any, mode: str) -> None:
    answer, r = await answer_and(make_client, mode, "tekton")
    doc = yaml.safe_load(r.text)
    assert set(doc) == {"stepSpecs"}
    for c, step in zip(answer["containers"], doc["stepSpecs"], strict=True):
        assert set(step) == {"name", "computeResources"}
        assert step["name"] == c["name"]
        check_resources(as_k8s(step["computeResources"], "V1ResourceRequirements"), c, enforced=mode == "enforce")


async def test_buildkite_pod_spec_patch(make_client: Any, mode: str) -> None:
    answer, r = await answer_and(make_client, mode, "buildkite")
    patch = yaml.safe_load(r.text)["kubernetes"]["podSpecPatch"]
    spec = as_k8s(patch, "V1PodSpec")
    assert [c.name for c in spec.containers] == [f"container-{i}" for i in range(4)]
    for c, k in zip(answer["containers"], spec.containers, strict=True):
        check_resources(k.resources, c, enforced=mode == "enforce")


async def test_gitlab_kubernetes_variables(make_client: Any, mode: str) -> None:
    answer, r = await answer_and(make_client, mode, "gitlab")
    variables = yaml.safe_load(r.text)["variables"]
    by_name = {c["name"]: c for c in answer["containers"]}
    allowed = re.compile(r"KUBERNETES_(HELPER_|SERVICE_)?(CPU|MEMORY)_(REQUEST|LIMIT)")
    assert all(allowed.fullmatch(k) for k in variables), variables
    assert all(isinstance(v, str) for v in variables.values())  # GitLab variables are strings
    build, helper = by_name["build"], by_name["helper"]
    assert cpu(variables["KUBERNETES_CPU_REQUEST"]) == build["cpu"]["request_millicores"]
    assert mem(variables["KUBERNETES_MEMORY_LIMIT"]) == build["memory"]["limit_bytes"]
    assert mem(variables["KUBERNETES_HELPER_MEMORY_REQUEST"]) == helper["memory"]["request_bytes"]
    # one setting for all services: the largest of each field
    services = [by_name["svc-postgres"], by_name["svc-redis"]]
    assert mem(variables["KUBERNETES_SERVICE_MEMORY_LIMIT"]) == max(s["memory"]["limit_bytes"] for s in services)
    assert cpu(variables["KUBERNETES_SERVICE_CPU_REQUEST"]) == max(s["cpu"]["request_millicores"] for s in services)
    assert ("KUBERNETES_CPU_LIMIT" in variables) == (mode == "enforce")


async def test_dotenv(make_client: Any, mode: str) -> None:
    answer, r = await answer_and(make_client, mode, "dotenv")
    assert r.headers["content-type"].startswith("text/plain")
    env = {}
    for line in r.text.splitlines():
        m = re.fullmatch(r"([A-Z_][A-Z0-9_]*)=(\S*)", line)
        assert m, line  # no spaces, no quotes: sourceable by sh and by GitLab's dotenv reports
        env[m.group(1)] = m.group(2)
    assert len(env) == 4 * len(answer["containers"])
    pg = next(c for c in answer["containers"] if c["name"] == "svc-postgres")
    assert mem(env["CI_SIZER_SVC_POSTGRES_MEMORY_LIMIT"]) == pg["memory"]["limit_bytes"]
    limit = env["CI_SIZER_BUILD_CPU_LIMIT"]
    assert (limit != "") == (mode == "enforce")
    if limit:
        assert Decimal(cpu(limit)) == answer["containers"][0]["cpu"]["limit_millicores"]


async def test_unknown_format_is_422(client: httpx.AsyncClient) -> None:
    r = await client.get(sizing_path(), params={"format": "nomad"})
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"


async def test_formats_of_a_cached_and_a_degraded_answer(make_client: Any) -> None:
    async with make_client() as client:
        await post_runs(client, run(1, *BUILD_HELPER_SVC))
        await sizing(client)  # cached now: the formats render the cached answer
        doc = yaml.safe_load((await fetch(client, "k8s")).text)
        assert [c["name"] for c in doc["containers"]] == [c["name"] for c in BUILD_HELPER_SVC]
