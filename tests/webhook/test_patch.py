"""The JSON patch (service/webhook/patch.py) on each runner's pod: only the containers the answer
names, the pod's own CPU limit kept above the request (fit_cpu), other resources kept, native sidecars
sized and plain init containers not, resizePolicy where the answer may grow."""

from __future__ import annotations

from typing import Any

import pytest

from service.quantity import format_cpu, format_memory
from service.sizing.answer import Answer, Container, Cpu, Grow, Memory, Meta, Observed, Oom, Sources
from service.webhook.identity import identify
from service.webhook.patch import plan

from . import pods
from .checks import apply, container

GIB = 1 << 30


def sized(
    name: str, cpu: int, mem: int, *, cpu_limit: int | None = None, enforced: bool = False, grow: bool = False
) -> Container:
    lim = cpu_limit if cpu_limit is not None else cpu * 2
    return Container(
        name=name,
        cpu=Cpu(format_cpu(cpu), format_cpu(lim), cpu, lim, enforced, Sources("algorithm", "algorithm")),
        memory=Memory(format_memory(mem), format_memory(mem), mem, mem, Sources("algorithm", "algorithm")),
        observed=Observed(cpu_millicores=cpu / 2, memory_bytes=mem // 2),
        oom=Oom(0, 1, False),
        grow=Grow(max=format_memory(4 * mem), max_bytes=4 * mem, threshold_percent=80, step="1Gi", step_bytes=GIB)
        if grow
        else None,
    )


def answer(*containers: Container, phase: str = "learning") -> Answer:
    meta = Meta(phase, 3, 3, 3, 10, "p95", "global", "observe", "guaranteed", "seed", None, "2026-11-26T00:00:00Z")  # type: ignore[arg-type]
    return Answer("acme", "web", "ci.yml", "build", list(containers), meta)


def patched(pod: pods.Doc, a: Answer) -> tuple[pods.Doc, list[dict[str, Any]]]:
    who = identify(pod, "ci")
    assert who is not None
    ops = plan(pod, a, who)
    return apply(pod, ops), ops


def test_only_the_named_containers_change() -> None:
    pod = pods.gitlab()
    out, ops = patched(pod, answer(sized("build", 1500, 3 * GIB), sized("svc-0", 300, GIB)))
    assert [op["path"] for op in ops] == ["/spec/containers/0/resources", "/spec/containers/2/resources"]
    assert container(out, "helper") == container(pod, "helper")
    assert container(out, "build")["resources"]["requests"] == {"cpu": "1500m", "memory": "3Gi"}
    # observe mode: config.toml's cpu_limit (4) is the pod's and stays; memory is the answer's
    assert container(out, "build")["resources"]["limits"] == {"cpu": "4", "memory": "3Gi"}
    assert container(out, "svc-0")["resources"]["requests"] == {"cpu": "300m", "memory": "1Gi"}


def test_a_cpu_limit_in_the_pod_is_never_below_the_new_request() -> None:
    # Jenkins' jnlp keeps the containerTemplate's limit of 1 CPU: a 2500m answer is written as 1
    out, _ = patched(pods.jenkins(cpu_limit="1"), answer(sized("build", 2500, 2 * GIB)))
    res = container(out, "jnlp")["resources"]
    assert res["requests"]["cpu"] == "1"
    assert res["limits"]["cpu"] == "1"
    # enforce mode writes the answer's own limit in place of the pod's, the request within it
    enforced = sized("build", 2500, 2 * GIB, cpu_limit=3000, enforced=True)
    out, _ = patched(pods.jenkins(cpu_limit="1"), answer(enforced))
    res = container(out, "jnlp")["resources"]
    assert (res["requests"]["cpu"], res["limits"]["cpu"]) == ("1", "3")
    # no CPU limit in the pod and observe mode: none is written
    out, _ = patched(pods.jenkins(cpu_limit=None), answer(sized("build", 2500, 2 * GIB)))
    assert "cpu" not in container(out, "jnlp")["resources"]["limits"]


def test_other_resources_stay() -> None:
    extra = {"nvidia.com/gpu": "1", "ephemeral-storage": "10Gi"}
    pod = pods.arc(job_resources=pods.res("1", "1Gi", "2", "2Gi", extra=extra))
    out, _ = patched(pod, answer(sized("build", 700, 3 * GIB)))
    res = container(out, "job")["resources"]
    assert res["requests"] == {"cpu": "700m", "memory": "3Gi", **extra}
    assert res["limits"] == {"cpu": "2", "memory": "3Gi", **extra}


def test_sidecars() -> None:
    pod = pods.tekton()
    # a native sidecar: an init container that keeps running beside the steps
    pod["spec"]["initContainers"].append({"name": "sidecar-cache", "image": "redis:7", "restartPolicy": "Always"})
    a = answer(
        sized("build", 1200, 2 * GIB),
        sized("postgres", 200, GIB),
        sized("cache", 100, GIB // 2),
        sized("prepare", 100, GIB),
    )
    out, _ = patched(pod, a)
    assert container(out, "step-build")["resources"]["requests"] == {"cpu": "1200m", "memory": "2Gi"}
    assert container(out, "sidecar-postgres")["resources"]["requests"] == {"cpu": "200m", "memory": "1Gi"}
    assert container(out, "sidecar-cache", "initContainers")["resources"]["requests"] == {
        "cpu": "100m",
        "memory": "512Mi",
    }
    assert "resources" not in container(out, "prepare", "initContainers")  # runs to completion first: never
    assert "resources" not in container(out, "step-test")  # nothing recorded under "test"


def test_resize_policy_where_the_answer_may_grow() -> None:
    pod = pods.argo()
    pod["spec"]["initContainers"].append({"name": "cache", "image": "redis:7", "restartPolicy": "Always"})
    out, _ = patched(pod, answer(sized("build", 500, GIB, grow=True), sized("cache", 100, GIB, grow=True)))
    assert container(out, "main")["resizePolicy"] == [
        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "memory", "restartPolicy": "NotRequired"},
    ]
    assert "resizePolicy" not in container(out, "cache", "initContainers")
    out, _ = patched(pods.argo(), answer(sized("build", 500, GIB)))
    assert "resizePolicy" not in container(out, "main")
    windows = pods.argo()
    windows["spec"]["os"] = {"name": "windows"}
    out, _ = patched(windows, answer(sized("build", 500, GIB, grow=True)))
    assert "resizePolicy" not in container(out, "main")


def test_an_answer_that_names_no_container_of_the_pod_is_no_patch() -> None:
    pod = pods.tekton()
    pod["spec"]["containers"] = [c for c in pod["spec"]["containers"] if c["name"] != "step-build"]
    who = identify(pod, "ci")
    assert who is not None
    assert plan(pod, answer(sized("compile", 500, GIB)), who) == []


@pytest.mark.parametrize("factory", [pods.arc, pods.gitlab, pods.buildkite, pods.jenkins, pods.tekton, pods.argo])
def test_every_runner_s_pod_patched_passes_the_api_server_s_rules(factory: Any) -> None:
    for a in (
        answer(sized("build", 50, 64 << 20)),
        answer(sized("build", 16000, 64 * GIB, cpu_limit=20000, enforced=True)),
    ):
        out, ops = patched(factory(), a)
        assert ops
        assert len(out["spec"]["containers"]) == len(factory()["spec"]["containers"])
