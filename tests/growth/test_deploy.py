"""deploy/kubernetes/growth: the Role and RoleBinding `ci-sizer collect --grow` needs in the CI pods'
namespace, rendered as tests/test_deploy.py renders the deployment (and compared with `kubectl kustomize`
where it is installed), validated strictly against the Kubernetes schema, and held to the two calls the
Kubernetes actuator makes."""

from __future__ import annotations

import copy
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from ..test_deploy import KUBE, _by_key, render

GROWTH = KUBE / "growth"


def test_the_manifests_validate_against_the_kubernetes_schema() -> None:
    docs = render(GROWTH)
    assert {d["kind"] for d in docs} == {"Role", "RoleBinding"}
    version = kubernetes_validate.latest_version()
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
    bad = copy.deepcopy(_by_key(docs)[("Role", "ci-sizer-growth")])
    bad["rules"][0]["verb"] = ["get"]  # misspelt: a strict check refuses it
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


def test_the_role_allows_exactly_what_the_actuator_calls() -> None:
    # service/growth/kube.py: read_namespaced_pod (GET pods/{name}) and patch_namespaced_pod_resize
    # (PATCH pods/{name}/resize), nothing more
    docs = _by_key(render(GROWTH))
    role, binding = docs[("Role", "ci-sizer-growth")], docs[("RoleBinding", "ci-sizer-growth")]
    allowed = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert allowed == {("", "pods", "get"), ("", "pods/resize", "patch")}
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"]
    # a ServiceAccount subject without a namespace is the binding's own (pkg/registry/rbac/validation/rule.go
    # appliesToUser): the CI pods' service account in their namespace
    assert [(s["kind"], s.get("namespace")) for s in binding["subjects"]] == [("ServiceAccount", None)]


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not installed (the renderer is checked where it is)"
)
def test_the_renderer_agrees_with_kubectl_kustomize() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(GROWTH)], capture_output=True, text=True, check=True).stdout
    assert _by_key(render(GROWTH)) == _by_key([d for d in yaml.safe_load_all(out) if d])
