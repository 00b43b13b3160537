"""``ci-sizer webhook serve`` end to end: a real HTTPS server with the certificate ``ci-sizer webhook certs``
made, sent the AdmissionReviews the API server sends for each runner's pod (tests/webhook/pods.py), with
the sizer answering, down, hanging, unsure, and for a job it has never seen. Every answer is checked as
the API server checks it, its patch applied with a JSON-patch library and the pod held to the API
server's rules (checks.py)."""

from __future__ import annotations

import copy
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.quantity import parse_cpu_millicores, parse_memory_bytes
from service.sizing.answer import Answer
from service.sizing.formats import main_container

from ..http_stub import StubServer
from ..live import LiveServer
from . import pods
from .checks import apply, container, verify_response
from .conftest import LEARNED, NAMESPACE, READ_TOKEN, SERVICE_NAME, Webhook, start_webhook, stop, wait_until_serving

RUNNERS: dict[str, tuple[Callable[[], pods.Doc], str]] = {
    "arc": (pods.arc, "job"),
    "gitlab": (pods.gitlab, "build"),
    "buildkite": (pods.buildkite, "container-0"),
    "jenkins": (pods.jenkins, "jnlp"),
    "tekton": (pods.tekton, "step-build"),
    "argo": (pods.argo, "main"),
}


@pytest.fixture(scope="module")
def up(webhooks: dict[str, Webhook]) -> Iterator[tuple[Webhook, httpx.Client]]:
    hook = webhooks["up"]
    with hook.client() as client:
        yield hook, client


def sizer_answer(sizer: LiveServer, job: dict[str, str]) -> Answer:
    path = "/".join(quote(job[f], safe="") for f in ("org", "repo", "workflow", "job"))
    r = httpx.get(f"{sizer.url}/api/v1/sizing/{path}", headers={"Authorization": f"Bearer {READ_TOKEN}"})
    assert r.status_code == 200
    return Answer.from_dict(r.json())


def results(text: str) -> dict[str, float]:
    for family in text_string_to_metric_families(text):
        if family.name == "ci_sizer_webhook_requests":
            return {s.labels["result"]: s.value for s in family.samples if s.name.endswith("_total")}
    raise AssertionError("ci_sizer_webhook_requests_total is not exported")


def reviewed(hook: Webhook, client: httpx.Client, pod: pods.Doc, **kw: Any) -> tuple[dict[str, Any], list[Any]]:
    review = pods.review(pod, kw.pop("namespace", NAMESPACE), **kw)
    r = hook.post(client, review)
    assert r.status_code == 200, r.text
    answer = r.json()
    return answer, verify_response(review, answer)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_each_runner_s_pod_starts_with_its_job_s_answer(
    runner: str, up: tuple[Webhook, httpx.Client], sizer: LiveServer
) -> None:
    hook, client = up
    factory, main = RUNNERS[runner]
    pod = factory()
    answer, ops = reviewed(hook, client, pod)
    assert answer["response"]["auditAnnotations"] == {"result": "patched"}
    out = apply(pod, ops)
    expected = main_container(sizer_answer(sizer, LEARNED[runner][0]).containers)
    res = container(out, main)["resources"]
    assert parse_memory_bytes(res["requests"]["memory"]) == expected.memory.request_bytes
    assert parse_memory_bytes(res["limits"]["memory"]) == expected.memory.limit_bytes
    kept = (((container(pod, main).get("resources") or {}).get("limits")) or {}).get("cpu")
    want_cpu = expected.cpu.request_millicores
    if kept is not None:  # the pod's own CPU limit (Jenkins' 1, GitLab's 4, the Task's 2): never below the request
        want_cpu = min(want_cpu, parse_cpu_millicores(kept))
        assert res["limits"]["cpu"] == kept
    assert parse_cpu_millicores(res["requests"]["cpu"]) == want_cpu
    # containers the answer does not name are as the runner made them
    named = {main} | {c.name for c in sizer_answer(sizer, LEARNED[runner][0]).containers}
    for original in pod["spec"]["containers"]:
        name = original["name"]
        if name not in named and name.partition("-")[2] not in named:
            assert container(out, name) == original, name


