"""Fixture pods of each runner and the way each runner merges a sizing answer into its pod.

Container names and layout come from the runners' own source (paths cited per runner). The merges
are small models of what each runner does with the patch, enough to tell a valid pod from one the
API server or the runner's controller rejects; they are not copies of the runners' code.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import yaml
from kubernetes.utils import parse_quantity

Pod = dict[str, Any]
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class Rejected(Exception):
    """What the runner (or the API server behind it) refuses."""


def container(name: str, image: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, **extra}


def strategic_merge_containers(pod: Pod, patch: dict[str, Any]) -> Pod:
    """A strategic merge patch of ``containers`` (patchMergeKey ``name``, k8s.io/api core/v1
    PodSpec): an entry whose name the pod has is merged into that container; any other entry is
    added as a new container, as it is (so without an image, unless the patch gives one)."""
    merged = copy.deepcopy(pod)
    by_name = {c["name"]: c for c in merged["containers"]}
    for entry in patch.get("containers") or []:
        target = by_name.get(entry["name"])
        if target is None:
            merged["containers"].append(copy.deepcopy(entry))
            continue
        for field, value in entry.items():
            if field == "resources":
                res = target.setdefault("resources", {})
                for kind, quantities in value.items():
                    res.setdefault(kind, {}).update(quantities)
            else:
                target[field] = value
    return merged


def check_pod(pod: Pod) -> None:
    """What the API server checks of the containers that matter here: a DNS-1123 name, an image,
    quantities that parse (the Kubernetes client's parser as the oracle), requests within limits."""
    for c in pod["containers"]:
        if not DNS_LABEL.fullmatch(c["name"]):
            raise Rejected(f"container name {c['name']!r} is not a DNS-1123 label")
        if not c.get("image"):
            raise Rejected(f"spec.containers[{c['name']}].image: Required value")
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            for q in (res.get(kind) or {}).values():
                parse_quantity(q)  # raises ValueError for an invalid quantity
        for resource, request in (res.get("requests") or {}).items():
            limit = (res.get("limits") or {}).get(resource)
            if limit is not None and parse_quantity(request) > parse_quantity(limit):
                raise Rejected(f"{c['name']}: {resource} request {request} above its limit {limit}")


# --------------------------------------------------------------------------- Argo Workflows
# argo-workflows workflow/common/common.go: MainContainerName = "main", WaitContainerName = "wait";
# workflow/controller/workflowpod.go builds the pod; workflow/util/util.go ApplyPodSpecPatch parses
# the patch (JSON, or YAML converted to JSON) as a PodSpec and applies it with
# strategicpatch.StrategicMergePatch.


def argo_pod(sidecars: tuple[str, ...] = ()) -> Pod:
    return {
        "initContainers": [container("init", "quay.io/argoproj/argoexec:latest")],
        "containers": [
            container("wait", "quay.io/argoproj/argoexec:latest"),
            container("main", "golang:1.23"),
            *(container(name, f"{name}:latest") for name in sidecars),
        ],
    }


def argo_apply(pod: Pod, patch_text: str) -> Pod:
    text = patch_text.strip()
    patch = json.loads(text) if text.startswith("{") else yaml.safe_load(text)
    if not isinstance(patch, dict):
        raise Rejected("invalid podSpecPatch: not a PodSpec")
    return strategic_merge_containers(pod, patch)


# --------------------------------------------------------------------------- GitHub ARC
# actions/runner-container-hooks packages/k8s/src/hooks/constants.ts: JOB_CONTAINER_NAME = "job",
# CONTAINER_EXTENSION_PREFIX = "$"; packages/k8s/src/hooks/prepare-job.ts names each service
# container generateContainerName(image) (packages/k8s/src/k8s/utils.ts: the last path segment of the
# image, without its tag; "-N" suffixes when two share one) and merges the template entry "$<name>"
# into it (mergeContainerWithOptions: every field but name and image); mergePodSpecWithOptions then
# APPENDS every template container whose name does not start with "$". readExtensionFromFile throws
# "Failed to parse <file>" when the template is empty or not a mapping.


def arc_service_name(image: str) -> str:
    name = image.split("/")[-1].split(":")[0]
    if not name:
        raise Rejected(f"Image definition '{image}' is invalid")
    return name


def arc_pod(services: tuple[str, ...] = ()) -> Pod:
    return {
        "containers": [
            container("job", "node:20"),
            *(container(arc_service_name(image), image) for image in services),
        ]
    }


def arc_apply(pod: Pod, template_text: str) -> Pod:
    doc = yaml.safe_load(template_text)
    if not isinstance(doc, dict):  # JavaScript's `!doc || typeof doc !== 'object'`: {} passes, '' does not
        raise Rejected("Failed to parse the hook template")
    merged = copy.deepcopy(pod)
    spec = doc.get("spec") or {}
    entries = spec.get("containers") or []
    for c in merged["containers"]:
        entry = next((e for e in entries if e.get("name") == "$" + c["name"]), None)
        if entry is not None:
            for field, value in entry.items():
                if field not in ("name", "image"):
                    c[field] = value
    merged["containers"] += [copy.deepcopy(e) for e in entries if not str(e.get("name", "")).startswith("$")]
    return merged


# --------------------------------------------------------------------------- Buildkite
# buildkite/agent-stack-k8s internal/controller/scheduler/scheduler.go: AgentContainerName = "agent",
# CheckoutContainerName = "checkout", DefaultCommandContainerName = "container-0" (command
# containers of a plugin podSpec are "container-%d" when unnamed); PatchPodSpec applies the
# kubernetes plugin's podSpecPatch with strategicpatch.StrategicMergePatch.


def buildkite_pod(commands: int = 1) -> Pod:
    return {
        "containers": [
            container("checkout", "buildkite/agent:3"),
            *(container(f"container-{i}", "buildkite/agent:3") for i in range(commands)),
            container("agent", "buildkite/agent:3"),
        ]
    }


def buildkite_apply(pod: Pod, plugin: dict[str, Any] | None) -> Pod:
    patch = (plugin or {}).get("podSpecPatch") or {}
    return strategic_merge_containers(pod, patch)


# --------------------------------------------------------------------------- Jenkins
# jenkinsci/kubernetes-plugin src/main/java/org/csanchez/jenkins/plugins/kubernetes/PodTemplateBuilder.java:
# the pod is combine(yaml pod, containerTemplates) (PodTemplateUtils.combineContainers: by name, a
# yaml container with no template keeps what it has), then the agent container (KubernetesCloud.JNLP_NAME
# "jnlp") is added if absent and given the default agent image if it has none.


def jenkins_pod(templates: tuple[tuple[str, str], ...] = (("build", "maven:3"),)) -> list[dict[str, Any]]:
    return [container(name, image) for name, image in templates]


def jenkins_apply(templates: list[dict[str, Any]], yaml_text: str) -> Pod:
    doc = yaml.safe_load(yaml_text) if yaml_text.strip() else {}
    base = {"containers": list(((doc or {}).get("spec") or {}).get("containers") or [])}
    pod = strategic_merge_containers(base, {"containers": templates})
    for c in pod["containers"]:  # a template's image wins over the yaml's (none here)
        t = next((t for t in templates if t["name"] == c["name"]), None)
        if t is not None:
            c["image"] = t["image"]
    if not any(c["name"] == "jnlp" for c in pod["containers"]):
        pod["containers"].append(container("jnlp", "jenkins/inbound-agent:latest"))
    for c in pod["containers"]:
        if c["name"] == "jnlp" and not c.get("image"):
            c["image"] = "jenkins/inbound-agent:latest"
    return pod


# --------------------------------------------------------------------------- Tekton
# tektoncd/pipeline pkg/reconciler/taskrun/validate_taskrun.go validateStepOverrides /
# validateSidecarOverrides: "invalid StepOverride: No Step named X" fails the TaskRun; v1
# (pkg/apis/pipeline/v1/taskrun_types.go) TaskRunStepSpec/TaskRunSidecarSpec {name, computeResources};
# v1beta1 TaskRunStepOverride/TaskRunSidecarOverride {name, resources}; the pod names a step's
# container "step-<name>" and a sidecar's "sidecar-<name>" (pkg/pod).


def tekton_apply(steps: tuple[str, ...], sidecars: tuple[str, ...], spec: dict[str, Any], *, v1: bool) -> Pod:
    step_key, sidecar_key, field = (
        ("stepSpecs", "sidecarSpecs", "computeResources") if v1 else ("stepOverrides", "sidecarOverrides", "resources")
    )
    known = {step_key, sidecar_key}
    if set(spec) - known:
        raise Rejected(f"unknown TaskRun spec fields {sorted(set(spec) - known)}")
    pod: Pod = {
        "containers": [container(f"step-{s}", "golang:1.23") for s in steps]
        + [container(f"sidecar-{s}", f"{s}:latest") for s in sidecars]
    }
    for key, names, prefix in ((step_key, steps, "step-"), (sidecar_key, sidecars, "sidecar-")):
        for entry in spec.get(key) or []:
            if entry["name"] not in names:
                kind = "Step" if prefix == "step-" else "Sidecar"
                raise Rejected(f"invalid {kind}Override: No {kind} named {entry['name']}")
            if set(entry) != {"name", field}:
                raise Rejected(f"{key}: unknown fields {sorted(set(entry) - {'name', field})}")
            pod = strategic_merge_containers(
                pod, {"containers": [{"name": prefix + entry["name"], "resources": entry[field]}]}
            )
    return pod


# --------------------------------------------------------------------------- GitLab
# gitlab-runner executors/kubernetes/kubernetes.go: containers "build", "helper", and per service its
# alias (a DNS-1123 label) or "svc-N"; executors/kubernetes/overwrites.go: a KUBERNETES_* variable
# applies only when config.toml sets the matching *_overwrite_max_allowed (else it is ignored,
# evaluateMaxResourceOverwrite), and fails the job when above it; an unwritten field keeps the
# config.toml value (cpu_limit, ...), so a CPU request written above the runner's cpu_limit makes a
# pod the API server rejects.

GITLAB_CONFIG = {
    "cpu_limit": "4",
    "memory_limit": "8Gi",
    "cpu_request": "500m",
    "memory_request": "1Gi",
    "helper_cpu_limit": "500m",
    "helper_memory_limit": "256Mi",
    "service_cpu_limit": "2",
    "service_memory_limit": "2Gi",
}
_GITLAB_FIELDS = {
    "": "",
    "HELPER_": "helper_",
    "SERVICE_": "service_",
}


def gitlab_apply(variables: dict[str, Any], config: dict[str, str], services: tuple[str, ...] = ()) -> Pod:
    for k, v in variables.items():
        if not isinstance(v, str):
            raise Rejected(f"variable {k} is not a string")
    containers = {"build": "", "helper": "HELPER_", **dict.fromkeys(services, "SERVICE_")}
    pod: Pod = {"containers": []}
    for name, prefix in containers.items():
        cfg = _GITLAB_FIELDS[prefix]
        res: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
        for kind, suffix in (("requests", "request"), ("limits", "limit")):
            for resource in ("cpu", "memory"):
                value = config.get(f"{cfg}{resource}_{suffix}")
                var = variables.get(f"KUBERNETES_{prefix}{resource.upper()}_{suffix.upper()}")
                allowed = config.get(f"{cfg}{resource}_{suffix}_overwrite_max_allowed")
                if var is not None and allowed:
                    if parse_quantity(var) > parse_quantity(allowed):
                        raise Rejected(f"the resource {var!r} is higher than limit allowed {allowed!r}")
                    value = var
                if value:
                    res[kind][resource] = value
        pod["containers"].append(
            container(name, "alpine" if name != "helper" else "gitlab-runner-helper", resources=res)
        )
    return pod
