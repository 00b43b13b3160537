"""The runners' own code against tests/runner_pods.py's models of it (issue 32).

tests/sizing/test_recipes.py merges each recipe's output with the runner's own code where it runs
here and with a model shaped from the cited source where it does not. This module checks the models
against the real thing wherever both run: Kubernetes' strategic merge (``kubectl patch --local``)
against ``strategic_merge_model`` (used on a machine without kubectl), and runner-container-hooks' own
compiled k8s hook at its released versions (v0.7.0, the one actions/runner's image installs, and
v0.8.1) against ``arc_pod``: the pod the hook really POSTs to the API server for a template.

The hooks are not on the npm registry: build them with tests/tools/build-runner-hooks.sh from a clone
of actions/runner-container-hooks (node and the npm registry) and point ``CI_SIZER_RUNNER_HOOKS`` at
the result; without that, those tests skip and say so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .. import runner_hooks as rh
from .. import runner_pods as rp

TEMPLATE = {  # a spec with what the recipes meet: the runners' containers, a CPU limit, an env, a selector
    "nodeSelector": {"pool": "ci"},
    "containers": [
        {"name": "wait", "image": "argoexec", "resources": {"limits": {"cpu": "1"}}},
        {"name": "main", "image": "golang:1.23", "env": [{"name": "A", "value": "1"}],
         "resources": {"limits": {"cpu": "1", "memory": "8Gi"}, "requests": {"cpu": "500m"}}},
    ],
}  # fmt: skip
PATCHES = [
    {"containers": [{"name": "main", "resources": {"requests": {"cpu": "2106m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}}]},
    {"containers": [{"name": "main", "env": [{"name": "B", "value": "2"}]},
                    {"name": "main", "resources": {"requests": {"cpu": "1"}}}]},  # one name twice: merged in turn
    {"containers": [{"name": "redis", "image": "redis:7"}], "nodeSelector": {"zone": "a"}},
    {"containers": [{"name": "main", "resources": {"limits": {"cpu": None}}}]},  # a null deletes
    {"containers": []},  # PatchPodSpec's empty list: nothing changes
    {},
]  # fmt: skip


@pytest.mark.skipif(rp.KUBECTL is None, reason="kubectl is not installed: Kubernetes' strategic merge cannot run here")
@pytest.mark.parametrize("patch", PATCHES, ids=range(len(PATCHES)))
def test_the_strategic_merge_model_is_kubectls(patch: dict[str, Any]) -> None:
    assert rp.strategic_merge_model(TEMPLATE, patch) == rp.kubectl_merge(TEMPLATE, patch)


# --------------------------------------------------------------------------- runner-container-hooks

VERSIONS = rh.versions()
BUILT = pytest.mark.skipif(
    not VERSIONS,
    reason="runner-container-hooks is not built here: run tests/tools/build-runner-hooks.sh CLONE DIR "
    "(node and the npm registry) and set CI_SIZER_RUNNER_HOOKS=DIR; the model in tests/runner_pods.py stands in",
)
RELEASED = ["v0.7.0", "v0.8.1"]


def shape(pod: dict[str, Any]) -> dict[str, Any]:
    """What the tests compare: each container's name, image and resources, and the selector."""
    spec = pod.get("spec", pod)
    containers = [
        {"name": c["name"], "image": c.get("image"), "resources": c.get("resources") or {}} for c in spec["containers"]
    ]
    return {"containers": containers, "nodeSelector": spec.get("nodeSelector")}


def through_the_hook(version: str, tmp: Path, template: Any, services: tuple[str, ...]) -> rh.Prepared:
    if version not in VERSIONS:
        pytest.skip(f"runner-container-hooks {version} is not built under CI_SIZER_RUNNER_HOOKS")
    path = tmp / "template.json"
    path.write_text(template if isinstance(template, str) else json.dumps(template))
    return rh.prepare_job(version, tmp, str(path), services)


ANSWER = {  # what the ARC recipe writes with the sizer answering (docs/integrations/github-actions-arc.md)
    "spec": {"containers": [
        {"name": "$job", "resources": {"requests": {"cpu": "2106m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}},
        {"name": "$postgres", "resources": {"requests": {"cpu": "288m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}}},
    ]}
}  # fmt: skip
MERGED = {  # the user's own template with the sizing merged in by the recipe's jq, a CPU limit of theirs kept
    "metadata": {"labels": {"team": "web"}},
    "spec": {"nodeSelector": {"ci": "true"}, "containers": [
        {"name": "$job", "env": [{"name": "GOFLAGS", "value": "-mod=mod"}],
         "resources": {"limits": {"cpu": "1", "memory": "2Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}}},
        {"name": "logs", "image": "busybox:1.36"},
    ]},
}  # fmt: skip


@BUILT
@pytest.mark.parametrize("version", RELEASED)
@pytest.mark.parametrize(
    ("case", "template", "services"),
    [
        ("answer", ANSWER, ("postgres:16",)),
        ("merged", MERGED, ("postgres:16",)),
        ("no-op", {}, ("postgres:16",)),
        ("no service", ANSWER, ()),
    ],
)
def test_the_hook_builds_the_pod_the_model_builds(
    version: str, case: str, template: Any, services: tuple[str, ...], tmp_path: Path
) -> None:
    prepared = through_the_hook(version, tmp_path, template, services)
    assert prepared.pod is not None, prepared.output
    assert shape(prepared.pod) == shape(rp.arc_pod(template, services, version))
    rp.check_pod(prepared.pod["spec"])


@BUILT
@pytest.mark.parametrize("version", RELEASED)
def test_two_services_of_one_image_get_one_name_in_the_released_hooks(version: str, tmp_path: Path) -> None:
    # issue 32, 4: the page promised "-0"/"-1"; both releases name both "postgres", a pod the API server rejects
    prepared = through_the_hook(version, tmp_path, ANSWER, ("postgres:16", "postgres:15"))
    assert prepared.pod is not None, prepared.output
    assert [c["name"] for c in prepared.pod["spec"]["containers"]] == ["job", "postgres", "postgres"]
    with pytest.raises(rp.Rejected, match="Duplicate value"):
        rp.check_pod(prepared.pod["spec"])


@BUILT
@pytest.mark.parametrize("version", RELEASED)
@pytest.mark.parametrize(("case", "content", "says"), [("empty", "", "Failed to parse"), ("missing", None, "ENOENT")])
def test_a_template_that_is_not_an_object_fails_the_job(
    version: str, case: str, content: str | None, says: str, tmp_path: Path
) -> None:
    # why the ARC recipe writes {} (or the user's template) when the sizer does not answer
    if version not in VERSIONS:
        pytest.skip(f"runner-container-hooks {version} is not built under CI_SIZER_RUNNER_HOOKS")
    path = tmp_path / "template.json"
    if content is not None:
        path.write_text(content)
    prepared = rh.prepare_job(version, tmp_path, str(path), ("postgres:16",))
    assert prepared.pod is None
    assert prepared.returncode != 0
    assert says in prepared.output
    with pytest.raises(rp.Rejected):
        rp.arc_read_template(str(path))
