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

from ..helpers import MIB, container, post_runs, run, sizing, sizing_path

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


def written(fmt: str, text: str) -> dict[str, Any]:
    """What a format writes, as {address: resources}: the container names (argo, arc, buildkite,
    jenkins, k8s), ``steps/NAME`` and ``sidecars/NAME`` (tekton), or the variable prefix (gitlab)."""
    if fmt == "argo":
        return {c["name"]: c["resources"] for c in json.loads(text)["containers"]}
    doc = yaml.safe_load(text)
    if fmt in ("tekton", "tekton-v1beta1"):
        v1 = fmt == "tekton"
        field = "computeResources" if v1 else "resources"
        steps, sidecars = ("stepSpecs", "sidecarSpecs") if v1 else ("stepOverrides", "sidecarOverrides")
        assert set(doc) <= {steps, sidecars}, doc
        out = {f"steps/{s['name']}": s[field] for s in doc[steps]}
        out.update({f"sidecars/{s['name']}": s[field] for s in doc.get(sidecars, [])})
        return out
    if fmt == "gitlab":
        variables = doc["variables"]
        out = {}
        for prefix in ("", "HELPER_", "SERVICE_"):
            keys = {k for k in variables if re.fullmatch(rf"KUBERNETES_{prefix}(CPU|MEMORY)_(REQUEST|LIMIT)", k)}
            if keys:
                res: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
                for k in keys:
                    resource, kind = k.removeprefix(f"KUBERNETES_{prefix}").lower().split("_")
                    res["requests" if kind == "request" else "limits"][resource] = variables[k]
                out[prefix or "BUILD_"] = res
        return out
    containers = {
        "k8s": lambda d: d["containers"],
        "jenkins": lambda d: as_k8s(d, "V1Pod").to_dict()["spec"]["containers"],
        "arc": lambda d: d["spec"]["containers"],
        "buildkite": lambda d: d["kubernetes"]["podSpecPatch"]["containers"],
    }[fmt](doc)
    return {c["name"]: c["resources"] for c in containers}


STRATEGIC = ["k8s", "jenkins", "argo", "arc", "buildkite", "tekton", "tekton-v1beta1", "gitlab"]
MAIN_ADDRESS = {
    "k8s": "build",
    "jenkins": "jnlp",
    "argo": "main",
    "arc": "$job",
    "buildkite": "container-0",
    "tekton": "steps/build",
    "tekton-v1beta1": "steps/build",
    "gitlab": "BUILD_",
}


def check_written(res: dict[str, Any], c: dict[str, Any], *, enforced: bool) -> None:
    check_resources({k: res.get(k) or {} for k in ("requests", "limits")}, c, enforced=enforced)


@pytest.mark.parametrize("fmt", STRATEGIC)
async def test_with_no_mapping_only_the_runners_main_container(make_client: Any, mode: str, fmt: str) -> None:
    # the runners merge by name: any other name becomes a container without an image (issue 17, 1)
    answer, r = await answer_and(make_client, mode, fmt)
    out = written(fmt, r.text)
    assert list(out) == [MAIN_ADDRESS[fmt]]
    build = next(c for c in answer["containers"] if c["name"] == "build")
    check_written(out[MAIN_ADDRESS[fmt]], build, enforced=mode == "enforce")


# (format, containers=, {address: recorded container that sizes it})
MAPPED = [
    (
        "k8s",
        "build,helper,svc-postgres,ghost=nothing",
        {"build": "build", "helper": "helper", "svc-postgres": "svc-postgres"},
    ),
    ("jenkins", "build,pg=svc-postgres", {"build": "build", "pg": "svc-postgres"}),
    ("argo", "main,postgres=svc-postgres", {"main": "build", "postgres": "svc-postgres"}),
    (
        "arc",
        "job,postgres=svc-postgres,redis=svc-redis",
        {"$job": "build", "$postgres": "svc-postgres", "$redis": "svc-redis"},
    ),
    ("buildkite", "container-0,container-1=helper", {"container-0": "build", "container-1": "helper"}),
    (
        "tekton",
        "step-build,step-lint=helper,sidecar-postgres=svc-postgres",
        {"steps/build": "build", "steps/lint": "helper", "sidecars/postgres": "svc-postgres"},
    ),
    (
        "tekton-v1beta1",
        "step-build,sidecar-redis=svc-redis",
        {"steps/build": "build", "sidecars/redis": "svc-redis"},
    ),
    ("gitlab", "build,helper", {"BUILD_": "build", "HELPER_": "helper"}),
]