def test_a_sidecar_the_job_recorded_is_sized_too(up: tuple[Webhook, httpx.Client]) -> None:
    hook, client = up
    for pod, name in ((pods.arc(), "postgres"), (pods.tekton(), "sidecar-postgres")):
        _, ops = reviewed(hook, client, pod)
        out = apply(pod, ops)
        assert parse_cpu_millicores(container(out, name)["resources"]["requests"]["cpu"]) > 0


def test_runner_ceilings_clamp(up: tuple[Webhook, httpx.Client]) -> None:
    # acme's ceiling is 6Gi; the GitLab job peaked at 10 GiB
    hook, client = up
    pod = pods.gitlab()
    _, ops = reviewed(hook, client, pod)
    res = container(apply(pod, ops), "build")["resources"]
    assert parse_memory_bytes(res["limits"]["memory"]) == 6 << 30
    assert parse_memory_bytes(res["requests"]["memory"]) <= 6 << 30


def test_a_job_never_seen_keeps_the_runner_s_resources(up: tuple[Webhook, httpx.Client]) -> None:
    hook, client = up
    pod = pods.gitlab()
    for e in pod["spec"]["containers"][0]["env"]:
        if e["name"] == "CI_JOB_NAME":
            e["value"] = "never-seen"
    answer, ops = reviewed(hook, client, pod)
    assert ops == []
    assert answer["response"]["auditAnnotations"] == {"result": "no_answer"}


def test_an_unknown_identity_is_allowed_unchanged(up: tuple[Webhook, httpx.Client]) -> None:
    hook, client = up
    answer, ops = reviewed(hook, client, pods.arc(identity=False))
    assert ops == []
    assert answer["response"]["auditAnnotations"] == {"result": "unknown_identity"}


def test_a_dry_run_gets_the_same_patch(up: tuple[Webhook, httpx.Client]) -> None:
    hook, client = up
    _, ops = reviewed(hook, client, pods.tekton())
    _, dry = reviewed(hook, client, pods.tekton(), dry_run=True)
    assert dry == ops


def test_the_webhook_s_own_namespace_and_other_requests_are_never_changed(up: tuple[Webhook, httpx.Client]) -> None:
    hook, client = up
    for kw in ({"namespace": "ci-sizer"}, {"operation": "UPDATE"}):
        answer, ops = reviewed(hook, client, pods.gitlab(), **kw)
        assert ops == []
        assert answer["response"]["auditAnnotations"] == {"result": "error"}


def test_a_body_that_is_not_a_review_is_a_400(up: tuple[Webhook, httpx.Client]) -> None:
    hook, client = up
    for body in ({"kind": "AdmissionReview"}, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}):
        r = hook.post(client, body)
        assert r.status_code == 400
        assert r.headers["content-type"] == "application/problem+json"
    r = client.post("/mutate", content=b"not json", extensions={"sni_hostname": SERVICE_NAME})
    assert r.status_code == 400


def test_the_certificate_is_the_one_the_api_server_checks(up: tuple[Webhook, httpx.Client]) -> None:
    hook, _ = up
    with httpx.Client(base_url=hook.url, verify=ssl.create_default_context()) as untrusting:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.get("/healthz", extensions={"sni_hostname": SERVICE_NAME})
    with hook.client() as client, pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        client.get("/healthz", extensions={"sni_hostname": "ci-sizer-webhook.elsewhere.svc"})


