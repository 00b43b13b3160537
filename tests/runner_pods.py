"""Fixture pods of each runner, and each runner's own way of merging what a recipe hands it.

Where the runner's own code can run here it does: Kubernetes' strategic merge through ``kubectl patch
--local`` (Argo's ``ApplyPodSpecPatch``, agent-stack-k8s' ``PatchPodSpec`` and Tekton's
``MergeStepsWithSpecs`` all call ``strategicpatch``), and Go's own ``encoding/json`` for
agent-stack-k8s' ``ParseJob`` loop (tests/runners_go/parsejob, built with ``go``). Elsewhere a small
model shaped from the cited source stands in (Jenkins' ``PodTemplateUtils.combine``, GitLab's
overwrites, runner-container-hooks' template merge); runner-container-hooks' own compiled hook runs
when it has been built (``CI_SIZER_RUNNER_HOOKS``, see tests/tools/build-runner-hooks.sh). Container
names, layouts and merge rules come from each runner's source, cited per runner. Without ``kubectl``
the strategic merge is this module's model of it, which tests/sizing/test_runner_merges.py checks
against ``kubectl`` where both run.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from kubernetes.utils import parse_quantity

Pod = dict[str, Any]  # a PodSpec: containers, initContainers, ...
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# CI_SIZER_TEST_WITHOUT_KUBECTL=1 runs the merges on the model, as on a machine without kubectl
KUBECTL = None if os.environ.get("CI_SIZER_TEST_WITHOUT_KUBECTL") else shutil.which("kubectl")
GO = shutil.which("go")
JQ = shutil.which("jq")
HERE = Path(__file__).resolve().parent


class Rejected(Exception):
    """What the runner (or the API server behind it) refuses."""


def container(name: str, image: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, **extra}


def cpu_limit_of(pod: Pod, name: str) -> str | None:
    c = next(c for c in pod["containers"] if c["name"] == name)
    return ((c.get("resources") or {}).get("limits") or {}).get("cpu")


def check_pod(pod: Pod) -> None:
    """What the API server checks of the containers (k8s.io/kubernetes pkg/apis/core/validation:
    validateContainers, ValidateResourceRequirements): DNS-1123 names unique across the pod's
    containers and init containers, an image on each, quantities that parse (the Kubernetes client's
    parser as the oracle), and each request at most its limit."""
    seen: set[str] = set()
    for c in [*(pod.get("initContainers") or []), *pod["containers"]]:
        if not DNS_LABEL.fullmatch(c["name"]):
            raise Rejected(f"container name {c['name']!r} is not a DNS-1123 label")
        if c["name"] in seen:
            raise Rejected(f"spec.containers[{c['name']}].name: Duplicate value: {c['name']!r}")
        seen.add(c["name"])
        if not c.get("image"):
            raise Rejected(f"spec.containers[{c['name']}].image: Required value")
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            for q in (res.get(kind) or {}).values():
                parse_quantity(q)  # raises ValueError for an invalid quantity
        for resource, request in (res.get("requests") or {}).items():
            limit = (res.get("limits") or {}).get(resource)
            if limit is not None and parse_quantity(request) > parse_quantity(limit):
                raise Rejected(f"{c['name']}: {resource} request {request} must be less than or equal to {limit}")


# --------------------------------------------------------------------------- the strategic merge
# k8s.io/apimachinery pkg/util/strategicpatch with the PodSpec's patch metadata (k8s.io/api core/v1
# types.go: containers, initContainers and volumes merge by name, env by name, volumeMounts by
# mountPath; maps merge key by key; a null deletes).

_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
}


def strategic_merge(spec: Pod, patch: dict[str, Any]) -> Pod:
    """``spec`` with ``patch`` applied as a strategic merge patch of a PodSpec: Kubernetes' own
    (``kubectl patch --local``) where kubectl is installed, else ``strategic_merge_model``. The same
    merge asked again (the matrix asks many twice) is answered from the first."""
    if KUBECTL is None:
        return strategic_merge_model(spec, patch)
    return copy.deepcopy(_kubectl_merge_text(json.dumps(spec, sort_keys=True), json.dumps(patch, sort_keys=True)))


@cache
def _kubectl_merge_text(spec: str, patch: str) -> Pod:
    return kubectl_merge(json.loads(spec), json.loads(patch))


def kubectl_merge(spec: Pod, patch: dict[str, Any]) -> Pod:
    assert KUBECTL is not None
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fixture"}, "spec": spec}, f)
        f.flush()
        command = [KUBECTL, "patch", "--local", "-f", f.name, "--type", "strategic", "-o", "json"]
        p = subprocess.run(
            [*command, "-p", json.dumps({"spec": patch})], capture_output=True, text=True, timeout=60, check=False
        )
    if p.returncode != 0:
        raise Rejected(f"strategic merge: {p.stderr.strip()}")
    merged: Pod = json.loads(p.stdout)["spec"]
    return merged


def strategic_merge_model(original: Any, patch: Any, key: str = "") -> Any:
    """This module's model of the strategic merge, for a machine without kubectl."""
    if not isinstance(patch, dict) or not isinstance(original, dict):
        if isinstance(patch, list) and key in _MERGE_KEYS and isinstance(original, list):
            return _merge_list(original, patch, _MERGE_KEYS[key])
        return copy.deepcopy(patch)
    out = copy.deepcopy(original)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif k in out:
            out[k] = strategic_merge_model(out[k], v, k)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _merge_list(original: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    """A list merged by ``merge_key``: each patch entry merged into the original entry of its key (one
    key given twice is merged in turn), then ordered as strategicpatch's normalizeElementOrder and
    mergeSortedSlice order them: the patch's entries in patch order, the original's other entries in
    their order, an original entry going first only ahead of a patch entry the original has after it
    (so an entry new to the list comes before the original's others)."""
    by_key = {o.get(merge_key): o for o in original}
    merged: dict[Any, Any] = {}
    for entry in patch:
        key = entry.get(merge_key)
        base = merged.get(key, by_key.get(key))
        merged[key] = strategic_merge_model(base, entry) if base is not None else copy.deepcopy(entry)
    server = [o.get(merge_key) for o in original]
    left = [copy.deepcopy(o) for o in original if o.get(merge_key) not in merged]
    right = list(merged.values())
    out: list[Any] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if j >= len(right):
            out.append(left[i])
            i += 1
            continue
        if i < len(left):
            lk, rk = left[i].get(merge_key), right[j].get(merge_key)
            if lk in server and rk in server and server.index(lk) < server.index(rk):
                out.append(left[i])
                i += 1
                continue
        out.append(right[j])
        j += 1
    return out


# --------------------------------------------------------------------------- Argo Workflows
# argo-workflows (v3.7.18 and main) workflow/common/common.go: MainContainerName = "main",
# WaitContainerName = "wait"; workflow/controller/workflowpod.go builds the pod from the template's
# container (its resources as given) and processPodSpecPatch takes the workflow's spec.podSpecPatch
# first, then the template's podSpecPatch; workflow/util/util.go ApplyPodSpecPatch converts each
# (YAML or JSON) to JSON, checks it unmarshals into a PodSpec, and applies them in that order with
# strategicpatch.StrategicMergePatch(podSpecJSON, patch, apiv1.PodSpec{}).


def argo_pod(resources: dict[str, Any] | None = None) -> Pod:
    main = container("main", "golang:1.23")
    if resources:
        main["resources"] = copy.deepcopy(resources)
    return {
        "initContainers": [container("init", "quay.io/argoproj/argoexec:v3.7.18")],
        "containers": [container("wait", "quay.io/argoproj/argoexec:v3.7.18"), main],
    }


def argo_apply(pod: Pod, *patches: str) -> Pod:
    """ApplyPodSpecPatch(pod.Spec, workflow's patch, template's patch)."""
    for text in patches:
        stripped = text.strip()
        try:
            patch = json.loads(stripped) if stripped.startswith("{") else yaml.safe_load(stripped)
        except (ValueError, yaml.YAMLError) as exc:
            raise Rejected(f"Failed to convert the PodSpecPatch yaml to json: {exc}") from None
        if not isinstance(patch, dict):
            raise Rejected(f"invalid podSpecPatch {text!r}: not a PodSpec")
        pod = strategic_merge(pod, patch)
    return pod


# --------------------------------------------------------------------------- GitHub ARC
# actions/runner-container-hooks packages/k8s at v0.7.0 (the version actions/runner's images/Dockerfile
# pins, RUNNER_CONTAINER_HOOKS_VERSION=0.7.0) and v0.8.1:
# - src/hooks/constants.ts: JOB_CONTAINER_NAME = "job", CONTAINER_EXTENSION_PREFIX = "$";
# - src/k8s/utils.ts readExtensionFromFile: no ACTIONS_RUNNER_CONTAINER_HOOK_TEMPLATE, no template;
#   else fs.readFileSync (a missing file throws) and js-yaml's load, "Failed to parse <file>" unless an
#   object;
# - src/hooks/prepare-job.ts: the job container, then each service named generateContainerName(image)
#   (utils.ts: the last path segment without its tag; two services of one image get the same name in
#   both releases: the "-0"/"-1" suffixes are only on main after v0.8.1, commit af73fee, #308), each
#   merged with the template's "$<name>" entry (createContainerSpec -> mergeContainerWithOptions:
#   name and image are never overwritten, env/volumeMounts/ports appended, every other field, resources
#   included, replaced whole);
# - src/k8s/index.ts createPod (v0.7.0) / createJobPod (v0.8.1): mergePodSpecWithOptions appends every
#   template container whose name does not start with "$", merges volumes, replaces other fields.
# The API server then rejects duplicate container names.

ARC_VERSIONS = ("v0.7.0", "v0.8.1", "main")


def arc_service_names(images: tuple[str, ...], version: str = "v0.7.0") -> list[str]:
    names = []
    for image in images:
        name = image.split("/")[-1].split(":")[0]
        if not name:
            raise Rejected(f"Image definition '{image}' is invalid")
        names.append(name)
    if version == "main":  # af73fee: "-N" suffixes when two services share a name
        counts = {n: names.count(n) for n in names}
        seen: dict[str, int] = {}
        for i, n in enumerate(names):
            if counts[n] > 1:
                names[i] = f"{n}-{seen.get(n, 0)}"
                seen[n] = seen.get(n, 0) + 1
    return names


def arc_read_template(path: str | None) -> dict[str, Any] | None:
    """readExtensionFromFile: what the hooks make of ACTIONS_RUNNER_CONTAINER_HOOK_TEMPLATE."""
    if not path:
        return None
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise Rejected(f"ENOENT: no such file or directory, open '{path}' ({exc.strerror})") from None
    doc = yaml.safe_load(text)
    if not isinstance(doc, (dict, list)):  # JavaScript's `!doc || typeof doc !== 'object'` ({} passes)
        raise Rejected(f"Failed to parse {path}")
    return doc if isinstance(doc, dict) else {}


def arc_pod(template: dict[str, Any] | None, services: tuple[str, ...] = (), version: str = "v0.7.0") -> Pod:
    """The job pod the hooks create for a job container (node:20) and ``services``, with ``template``."""
    names = ["job", *arc_service_names(services, version)]
    images = ["node:20", *services]
    spec = (template or {}).get("spec") or {}
    entries = spec.get("containers") or []
    containers = []
    for name, image in zip(names, images, strict=True):
        c = container(name, image, env=[{"name": "GITHUB_ACTIONS", "value": "true"}])
        entry = next((e for e in entries if e.get("name") == "$" + name), None)  # Array.find: the first
        for field, value in (entry or {}).items():
            if field in ("name", "image"):
                continue
            if field in ("env", "volumeMounts", "ports"):
                c[field] = [*(c.get(field) or []), *copy.deepcopy(value)]
            else:
                c[field] = copy.deepcopy(value)
        containers.append(c)
    pod: Pod = {"containers": containers, "restartPolicy": "Never"}
    for field, value in spec.items():
        if field == "containers":
            pod["containers"] += [copy.deepcopy(e) for e in value if not str(e.get("name", "")).startswith("$")]
        elif field == "volumes":
            pod["volumes"] = [*(pod.get("volumes") or []), *copy.deepcopy(value)]
        else:
            pod[field] = copy.deepcopy(value)
    return pod


# --------------------------------------------------------------------------- Buildkite
# buildkite/agent-stack-k8s v0.47.0 internal/controller/scheduler/scheduler.go:
# - ParseJob: BUILDKITE_PLUGINS (a JSON list of one-key objects, the kubernetes plugin's key being
#   "github.com/buildkite-plugins/kubernetes-buildkite-plugin", as scheduler_test.go builds it) is
#   walked in order, and every kubernetes entry is decoded with json.Unmarshal into the same
#   KubernetesPlugin; with ProhibitK8sPlugin any kubernetes entry fails the job
#   (errK8sPluginProhibited), an empty one included;
# - Build: containers "checkout", the command containers ("container-0" for a step without a podSpec,
#   DefaultCommandContainerName, image cfg.Image) and "agent"; the controller's own PodSpecPatch is
#   applied first, then the plugin's (PatchPodSpec: a nil containers list becomes [], then
#   strategicpatch.StrategicMergePatch(original, patch, corev1.PodSpec{})).

K8S_PLUGIN = "github.com/buildkite-plugins/kubernetes-buildkite-plugin"


def buildkite_pod(controller_patch: dict[str, Any] | None = None) -> Pod:
    pod: Pod = {
        "containers": [
            container("checkout", "buildkite/agent:3"),
            container("container-0", "buildkite/agent:3"),
            container("agent", "buildkite/agent:3"),
        ]
    }
    if controller_patch is not None:
        pod = buildkite_patch(pod, controller_patch)
    return pod


def buildkite_plugins(step: dict[str, Any]) -> str:
    """BUILDKITE_PLUGINS of the job of an uploaded ``step``: its ``plugins`` in order, each one key,
    ``kubernetes`` under its full name."""
    plugins = []
    for entry in step.get("plugins") or []:
        if not isinstance(entry, dict) or len(entry) != 1:
            raise Rejected(f"found invalid plugin: {entry!r}")
        [(name, config)] = entry.items()
        plugins.append({K8S_PLUGIN if name == "kubernetes" else name: config})
    return json.dumps(plugins) if plugins else ""


@cache
def _parsejob() -> str:
    """tests/runners_go/parsejob built once per process, into a directory removed at exit."""
    assert GO is not None
    out = Path(tempfile.mkdtemp(prefix="ci-sizer-parsejob-"))
    atexit.register(shutil.rmtree, out, True)
    binary = out / "parsejob"
    env = {**os.environ, "GO111MODULE": "off", "GOCACHE": str(out / "cache"), "GOPATH": str(out / "gopath")}
    source = HERE / "runners_go" / "parsejob" / "main.go"
    subprocess.run([GO, "build", "-o", str(binary), str(source)], env=env, check=True, capture_output=True, timeout=300)
    return str(binary)


def buildkite_parse_job(plugins_json: str, *, prohibit: bool = False) -> dict[str, Any] | None:
    """The KubernetesPlugin that ParseJob decodes (Go's encoding/json, tests/runners_go/parsejob)."""
    if not plugins_json:
        return None
    p = subprocess.run(
        [_parsejob(), *(["-prohibit"] if prohibit else [])],
        input=plugins_json,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if p.returncode == 3:
        raise Rejected(p.stderr.strip())
    if p.returncode != 0:
        raise AssertionError(p.stderr)
    plugin: dict[str, Any] | None = json.loads(p.stdout)["k8sPlugin"]
    return plugin


def buildkite_patch(pod: Pod, patch: dict[str, Any]) -> Pod:
    """PatchPodSpec: a nil containers list becomes [] (else the merge would drop every container)."""
    patch = copy.deepcopy(patch)
    if patch.get("containers") is None:
        patch["containers"] = []
    return strategic_merge(pod, patch)


def buildkite_apply(pod: Pod, plugin: dict[str, Any] | None) -> Pod:
    if plugin is None or plugin.get("podSpecPatch") is None:
        return pod
    return buildkite_patch(pod, plugin["podSpecPatch"])


# --------------------------------------------------------------------------- Jenkins
# jenkinsci/kubernetes-plugin (4423.vb_59f230b_ce53) PodTemplateBuilder.build: the pod is
# PodTemplateUtils.combine(template.getYamlsPod(), the pod of the containerTemplates): the yaml pod is
# the parent, the containerTemplates the child. combine(Container parent, Container template): the
# child's image unless empty, resources by combineResources (requests and limits key by key, the
# child's value winning: "v2 (parent) loses"), env combined. A nested podTemplate inherits its parent's
# (PodTemplateStepExecution: inheritFrom the enclosing PodTemplateContext; combine(PodTemplate...)
# concatenates the parent's yamls, then the child's, merged in that order by yamlMergeStrategy merge()
# (pod/yaml/Merge.java), and combines containerTemplates by name. Then the agent container
# (KubernetesCloud.JNLP_NAME "jnlp") is added if absent, with the default agent image if it has none
# and default resources if it has none. A containerTemplate's empty resource fields set nothing
# (getResourcesMap skips blanks).


def jenkins_template(name: str, image: str, **resources: str) -> dict[str, Any]:
    """The container a containerTemplate makes (createContainer): ``resourceLimitCpu='1'`` etc."""
    fields = {
        "requests": {"cpu": "resourceRequestCpu", "memory": "resourceRequestMemory"},
        "limits": {"cpu": "resourceLimitCpu", "memory": "resourceLimitMemory"},
    }
    res = {
        kind: {r: resources[f] for r, f in names.items() if resources.get(f, "").strip()}
        for kind, names in fields.items()
    }
    return container(name, image, resources=res)


def _jenkins_combine_container(parent: dict[str, Any] | None, child: dict[str, Any]) -> dict[str, Any]:
    if parent is None:
        return copy.deepcopy(child)
    out = copy.deepcopy(parent)
    out["name"] = child["name"]
    out["image"] = child.get("image") or parent.get("image")
    res: dict[str, dict[str, str]] = {}
    for kind in ("requests", "limits"):
        merged = dict(((parent.get("resources") or {}).get(kind)) or {})
        merged.update(((child.get("resources") or {}).get(kind)) or {})  # the child wins, key by key
        res[kind] = merged
    out["resources"] = res
    env = {e["name"]: e for e in (parent.get("env") or [])}
    env.update({e["name"]: e for e in (child.get("env") or [])})
    if env:
        out["env"] = list(env.values())
    return out


def jenkins_combine(parent: Pod, child: Pod) -> Pod:
    """PodTemplateUtils.combine(Pod parent, Pod template), for the fields the tests use."""
    out = copy.deepcopy(parent)
    by_name = {c["name"]: c for c in parent.get("containers") or []}
    combined = {c["name"]: c for c in copy.deepcopy(parent.get("containers") or [])}
    for c in child.get("containers") or []:
        combined[c["name"]] = _jenkins_combine_container(by_name.get(c["name"]), c)
    out["containers"] = list(combined.values())
    selector = {**(parent.get("nodeSelector") or {}), **(child.get("nodeSelector") or {})}
    if selector:
        out["nodeSelector"] = selector
    return out


def jenkins_apply(templates: list[dict[str, Any]], yamls: list[str]) -> Pod:
    pods = []
    for text in yamls:
        if not text.strip():
            continue
        doc = yaml.safe_load(text)
        if doc is not None and not isinstance(doc, dict):
            raise Rejected("the podTemplate's yaml is not a Pod")
        pods.append(((doc or {}).get("spec")) or {})
    yamls_pod: Pod = {"containers": []}
    for p in pods:  # Merge.merge: combine(List<Pod>) in order
        yamls_pod = jenkins_combine(yamls_pod, p)
    pod = jenkins_combine(yamls_pod, {"containers": templates})
    jnlp = next((c for c in pod["containers"] if c["name"] == "jnlp"), None)
    if jnlp is None:
        jnlp = container("jnlp", "")
        pod["containers"].append(jnlp)
    if not jnlp.get("image"):
        jnlp["image"] = "jenkins/inbound-agent:latest"
    if not jnlp.get("resources"):
        jnlp["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {}}
    return pod


# --------------------------------------------------------------------------- Tekton
# tektoncd/pipeline (v1.15) pkg/reconciler/taskrun/validate_taskrun.go validateOverrideNames: "invalid
# StepOverride: No Step named X" fails the TaskRun; pkg/apis/pipeline/v1/taskrun_validation.go rejects
# a name given twice; v1 TaskRunStepSpec/TaskRunSidecarSpec {name, computeResources}, v1beta1
# TaskRunStepOverride/TaskRunSidecarOverride {name, resources}; pkg/pod/pod.go builds the step's
# container "step-<name>" (a sidecar's "sidecar-<name>") with the Task's computeResources, then
# pkg/apis/pipeline/v1/merge.go MergeStepsWithSpecs / MergeSidecarsWithSpecs merge each spec's
# resources onto the step's (mergeObjWithTemplate: a strategic merge with the ResourceRequirements'
# patch metadata, so requests and limits merge key by key: the Task's limits.cpu stays).

TEKTON_SPEC_FIELDS = {"taskRef", "podTemplate", "serviceAccountName", "params", "timeout", "workspaces"}


def tekton_apply(task: dict[str, Any], spec: dict[str, Any], *, v1: bool) -> Pod:
    step_key, sidecar_key, field = (
        ("stepSpecs", "sidecarSpecs", "computeResources") if v1 else ("stepOverrides", "sidecarOverrides", "resources")
    )
    unknown = set(spec) - {step_key, sidecar_key} - TEKTON_SPEC_FIELDS
    if unknown:
        raise Rejected(f"unknown TaskRun spec fields {sorted(unknown)}")
    steps = {s["name"]: s for s in task.get("steps") or []}
    sidecars = {s["name"]: s for s in task.get("sidecars") or []}
    pod: Pod = {
        "containers": [
            container(f"step-{n}", s["image"], resources=copy.deepcopy(s.get(field) or s.get("computeResources") or {}))
            for n, s in steps.items()
        ]
        + [
            container(f"sidecar-{n}", s["image"], resources=copy.deepcopy(s.get("computeResources") or {}))
            for n, s in sidecars.items()
        ]
    }
    template = spec.get("podTemplate") or {}
    if template.get("nodeSelector"):
        pod["nodeSelector"] = dict(template["nodeSelector"])
    for key, names, prefix in ((step_key, steps, "step-"), (sidecar_key, sidecars, "sidecar-")):
        entries = spec.get(key) or []
        given = [e["name"] for e in entries]
        if len(given) != len(set(given)):
            raise Rejected(f"{key}: a name given twice")
        for entry in entries:
            if entry["name"] not in names:
                kind = "Step" if prefix == "step-" else "Sidecar"
                raise Rejected(f"invalid {kind}Override: No {kind} named {entry['name']}")
            if set(entry) != {"name", field}:
                raise Rejected(f"{key}: unknown fields {sorted(set(entry) - {'name', field})}")
        patch = [{"name": prefix + e["name"], "resources": e[field]} for e in entries]
        if patch:
            pod = strategic_merge(pod, {"containers": patch})
    return pod


# --------------------------------------------------------------------------- GitLab
# gitlab-runner executors/kubernetes/kubernetes.go: containers "build", "helper", and per service its
# alias (a DNS-1123 label) or "svc-N"; executors/kubernetes/overwrites.go: a KUBERNETES_* variable
# applies only when config.toml sets the matching *_overwrite_max_allowed (else it is ignored,
# evaluateMaxResourceOverwrite), and fails the job when above it; an unwritten field keeps the
# config.toml value (cpu_limit, ...). The job's variables are the pipeline's global ones overridden by
# the job's own (a job-level KUBERNETES_CPU_LIMIT wins over the sizing's global variables).

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
_GITLAB_FIELDS = {"": "", "HELPER_": "helper_", "SERVICE_": "service_"}


def gitlab_apply(
    variables: dict[str, Any],
    config: dict[str, str],
    services: tuple[str, ...] = (),
    job_variables: dict[str, str] | None = None,
) -> Pod:
    for k, v in variables.items():
        if not isinstance(v, str):
            raise Rejected(f"variable {k} is not a string")
    variables = {**variables, **(job_variables or {})}  # the job's own win over the global ones
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