@pytest.mark.parametrize(("fmt", "mapping", "expected"), MAPPED, ids=[m[0] for m in MAPPED])
async def test_a_mapping_names_the_pods_other_containers(
    make_client: Any, mode: str, fmt: str, mapping: str, expected: dict[str, str]
) -> None:
    async with make_client(cpu_sizing_mode=mode) as client:
        await post_runs(client, *(run(n, *BUILD_HELPER_SVC) for n in range(3)))
        answer = await sizing(client)
        r = await client.get(sizing_path(), params={"format": fmt, "containers": mapping})
        assert r.status_code == 200, r.text
    by_name = {c["name"]: c for c in answer["containers"]}
    out = written(fmt, r.text)
    assert list(out) == list(expected)  # in the mapping's order; "ghost" has no recorded container
    for address, recorded in expected.items():
        check_written(out[address], by_name[recorded], enforced=mode == "enforce")


async def test_gitlab_services_share_the_largest_mapped_service(make_client: Any) -> None:
    async with make_client() as client:
        await post_runs(client, *(run(n, *BUILD_HELPER_SVC) for n in range(3)))
        answer = await sizing(client)
        r = await client.get(
            sizing_path(), params={"format": "gitlab", "containers": "postgres=svc-postgres,redis=svc-redis"}
        )
    by_name = {c["name"]: c for c in answer["containers"]}
    variables = yaml.safe_load(r.text)["variables"]
    assert all(k.startswith("KUBERNETES_SERVICE_") for k in variables)  # build not mapped: not written
    services = [by_name["svc-postgres"], by_name["svc-redis"]]
    assert mem(variables["KUBERNETES_SERVICE_MEMORY_LIMIT"]) == max(s["memory"]["limit_bytes"] for s in services)
    assert cpu(variables["KUBERNETES_SERVICE_CPU_REQUEST"]) == max(s["cpu"]["request_millicores"] for s in services)


UNKNOWN = {
    "cpu": {"request": "500m", "limit": "500m", "request_millicores": 500, "limit_millicores": 500, "enforced": False},
    "memory": {"request": "4Gi", "limit": "4Gi", "request_bytes": 4 << 30, "limit_bytes": 4 << 30},
}


@pytest.mark.parametrize("fmt", STRATEGIC)
async def test_a_never_seen_job_gets_the_main_container_at_the_defaults(client: httpx.AsyncClient, fmt: str) -> None:
    # rule S6 keeps "*" in the JSON answer; no format ever names a container "*" (issue 17, 2)
    assert [c["name"] for c in (await sizing(client))["containers"]] == ["*"]
    _, mapped, expected = MAPPED[STRATEGIC.index(fmt)]
    from_build = next(address for address, recorded in expected.items() if recorded == "build")
    for mapping, main in (("", MAIN_ADDRESS[fmt]), (mapped, from_build)):
        r = await client.get(sizing_path(), params={"format": fmt, "containers": mapping})
        assert r.status_code == 200, r.text
        assert "*" not in r.text
        out = written(fmt, r.text)
        assert list(out) == [main]  # the others have nothing recorded: left to the runner
        check_written(out[main], UNKNOWN, enforced=False)


async def test_dotenv_of_a_never_seen_job(client: httpx.AsyncClient) -> None:
    r = await fetch(client, "dotenv")
    assert "*" not in r.text
    assert "CI_SIZER_BUILD_MEMORY_LIMIT=4Gi" in r.text.splitlines()


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


