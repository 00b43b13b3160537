"""The answer's ``grow`` block (issue 40; rules G1-G5 and G8 of docs/sizing.md, the wire contract's
section 1) through the real API on SQLite and PostgreSQL: worked examples, pins, the ceilings it is
bounded by, the unknown phase, the cached and the degraded answer; and ``resizePolicy`` in the pod-patch
formats, merged the way each runner merges them (``kubectl patch --local`` for the strategic merges)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes.client import ApiClient

from .. import runner_pods as rp
from ..helpers import GIB, JOB, MIB, container, post_runs, run, sizing, sizing_path

NOT_REQUIRED = [
    {"resourceName": "cpu", "restartPolicy": "NotRequired"},
    {"resourceName": "memory", "restartPolicy": "NotRequired"},
]


def grow(max_bytes: int, threshold: int, step_bytes: int) -> dict[str, Any]:
    from service.quantity import format_memory

    return {
        "max": format_memory(max_bytes),
        "max_bytes": max_bytes,
        "threshold_percent": threshold,
        "step": format_memory(step_bytes),
        "step_bytes": step_bytes,
    }


# --------------------------------------------------------------------------- the block


async def test_g2_g5_worked_example_seed_confident(make_client: Any) -> None:
    # docs/sizing.md's example: peaks 700, 800, 900 Mi on a 16 GiB node -> limit 2Gi (S9, S12);
    # G3: 2 x max(2Gi, 900Mi) = 4Gi under the node ceiling 14745Mi (G2); G4: 90; G5: 2Gi / 4 = 512Mi
    async with make_client() as client:
        await post_runs(
            client, *(run(n, container(mem=m * MIB), node_memory_bytes=16 * GIB) for n, m in enumerate((700, 800, 900)))
        )
        answer = await sizing(client)
        c = answer["containers"][0]
        assert c["memory"]["limit"] == "2Gi"
        assert list(c)[-1] == "grow"  # after oom (the contract's order)
        assert c["grow"] == grow(4 * GIB, 90, 512 * MIB)
        again = await client.get(sizing_path())  # the cached answer carries it too
        assert again.json()["containers"][0]["grow"] == c["grow"]
    async with make_client(max_memory=3 * GIB) as client:  # G2: --max-memory is the node ceiling (S15)
        assert (await sizing(client))["containers"][0]["grow"] == grow(3 * GIB, 90, 512 * MIB)


async def test_g3_the_peak_sets_the_maximum_under_the_growth_policy(make_client: Any) -> None:
    # G8: four samples 100, 200, 300, 1000 Mi -> limit p75 + 3 % = 490Mi; G3's P = 1000Mi
    async with make_client(sizing_policy="growth") as client:
        await post_runs(client, *(run(n, container(mem=m * MIB)) for n, m in enumerate((100, 1000, 200, 300))))
        answer = await sizing(client)
        c = answer["containers"][0]
        assert answer["meta"]["policy"] == "growth"
        assert (c["memory"]["limit_bytes"], c["observed"]["memory_bytes"]) == (490 * MIB, 1000 * MIB)
        # G3: 2 x 1000Mi, raised to 4Gi; G4: the window went past the limit: 95; G5: 490Mi / 4 -> 123Mi
        assert c["grow"] == grow(4 * GIB, 95, 123 * MIB)


async def test_g3_a_grown_run_is_covered_by_the_next_answer(make_client: Any) -> None:
    # a run that grew from 512Mi to 1Gi and peaked at 900Mi is clean (G6) and a sample: the next answer
    # covers its true peak (seed: 900Mi x 1.2 -> 2Gi), so the job stops needing to grow
    async with make_client() as client:
        small = [run(n, container(mem=300 * MIB, limit=512 * MIB)) for n in range(3)]
        grown = run(3, {**container(mem=900 * MIB, limit=GIB), "growths": [growth(512 * MIB, GIB, "grown")]})
        await post_runs(client, *small, grown)
        c = (await sizing(client))["containers"][0]
        assert c["oom"]["consecutive"] == 0
        assert c["memory"]["limit_bytes"] == 2 * GIB >= 900 * MIB
        assert c["grow"] == grow(4 * GIB, 90, 512 * MIB)


def growth(frm: int, to: int, result: str, at: str = "2026-11-20T10:03:00.250Z") -> dict[str, Any]:
    return {"at": at, "from_bytes": frm, "to_bytes": to, "result": result}


async def test_g1_a_pinned_memory_value_never_grows(make_client: Any) -> None:
    async with make_client() as client:
        await post_runs(client, *(run(n, container("build"), container("helper", mem=64 * MIB)) for n in range(3)))
        r = await client.put("/api/v1/sizing/overrides/acme", json={"cpu_request": "2"})
        assert r.status_code == 201, r.text
        assert all(c["grow"] is not None for c in (await sizing(client))["containers"])  # CPU pins do not matter
        for pin in ({"memory_limit": "1Gi"}, {"memory_request": "256Mi"}):
            r = await client.put("/api/v1/sizing/overrides/" + sizing_path().removeprefix("/api/v1/sizing/"), json=pin)
            assert r.status_code in (200, 201), r.text
            # every container of the job: an override pins them all (O2)
            assert [c["grow"] for c in (await sizing(client))["containers"]] == [None, None], pin
            k8s = yaml.safe_load((await client.get(sizing_path(), params={"format": "k8s"})).text)
            assert "resizePolicy" not in k8s["containers"][0]  # nothing to resize in place


async def test_g2_the_runner_ceiling_bounds_growth(make_client: Any, tmp_path: Path) -> None:
    path = tmp_path / "ceilings.toml"
    path.write_text('[[ceilings]]\norg = "acme"\nmemory_limit = "2Gi"\n')
    async with make_client(runner_ceilings_file=path) as client:
        await post_runs(
            client, *(run(n, container("build", mem=3 * GIB), container("helper", mem=100 * MIB)) for n in range(3))
        )
        build, helper = (await sizing(client))["containers"]
        assert build["runner_ceiling"]["fields"] == ["memory.limit"]
        assert build["grow"] is None  # capped at the ceiling: G1, nothing above it
        assert helper["grow"] == grow(2 * GIB, 90, 64 * MIB)  # 4Gi (G3), bounded by the 2Gi ceiling
    path.write_text('[[ceilings]]\norg = "*"\nmemory_request = "200Mi"\n')
    async with make_client(runner_ceilings_file=path) as client:  # guaranteed: the request grows with the limit
        helper = (await sizing(client))["containers"][1]
        assert helper["grow"] == grow(200 * MIB, 90, 64 * MIB)
    async with make_client(runner_ceilings_file=path, memory_qos="burstable") as client:
        assert (await sizing(client))["containers"][1]["grow"]["max_bytes"] == 4 * GIB


async def test_g2_unknown_phase_and_the_backoff_bound(make_client: Any) -> None:
    async with make_client() as client:
        star = (await sizing(client))["containers"][0]
        assert star["name"] == "*"
        assert star["grow"] == grow(8 * GIB, 90, GIB)  # 2 x 4Gi under --max-backoff-memory's 64Gi
    async with make_client(max_backoff_memory=6 * GIB) as client:
        assert (await sizing(client))["containers"][0]["grow"]["max_bytes"] == 6 * GIB
    async with make_client(max_backoff_memory=4 * GIB) as client:
        assert (await sizing(client))["containers"][0]["grow"] is None  # no room above the 4Gi default


DEAD_PG = "postgresql+asyncpg://nobody@127.0.0.1:9/nothing"  # nothing listens on port 9


async def test_the_degraded_answer_carries_a_grow_block() -> None:
    from service.main import create_app
    from service.settings import Settings

    app = create_app(Settings(database_url=DEAD_PG, sizing_deadline_ms=2000))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            r = await client.get(sizing_path())
            assert r.headers["ci-sizer-degraded"] == "true"
            assert r.json()["containers"][0]["grow"] == grow(8 * GIB, 90, GIB)


def test_the_last_served_answer_keeps_its_grow_block() -> None:
    from service.keys import ScopeKey
    from service.sizing import service as sizing_service
    from service.sizing.answer import Answer
    from service.sizing.history import History
    from service.sizing.params import DEFAULT

    key = ScopeKey(**JOB)
    policy = sizing_service.Policy(max_memory=3 * GIB)
    answer = sizing_service.compute(key=key, history=History(), pins={}, params=DEFAULT, policy=policy)
    assert answer.containers[0].grow is None  # 4Gi default above the 3Gi ceiling: capped at 3Gi, no room
    served = sizing_service.compute(
        key=key, history=History(), pins={}, params=DEFAULT, policy=sizing_service.Policy(max_memory=6 * GIB)
    )
    degraded = sizing_service.degraded(key=key, last=served, params=DEFAULT, policy=policy)
    assert degraded.meta.degraded
    assert degraded.containers[0].grow == served.containers[0].grow
    assert Answer.from_dict(served.as_dict()) == served  # the cache's round trip keeps it


# --------------------------------------------------------------------------- resizePolicy through each runner's merge

KUBECTL = shutil.which("kubectl")


def kubectl_merge(pod_spec: dict[str, Any], patch: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """Kubernetes' own strategic merge of a PodSpec patch (k8s.io/apimachinery strategicpatch, what Argo's
    ApplyPodSpecPatch and Buildkite's PatchPodSpec call), run by ``kubectl patch --local``."""
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: the strategic merge cannot be run")
    pod = tmp_path / "pod.json"
    pod.write_text(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod_spec}))
    out = subprocess.run(
        [KUBECTL, "patch", "--local", "-f", str(pod), "--type", "strategic", "-p", json.dumps({"spec": patch}), "-o", "json"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    spec: dict[str, Any] = json.loads(out.stdout)["spec"]
    return spec


def resize_policy_of(spec: dict[str, Any], name: str) -> Any:
    """The container's resizePolicy as the Kubernetes client's models read it (None: not set)."""
    pod = ApiClient().deserialize(json.dumps({"spec": spec}), "V1Pod", "application/json")
    c = next(c for c in pod.spec.containers if c.name == name)
    return None if c.resize_policy is None else [p.to_dict() for p in c.resize_policy]


# the runner's pod, its main container with a resizePolicy a template could have set: the answer must win
RESTART = [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]


def with_template_policy(pod: rp.Pod, main: str) -> rp.Pod:
    for c in pod["containers"]:
        if c["name"] == main:
            c["resizePolicy"] = [dict(p) for p in RESTART]
    return pod


WANT = [
    {"resource_name": "cpu", "restart_policy": "NotRequired"},
    {"resource_name": "memory", "restart_policy": "NotRequired"},
]


@pytest.fixture
async def texts(make_client: Any) -> dict[str, str]:
    async with make_client() as client:
        await post_runs(
            client, *(run(n, container("build", mem=GIB), container("helper", mem=64 * MIB)) for n in range(3))
        )
        out = {}
        for fmt in ("k8s", "argo", "buildkite", "jenkins", "arc", "tekton", "tekton-v1beta1", "gitlab", "dotenv"):
            r = await client.get(sizing_path(), params={"format": fmt})
            assert r.status_code == 200, r.text
            out[fmt] = r.text
        return out


def test_argo_apply_pod_spec_patch_keeps_resize_policy(texts: dict[str, str], tmp_path: Path) -> None:
    # argo-workflows workflow/util/util.go ApplyPodSpecPatch: strategicpatch.StrategicMergePatch of the
    # PodSpec (k8s.io/api v0.35, whose Container has resizePolicy, +listType=atomic: replaced whole)
    patch = json.loads(texts["argo"])
    assert patch["containers"][0]["resizePolicy"] == NOT_REQUIRED
    spec = kubectl_merge(with_template_policy(rp.argo_pod(), "main"), patch, tmp_path)
    assert resize_policy_of(spec, "main") == WANT
    assert resize_policy_of(spec, "wait") is None  # untouched


def test_buildkite_patch_pod_spec_keeps_resize_policy(texts: dict[str, str], tmp_path: Path) -> None:
    # agent-stack-k8s internal/controller/scheduler/scheduler.go PatchPodSpec: the same strategic merge
    # (k8s.io/api v0.36) after its command checks, which a patch without command or args passes
    # format=buildkite answers the podSpecPatch's containers items (issue 32), placed in the user's one entry
    patch = {"containers": yaml.safe_load(texts["buildkite"])}
    spec = kubectl_merge(with_template_policy(rp.buildkite_pod(), "container-0"), patch, tmp_path)
    assert resize_policy_of(spec, "container-0") == WANT
    assert resize_policy_of(spec, "agent") is None


def test_k8s_strategic_merge_keeps_resize_policy(texts: dict[str, str], tmp_path: Path) -> None:
    patch = yaml.safe_load(texts["k8s"])
    base = {"containers": [{"name": "build", "image": "golang:1.23", "resizePolicy": RESTART}]}
    assert resize_policy_of(kubectl_merge(base, patch, tmp_path), "build") == WANT


def test_jenkins_combine_keeps_resize_policy(texts: dict[str, str]) -> None:
    # kubernetes-plugin PodTemplateBuilder: combine(yaml pod, containerTemplates); PodTemplateUtils.combine
    # (Container parent, Container template) builds the result with new ContainerBuilder(parent), the
    # yaml's container, so its resizePolicy stays (a template sets only image, command, resources, env, ...)
    pod = rp.jenkins_apply([rp.jenkins_template("jnlp", "jenkins/inbound-agent:latest")], [texts["jenkins"]])
    assert resize_policy_of(pod, "jnlp") == WANT


def test_arc_hook_template_keeps_resize_policy(texts: dict[str, str]) -> None:
    # runner-container-hooks packages/k8s/src/k8s/utils.ts mergeContainerWithOptions copies every field but
    # name and image; @kubernetes/client-node 1.4 serializes V1Container.resizePolicy
    # format=arc is the hook template as one line of JSON (issue 32), which the recipe writes (merged with
    # a template of the user's own by jq) to ACTIONS_RUNNER_CONTAINER_HOOK_TEMPLATE
    pod = rp.arc_pod(json.loads(texts["arc"]))
    assert resize_policy_of(pod, "job") == WANT


def test_formats_without_the_field_do_not_write_it(texts: dict[str, str]) -> None:
    # tektoncd/pipeline pkg/apis/pipeline/v1/taskrun_types.go TaskRunStepSpec {name, computeResources}
    # (v1beta1 TaskRunStepOverride {name, resources}): a resizePolicy would fail the TaskRun; GitLab's
    # overwrites (executors/kubernetes/overwrites.go) and dotenv are variables
    for fmt in ("tekton", "tekton-v1beta1", "gitlab", "dotenv"):
        assert "resizePolicy" not in texts[fmt], fmt
    spec = yaml.safe_load(texts["tekton"])
    task = {"steps": [{"name": "build", "image": "golang:1.23"}]}
    rp.tekton_apply(task, spec, v1=True)  # the TaskRun spec's stepSpecs: still valid input for the controller
