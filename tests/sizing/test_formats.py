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
    if fmt == "arc":  # one line of JSON: the hooks read it with js-yaml, a job-started script merges it with jq
        return {c["name"]: c["resources"] for c in json.loads(text)["spec"]["containers"]}
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
        "buildkite": lambda d: d,  # the podSpecPatch's containers items, for the step's one kubernetes entry
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
                else:  # JSON and dotenv: the header says it (and dotenv's variable, below)
                    assert fmt in ("json", "dotenv", "argo", "arc"), fmt
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


# --------------------------------------------------------------------------- template_cpu_limit (issue 32, 1)
# A runner's own template may carry a CPU limit that the runner keeps beside the answer (Argo's
# ApplyPodSpecPatch, agent-stack-k8s' PatchPodSpec and Tekton's MergeStepsWithSpecs merge `limits` key
# by key; Jenkins' containerTemplate and GitLab's config.toml win over it). Every CPU request written
# is at most that limit, so the merged pod never has a request above its limit; tests/sizing/
# test_recipes.py applies each runner's own merge to it.


def test_fit_cpu_keeps_the_request_within_every_limit_the_pod_may_keep() -> None:
    from service.sizing.answer import Cpu, Sources
    from service.sizing.fit import fit_cpu

    def cpu(request: int, limit: int, enforced: bool) -> Cpu:
        return Cpu(f"{request}m", f"{limit}m", request, limit, enforced, Sources("algorithm", "algorithm"))

    observe, enforce = cpu(2106, 2500, False), cpu(2106, 2500, True)
    assert fit_cpu(observe, None) == (2106, None)  # nothing kept: the request, and no limit (S17)
    for kept in (1000, 2106, 4000):
        request, limit = fit_cpu(observe, kept)
        assert (request, limit) == (min(2106, kept), None)
        request, limit = fit_cpu(enforce, kept)
        assert limit == 2500  # enforce: the answer's limit is written, and replaces the template's
        assert request <= kept  # whichever of the two limits the runner keeps
        assert request <= limit
    assert fit_cpu(enforce, None) == (2106, 2500)


KEPT = {"below": "1", "equal": "2106m", "above": "4"}  # around the build container's request of 2106m


async def test_template_cpu_limit_bounds_every_request_written(make_client: Any, mode: str) -> None:
    async with make_client(cpu_sizing_mode=mode) as client:
        await post_runs(client, *(run(n, *BUILD_HELPER_SVC_1755) for n in range(3)))
        answer = await sizing(client)
        build = next(c for c in answer["containers"] if c["name"] == "build")
        assert build["cpu"]["request_millicores"] == 2106  # the request the three cases are placed around
        for fmt in STRATEGIC:
            for where, value in KEPT.items():
                r = await client.get(sizing_path(), params={"format": fmt, "template_cpu_limit": value})
                assert r.status_code == 200, r.text
                [res] = written(fmt, r.text).values()
                kept = cpu(value)
                assert cpu(res["requests"]["cpu"]) == min(2106, kept), (fmt, where)
                assert mem(res["requests"]["memory"]) == build["memory"]["request_bytes"]  # memory untouched
                limits = res.get("limits") or {}
                if mode == "enforce":
                    assert cpu(limits["cpu"]) == build["cpu"]["limit_millicores"], (fmt, where)
                else:
                    assert "cpu" not in limits, (fmt, where)


BUILD_HELPER_SVC_1755 = [
    container("build", cpu=1755, mem=1800 * MIB),  # p95 1755m: a request of 2106m (S9, buffer 20)
    container("helper", cpu=55, mem=90 * MIB),
    container("svc-postgres", cpu=240, mem=400 * MIB),
]


BY_CONTAINER = [
    ("tekton", "step-build,sidecar-postgres=svc-postgres", "step-build=1,sidecar-postgres=100m",
     {"steps/build": 1000, "sidecars/postgres": 100}),
    ("arc", "job,postgres=svc-postgres", "job=4,postgres=100m", {"$job": 2106, "$postgres": 100}),
    ("argo", "main,postgres=svc-postgres", "500m,main=2", {"main": 2000, "postgres": 288}),
    ("jenkins", "build", "jnlp=1,redis=1", {"build": 2106}),  # names not written change nothing
    ("gitlab", "build,pg=svc-postgres,redis=helper", "build=1,pg=200m,redis=50m",
     {"BUILD_": 1000, "SERVICE_": 50}),  # one setting for every service: within the lowest limit
]  # fmt: skip


async def test_template_cpu_limit_by_container(make_client: Any) -> None:
    async with make_client() as client:
        await post_runs(client, *(run(n, *BUILD_HELPER_SVC_1755) for n in range(3)))
        for fmt, mapping, limits, expected in BY_CONTAINER:
            params = {"format": fmt, "containers": mapping, "template_cpu_limit": limits}
            r = await client.get(sizing_path(), params=params)
            assert r.status_code == 200, r.text
            out = written(fmt, r.text)
            assert {address: cpu(res["requests"]["cpu"]) for address, res in out.items()} == expected, fmt


BAD_TEMPLATE_CPU = [
    ("argo", "lots"),  # not a quantity
    ("argo", "0"),
    ("argo", "-1"),
    ("argo", "main="),
    ("argo", "Main=1"),  # not a container name
    ("argo", "1,2"),  # two defaults
    ("argo", "main=1,main=2"),
    ("json", "1"),  # the spec's shape is not a runner's pod
    ("dotenv", "1"),
]


async def test_a_bad_template_cpu_limit_is_a_422(client: httpx.AsyncClient) -> None:
    for fmt, value in BAD_TEMPLATE_CPU:
        r = await client.get(sizing_path(), params={"format": fmt, "template_cpu_limit": value})
        assert r.status_code == 422, (fmt, value, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["errors"][0]["loc"] == ["query", "template_cpu_limit"]


async def test_template_cpu_limit_is_served_before_routing_as_the_route_serves_it(make_client: Any) -> None:
    from .test_cache import hits, same_response

    async with make_client() as client:
        await post_runs(client, *(run(n, *BUILD_HELPER_SVC_1755) for n in range(3)))
        for query in ("?format=argo&template_cpu_limit=1", "?format=arc&containers=job&template_cpu_limit=job%3D1"):
            routed = await client.get(sizing_path() + query + "&runs=05")  # not canonical: the route answers
            h0, m0 = hits(client)
            cached = await client.get(sizing_path() + query + "&runs=5")
            assert hits(client) == (h0 + 1, m0), query
            same_response(routed, cached)
            assert "2106m" not in routed.text  # clamped, both ways