async def test_formats_of_a_cached_answer(make_client: Any) -> None:
    async with make_client() as client:
        await post_runs(client, run(1, *BUILD_HELPER_SVC))
        await sizing(client)  # cached now: the formats render the cached answer
        doc = yaml.safe_load(
            (await client.get(sizing_path(), params={"format": "k8s", "containers": "build,helper"})).text
        )
        assert [c["name"] for c in doc["containers"]] == ["build", "helper"]


DEAD_PG = "postgresql+asyncpg://nobody@127.0.0.1:9/nothing"  # nothing listens on port 9


async def test_a_degraded_answer_says_so_in_every_format() -> None:
    # issue 17, 2: the header everywhere, a comment in YAML, a variable where the format has them
    from service.main import create_app
    from service.settings import Settings

    app = create_app(Settings(database_url=DEAD_PG, sizing_deadline_ms=2000))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            for fmt in ["json", "dotenv", *STRATEGIC]:
                r = await client.get(sizing_path(), params={"format": fmt})
                assert r.status_code == 200, r.text
                assert r.headers["ci-sizer-degraded"] == "true", fmt
                assert "*" not in r.text.replace('"name":"*"', "")  # only the JSON answer keeps S6's "*"
                if r.headers["content-type"] == "application/yaml":
                    assert r.text.startswith("# ci-sizer: degraded answer"), fmt
                if fmt == "gitlab":
                    assert yaml.safe_load(r.text)["variables"]["CI_SIZER_DEGRADED"] == "true"
                if fmt == "dotenv":
                    assert "CI_SIZER_DEGRADED=true" in r.text.splitlines()
                if fmt in STRATEGIC:
                    out = written(fmt, r.text)
                    assert list(out) == [MAIN_ADDRESS[fmt]]
                    check_written(out[MAIN_ADDRESS[fmt]], UNKNOWN, enforced=False)


async def test_an_answer_that_is_not_degraded_has_no_marker(make_client: Any) -> None:
    async with make_client() as client:
        await post_runs(client, run(1, *BUILD_HELPER_SVC))
        for fmt in ["json", "k8s", "gitlab", "dotenv"]:
            r = await client.get(sizing_path(), params={"format": fmt})
            assert "ci-sizer-degraded" not in r.headers
            assert "DEGRADED" not in r.text
            assert "degraded answer" not in r.text


@pytest.mark.parametrize(
    ("fmt", "mapping"),
    [
        ("k8s", "Build"),  # not a DNS-1123 label
        ("arc", "$job"),  # the pod's name (job); the template's $ is the format's business
        ("k8s", "build,build=helper"),
        ("k8s", "build="),
        ("k8s", ",build"),
        ("tekton", "build"),  # a Tekton pod container is step-NAME or sidecar-NAME
        ("json", "build"),
        ("dotenv", "build"),
        ("k8s", "a" * 64),
    ],
)
async def test_a_bad_mapping_is_a_422(client: httpx.AsyncClient, fmt: str, mapping: str) -> None:
    r = await client.get(sizing_path(), params={"format": fmt, "containers": mapping})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["errors"][0]["loc"] == ["query", "containers"]


async def test_formats_and_mappings_are_served_before_routing_as_the_route_serves_them(make_client: Any) -> None:
    from .test_cache import hits, same_response

    async with make_client() as client:
        await post_runs(client, *(run(n, *BUILD_HELPER_SVC) for n in range(3)))
        for query in (
            "?format=argo",
            "?format=arc&containers=job,postgres%3Dsvc-postgres",
            "?containers=step-build,sidecar-pg%3Dsvc-postgres&format=tekton",
            "?format=gitlab&containers=build,helper",
            "?format=json",
            "?format=dotenv&containers=",
        ):
            routed = await client.get(sizing_path() + query + "&runs=05")  # not canonical: the route answers
            h0, m0 = hits(client)
            cached = await client.get(sizing_path() + query + "&runs=5")  # the same answer, before routing
            assert hits(client) == (h0 + 1, m0), query
            assert routed.status_code == 200, routed.text
            same_response(routed, cached)