def test_results_and_latency_are_counted(up: tuple[Webhook, httpx.Client]) -> None:
    hook, client = up
    before = results(hook.metrics(client))
    reviewed(hook, client, pods.argo())
    reviewed(hook, client, pods.argo(repo=None))
    after = results(hook.metrics(client))
    assert set(after) == {"patched", "unknown_identity", "no_answer", "deadline", "error"}
    assert after["patched"] - before["patched"] == 1
    assert after["unknown_identity"] - before["unknown_identity"] == 1
    text = hook.metrics(client)
    assert "ci_sizer_webhook_request_duration_seconds_bucket" in text
    assert "ci_sizer_http_requests_total" not in text  # the webhook exports its own, not the sizer's


@pytest.mark.parametrize(("which", "result"), [("down", "error"), ("hanging", "deadline")])
def test_a_sizer_down_or_hanging_never_holds_a_pod(webhooks: dict[str, Webhook], which: str, result: str) -> None:
    hook = webhooks[which]
    with hook.client() as client:
        before = results(hook.metrics(client))
        started = time.monotonic()
        answer, ops = reviewed(hook, client, pods.buildkite())
        took = time.monotonic() - started
        after = results(hook.metrics(client))
    assert ops == []
    assert answer["response"]["allowed"] is True
    assert answer["response"]["auditAnnotations"] == {"result": result}
    assert after[result] - before[result] == 1
    # within the configuration's timeoutSeconds (2 s): the API server gets the answer, not a timeout
    assert took < 2.0
    if which == "hanging":
        assert took >= 0.3  # it did wait for its deadline


def test_a_degraded_answer_is_not_applied(sizer: LiveServer, certs: Any, tmp_path: Any) -> None:
    # a sizer that could not read its database in time answers 200 with meta.degraded: the webhook is unsure
    real = sizer_answer(sizer, LEARNED["argo"][0]).as_dict()
    degraded = copy.deepcopy(real)
    degraded["meta"]["degraded"] = True
    stubs = {
        result: StubServer(lambda method, path, raw, body=body: (200, body))
        for body, result in ((degraded, "no_answer"), (real, "patched"))
    }
    hooks = {result: start_webhook(stub.url, certs, tmp_path / f"{result}.log") for result, stub in stubs.items()}
    try:
        for result, hook in hooks.items():
            wait_until_serving(hook)
            with hook.client() as client:
                answer, _ = reviewed(hook, client, pods.argo())
            assert answer["response"]["auditAnnotations"] == {"result": result}
            assert stubs[result].requests[0][1] == "/api/v1/sizing/ci/web/argo/build"
    finally:
        for hook in hooks.values():
            stop(hook)
        for stub in stubs.values():
            stub.close()


def test_a_renewed_certificate_is_served_without_a_restart(sizer: LiveServer, tmp_path: Any) -> None:
    from .conftest import make_certs

    live = make_certs(tmp_path / "live")
    hook = start_webhook(sizer.url, live, tmp_path / "hook.log", "--cert-reload-seconds", "0.2")
    try:
        wait_until_serving(hook)
        old_ca = hook.ca_file.read_bytes()
        renewed = make_certs(tmp_path / "renewed")  # a new CA, as a re-run of the command (or cert-manager) makes
        for name in ("tls.key", "tls.crt"):
            (live / name).write_bytes((renewed / name).read_bytes())
        new = Webhook(hook.url, renewed / "ca.crt", hook.proc, hook.log)
        deadline = time.monotonic() + 30
        while True:
            try:
                with new.client(timeout=2) as client:
                    if client.get("/healthz", extensions={"sni_hostname": SERVICE_NAME}).status_code == 200:
                        break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, "the renewed certificate was not served"
                time.sleep(0.1)
        assert hook.proc.poll() is None  # the same process
        assert (renewed / "ca.crt").read_bytes() != old_ca
        with hook.client(timeout=2) as client, pytest.raises(httpx.ConnectError):  # the old CA no longer verifies it
            client.get("/healthz", extensions={"sni_hostname": SERVICE_NAME})
        assert "certificate reloaded" in hook.log.read_text()
    finally:
        stop(hook)
