"""``ci-sizer collect --grow`` through Kubernetes: the official client talks to an emulated API (tests/growth/
kubeapi.py: ValidatePodResize's rules, a kubelet that writes the accepted limit into the real cgroup the
build runs in, after a delay the test sets, or answers Deferred or Infeasible).

The collector runs inside a cgroup v1 memory cgroup limited to 256 MiB, as a build container's processes
do, and finds its pod from the downward API's variables and its credentials in a kubeconfig."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from .conftest import Sizer
from .helpers import (
    MIB,
    Recorder,
    allocate,
    answer_file,
    enter,
    identity,
    job_growths,
    limited,
    oom_kills,
    stored_container,
    stored_events,
)
from .kubeapi import JSON_PATCH, KubeApi, apply_json_patch, compute_qos, quantity, runner_pod, validate_resize

LIMIT, MAX, STEP = 256 * MIB, 1024 * MIB, 128 * MIB
POD = runner_pod(LIMIT)
NAME, NAMESPACE = POD["metadata"]["name"], POD["metadata"]["namespace"]


# ------------------------------------------------------------------ the emulated API's validation


def _resize(pod: dict[str, Any], ops: list[dict[str, Any]]) -> list[str]:
    return validate_resize(apply_json_patch(pod, ops), pod)


def _memory(i: int, kind: str, value: str) -> dict[str, Any]:
    return {"op": "replace", "path": f"/spec/containers/{i}/resources/{kind}/memory", "value": value}


def test_the_emulated_api_validates_resizes_as_validate_pod_resize_does() -> None:
    # pkg/apis/core/validation/validation.go ValidatePodResize and validateContainerResize, case by case
    ok = [_memory(0, "limits", "384Mi"), _memory(0, "requests", "384Mi")]
    assert _resize(POD, ok) == []  # request and limit together: still Guaranteed
    assert compute_qos(apply_json_patch(POD, ok)) == "Guaranteed"
    assert "Pod QOS Class may not change" in " ".join(_resize(POD, ok[:1]))  # the limit alone: Burstable
    burstable = runner_pod(LIMIT, guaranteed=False)
    assert _resize(burstable, ok[:1]) == []  # a Burstable pod's limit alone: still Burstable
    assert "memory limits cannot be decreased" in " ".join(
        _resize(POD, [_memory(0, "limits", "128Mi"), _memory(0, "requests", "128Mi")])
    )
    image = {"op": "replace", "path": "/spec/containers/0/image", "value": "python:3.13"}
    assert "only cpu and memory resources are mutable" in " ".join(_resize(POD, [*ok, image]))
    disk = {"op": "add", "path": "/spec/containers/0/resources/limits/ephemeral-storage", "value": "1Gi"}
    assert "only cpu and memory resources are mutable" in " ".join(_resize(POD, [*ok, disk]))
    drop = {"op": "remove", "path": "/spec/containers/0/resources/requests/memory"}
    assert "requests cannot be removed" in " ".join(_resize(POD, [drop]))
    assert "must be less than or equal to memory limit" in " ".join(
        _resize(burstable, [_memory(0, "requests", "512Mi")])
    )
    unsupported = copy.deepcopy(POD)
    del unsupported["status"]["containerStatuses"][0]["resources"]
    assert "without support for resize" in " ".join(_resize(unsupported, ok))
    level = copy.deepcopy(POD)
    level["spec"]["resources"] = {"limits": {"memory": "1Gi"}}
    assert _resize(level, ok) == [": Forbidden: pods with pod-level resources cannot be resized"]
    label = {"op": "add", "path": "/metadata/labels/x", "value": "y"}
    assert _resize(POD, [*ok, label])  # metadata does not change through resize


def test_the_emulated_api_refuses_a_merge_patch_body_under_the_json_patch_type() -> None:
    # what the apiserver does with an object sent as application/json-patch+json (the client's default
    # content type for this call): a regression to a dict body would be caught here, as in a cluster
    with KubeApi(POD, cgroup=None) as api:
        body = json.dumps({"spec": {"containers": [{"name": "build", "resources": {"limits": {"memory": "384Mi"}}}]}})
        request = urllib.request.Request(
            f"{api.url}/api/v1/namespaces/{NAMESPACE}/pods/{NAME}/resize", data=body.encode(), method="PATCH",
            headers={"Content-Type": JSON_PATCH, "Authorization": f"Bearer {api.token}"},
        )  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 400


# ------------------------------------------------------------------ the guard through the official client


def _collect(
    tmp_path: Path, api: KubeApi, cg: Path, url: str, job: str, command: list[str], *extra: str
) -> subprocess.CompletedProcess[str]:
    answer = answer_file(tmp_path / "answer.json", limit=LIMIT, max_bytes=MAX, threshold=80, step=STEP)
    env = {
        "KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")),
        "CI_SIZER_POD_NAME": NAME,  # the downward API's metadata.name and metadata.namespace
        "CI_SIZER_POD_NAMESPACE": NAMESPACE,
    }
    return subprocess.run(
        [*enter(cg), sys.executable, "-m", "service", "collect", "--url", url, *identity(job),
         "--interval", "0.2", "--grow", "--answer", str(answer), *extra, "--", *command],
        capture_output=True, text=True, timeout=120, env={**_clean_env(), **env},
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip


def _clean_env() -> dict[str, str]:
    import os

    # not in a cluster: no in-cluster configuration for the client to find first
    return {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "CI_SIZER_"))}


def _results(recorder: Recorder) -> list[tuple[int, int, str]]:
    return [(g["from_bytes"], g["to_bytes"], g["result"]) for g in recorder.last_container().get("growths", [])]


def test_the_build_finishes_through_in_place_resizes(tmp_path: Path, sizer: Sizer) -> None:
    command, report = allocate(tmp_path, 600, rate=150)
    recorder = Recorder(sizer.url)
    with limited("kube", LIMIT) as cg, KubeApi(POD, cgroup=cg, delay=0.1) as api:
        done = _collect(tmp_path, api, cg, recorder.url, "kube", command)
        assert oom_kills(cg) == 0
    assert done.returncode == 0, done.stderr
    results = _results(recorder)
    assert results
    assert all(r == "grown" for _, _, r in results), results
    # each a step from the limit in force, each as the kubelet reported it running
    assert [(f, t) for f, t, _ in results] == [(LIMIT + i * STEP, LIMIT + (i + 1) * STEP) for i in range(len(results))]
    final = results[-1][1]
    assert final >= 768 * MIB  # 600 MiB and the collector's own memory fit under 80 % of it
    # every ask was a JSON Patch naming the container, raising request and limit together (Guaranteed)
    for ops, (_, to, _) in zip(api.patches(), results, strict=True):
        assert ops == [
            {"op": "test", "path": "/spec/containers/0/name", "value": "build"},
            {"op": "replace", "path": "/spec/containers/0/resources/limits/memory", "value": str(to)},
            {"op": "replace", "path": "/spec/containers/0/resources/requests/memory", "value": str(to)},
        ]
    assert api.pod["status"]["qosClass"] == compute_qos(api.pod) == "Guaranteed"
    assert quantity(api.pod["status"]["containerStatuses"][0]["resources"]["limits"]["memory"]) == final
    assert stored_events(sizer.url, "kube") == results  # as the live sizer stored them
    assert job_growths(sizer.url, "kube")["kills_avoided"] == 1
    stored = stored_container(sizer.database, "kube-1")
    assert stored["memory_limit_bytes"] == final
    assert stored["memory_peak_bytes"] == pytest.approx(int(report.read_text()), rel=0.1)
    assert stored["oom_kill_events"] == 0


def test_a_deferred_resize_is_reported_and_grows_once_there_is_room(tmp_path: Path, sizer: Sizer) -> None:
    # the node's other pods leave no room for 128 MiB more; one of them ends a moment later
    command, _ = allocate(tmp_path, 170, rate=200, hold=1.5)
    recorder = Recorder(sizer.url)
    with (
        limited("deferred", LIMIT) as cg,
        KubeApi(POD, cgroup=cg, capacity=4 << 30, others=(4 << 30) - 400 * MIB) as api,
    ):

        def make_room() -> None:
            while not api.patches():
                time.sleep(0.02)
            time.sleep(0.6)
            with api.lock:
                api.others = 1 << 30

        threading.Thread(target=make_room, daemon=True).start()
        done = _collect(tmp_path, api, cg, recorder.url, "deferred", command)
    assert done.returncode == 0, done.stderr
    assert _results(recorder) == [(LIMIT, LIMIT + STEP, "deferred"), (LIMIT, LIMIT + STEP, "grown")]
    assert len(api.patches()) == 1  # asked once; the kubelet retried it
    assert stored_events(sizer.url, "deferred") == _results(recorder)
    assert "Node didn't have enough resource: memory" in done.stderr


def test_an_infeasible_resize_is_reported_and_the_build_runs_on(tmp_path: Path, sizer: Sizer) -> None:
    # above the threshold (80 % of 256 MiB, with the collector's own ~50 MiB) for a second, never above
    # the limit: the one refused resize is reported, and no other is asked for (the kubelet never
    # re-evaluates an Infeasible one)
    command, _ = allocate(tmp_path, 170, rate=200, hold=1.2)
    recorder = Recorder(sizer.url)
    with limited("infeasible", LIMIT) as cg, KubeApi(POD, cgroup=cg, capacity=400 * MIB) as api:
        done = _collect(tmp_path, api, cg, recorder.url, "infeasible", command)
    assert done.returncode == 0, done.stderr
    assert _results(recorder) == [(LIMIT, LIMIT + STEP, "infeasible")]
    assert len(api.patches()) == 1
    assert "Node didn't have enough capacity: memory" in done.stderr
    assert stored_container(sizer.database, "infeasible-1")["memory_limit_bytes"] == LIMIT
    assert job_growths(sizer.url, "infeasible")["events"]["infeasible"] == 1


def test_a_forbidden_resize_is_reported_and_the_build_runs_on(tmp_path: Path, sizer: Sizer) -> None:
    # the pod's service account without the Role: the API's 403, one line, the build as it would have run
    command, _ = allocate(tmp_path, 170, rate=200, hold=0.5)
    recorder = Recorder(sizer.url)
    with limited("forbidden", LIMIT) as cg, KubeApi(POD, cgroup=cg, forbid_resize=True) as api:
        done = _collect(tmp_path, api, cg, recorder.url, "forbidden", command)
    assert done.returncode == 0, done.stderr
    assert _results(recorder) == [(LIMIT, LIMIT + STEP, "error")]
    assert len(api.patches()) == 1
    assert 'cannot patch resource "pods/resize"' in done.stderr
    assert stored_events(sizer.url, "forbidden") == [(LIMIT, LIMIT + STEP, "error")]


def test_a_burst_faster_than_the_kubelet_is_killed_and_reported_too_late(tmp_path: Path, sizer: Sizer) -> None:
    # the kubelet takes two seconds to actuate; 600 MiB arrive in one go
    command, _ = allocate(tmp_path, 600, rate=0, chunk=600)
    recorder = Recorder(sizer.url)
    with limited("late", LIMIT) as cg, KubeApi(POD, cgroup=cg, delay=2.0) as api:
        done = _collect(tmp_path, api, cg, recorder.url, "late", command)
        assert oom_kills(cg) == 1
    assert done.returncode == 137, done.stderr
    results = _results(recorder)
    late = [r for r in results if r[2] == "too_late"]
    assert len(late) == 1, results
    asked = int(quantity(api.patches()[0][1]["value"]))
    assert late[0][:2] == (LIMIT, asked)  # killed at the limit in force, with the ask under way
    assert stored_container(sizer.database, "late-1")["oom_kill_events"] == 1
    assert stored_events(sizer.url, "late") == results
    assert job_growths(sizer.url, "late")["runs_too_late"] == 1


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (runner_pod(LIMIT, restart="RestartContainer"), "resizePolicy is RestartContainer"),
        ({**POD, "spec": {**POD["spec"], "containers": POD["spec"]["containers"][1:]}}, "has no container 'build'"),
    ],
    ids=["restart-policy", "no-container"],
)
def test_a_pod_that_cannot_grow_in_place_runs_the_build_unguarded(
    tmp_path: Path, sizer: Sizer, pod: dict[str, Any], why: str
) -> None:
    recorder = Recorder(sizer.url)
    with limited("unguarded", LIMIT) as cg, KubeApi(pod, cgroup=cg) as api:
        done = _collect(
            tmp_path,
            api,
            cg,
            recorder.url,
            f"unguarded-{pod['spec']['containers'][0]['name']}-{len(pod['spec']['containers'])}",
            [sys.executable, "-c", "exit(4)"],
        )
    assert done.returncode == 4
    lines = [line for line in done.stderr.splitlines() if "growth" in line]
    assert len(lines) == 1, done.stderr
    assert why in lines[0]
    assert lines[0].endswith("the build runs without growth")
    assert not api.patches()
