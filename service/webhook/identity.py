"""Whose job a pod runs: the identity (org, repo, workflow, job) read from what each runner puts on the
pods it creates, and the runner's main container.

Per field, the first of:

1. the pod's annotation ``ci-sizer.io/<field>`` (any runner; a pipeline that knows better says so);
2. the first operator rule (``--identity-file``) whose ``match`` holds, else the first built-in runner
   rule whose marker the pod carries. A pod that a rule matches but that lacks a field is an unknown
   identity (it is not handed on to the next rule).

The built-in rules, each from the runner's own source (the versions read are in docs/integrations/webhook.md):

- GitHub ARC (actions/runner-container-hooks ``packages/k8s/src/k8s/index.ts`` createJobPod: the label
  ``runner-pod``; ``src/hooks/prepare-job.ts`` createContainerSpec: the container ``job`` whose env is
  the workflow's ``container.env`` plus ``GITHUB_ACTIONS``/``CI``). The runner does not put
  ``GITHUB_REPOSITORY``, ``GITHUB_WORKFLOW_REF`` or ``GITHUB_JOB`` there (actions/runner
  ``src/Runner.Worker/Container/ContainerInfo.cs``: the job container's environment is the workflow's);
  when the workflow's ``container.env`` passes them, the collector's own rule reads them.
- GitLab (gitlab-runner ``executors/kubernetes/kubernetes.go``: buildLabels' ``project.runner.gitlab.com/id``;
  buildContainer gives the ``build`` container every public CI variable): the collector's rule on
  the ``build`` container's env (``CI_PROJECT_NAMESPACE``, ``CI_PROJECT_NAME``, ``CI_CONFIG_PATH``,
  ``CI_JOB_NAME``).
- Buildkite (agent-stack-k8s ``internal/controller/scheduler/scheduler.go`` Build, names in
  ``internal/controller/config/config.go``: the label ``buildkite.com/job-uuid``, the annotations
  ``buildkite.com/build-url``, ``buildkite.com/pipeline-slug``, ``buildkite.com/step-key``): the
  collector's rule on those values (the org is the build URL's first path segment).
- Jenkins (kubernetes-plugin ``PodTemplate.java`` JENKINS_LABEL, ``pipeline/PodTemplateStepExecution.java``:
  the annotation ``runUrl``, ``job/<folder>/job/<name>/<n>/``): the collector's rule on the job's full
  name; no stage is known when the pod is made, so the job is the name's last part.
- Tekton (pipeline ``pkg/pod/pod.go`` makeLabels: the TaskRun's labels plus ``tekton.dev/taskRun``;
  ``pkg/reconciler/pipelinerun/pipelinerun.go`` createChildResourceLabels and ``pkg/reconciler/taskrun/taskrun.go``:
  ``tekton.dev/pipeline``, ``tekton.dev/pipelineTask``, ``tekton.dev/task``): org the namespace, repo the
  Pipeline (a lone TaskRun: the Task), workflow ``tekton``, job the pipeline task (else the Task).
- Argo (argo-workflows ``workflow/controller/workflowpod.go``: the label ``workflows.argoproj.io/workflow``,
  the annotation ``workflows.argoproj.io/node-name``): org the namespace, workflow ``argo``, job the node's
  last step; the repository is nowhere on the pod, so it comes from ``ci-sizer.io/repo`` (the Workflow's
  ``spec.podMetadata``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.collector.payload import identity_from_env
from service.keys import ScopeKey
from service.settings import read_config_file
from service.wire import NAME_MAX, name_problem

FIELDS = ("org", "repo", "workflow", "job")
ANNOTATION_PREFIX = "ci-sizer.io/"
Pod = Mapping[str, Any]


class IdentityFileError(ValueError):
    """The identity file cannot be read or is invalid."""


@dataclass(frozen=True)
class Identified:
    """A pod's job, the rule that found it, and how its containers are named: ``main`` is the runner's
    main container (sized from the job's main recorded container); ``recorded(pod_name)`` is the
    recorded container a pod container of that name is sized from."""

    key: ScopeKey
    rule: str
    main: str
    strip_prefixes: tuple[str, ...] = ()

    def recorded(self, pod_container: str) -> str:
        for prefix in self.strip_prefixes:
            if pod_container.startswith(prefix):
                return pod_container[len(prefix) :]
        return pod_container


# --------------------------------------------------------------------------- reading a pod


def pod_labels(pod: Pod) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def pod_annotations(pod: Pod) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def container_env(pod: Pod, name: str) -> dict[str, str]:
    """The plain ``value`` env of the container ``name`` (``valueFrom`` is resolved by the kubelet, later)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == name:
            return {
                e["name"]: e["value"] for e in c.get("env") or [] if "name" in e and isinstance(e.get("value"), str)
            }
    return {}


def first_container(pod: Pod) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    return str(containers[0].get("name", "")) if containers else ""


# --------------------------------------------------------------------------- the built-in runners


@dataclass(frozen=True)
class Runner:
    name: str
    main: str
    marks: Callable[[Pod], bool]
    fields: Callable[[Pod, str], dict[str, str]]
    strip_prefixes: tuple[str, ...] = ()


def _env_identity(env: Mapping[str, str]) -> dict[str, str]:
    found = identity_from_env(env)  # the collector's rule: the identity its runs are recorded under
    return {f: found.get(f, "") for f in FIELDS}


def _buildkite(pod: Pod, namespace: str) -> dict[str, str]:
    a = pod_annotations(pod)
    path = [p for p in urlsplit(a.get("buildkite.com/build-url", "")).path.split("/") if p]
    return _env_identity(
        {
            "BUILDKITE": "true",
            "BUILDKITE_ORGANIZATION_SLUG": path[0] if path else "",
            "BUILDKITE_PIPELINE_SLUG": a.get("buildkite.com/pipeline-slug", ""),
            "BUILDKITE_STEP_KEY": a.get("buildkite.com/step-key", ""),
        }
    )


def jenkins_job_name(run_url: str) -> str:
    """``job/acme/job/web/job/main/42/`` -> ``acme/web/main`` (Jenkins' full name of the job, as
    ``JOB_NAME`` holds it; each name is percent-encoded in the URL)."""
    parts = [p for p in run_url.split("/") if p]
    return "/".join(unquote(parts[i + 1]) for i in range(len(parts) - 1) if parts[i] == "job")


def _jenkins(pod: Pod, namespace: str) -> dict[str, str]:
    job_name = jenkins_job_name(pod_annotations(pod).get("runUrl", ""))
    return _env_identity({"JENKINS_URL": "-", "JOB_NAME": job_name}) if job_name else {}


def _tekton(pod: Pod, namespace: str) -> dict[str, str]:
    lb = pod_labels(pod)
    task = lb.get("tekton.dev/task", "")
    return {
        "org": namespace,
        "repo": lb.get("tekton.dev/pipeline") or task,
        "workflow": "tekton",
        "job": lb.get("tekton.dev/pipelineTask") or task,
    }


_ARGO_SUFFIX = re.compile(r"\([^()]*\)$")  # a retry's "(0)" or a loop item's "(0:linux)"


def argo_step(node_name: str) -> str:
    """The last step of an Argo node name: ``ci-x7k2p[0].build(1)`` -> ``build``."""
    name = node_name
    while _ARGO_SUFFIX.search(name):
        name = _ARGO_SUFFIX.sub("", name)
    return name.rsplit(".", 1)[-1] if "." in name else ""


def _argo(pod: Pod, namespace: str) -> dict[str, str]:
    return {
        "org": namespace,
        "workflow": "argo",
        "job": argo_step(pod_annotations(pod).get("workflows.argoproj.io/node-name", "")),
    }


def _has_container(pod: Pod, name: str) -> bool:
    return any(c.get("name") == name for c in (pod.get("spec") or {}).get("containers") or [])


RUNNERS: tuple[Runner, ...] = (
    Runner(
        "gitlab",
        "build",
        lambda p: "project.runner.gitlab.com/id" in pod_labels(p),
        lambda p, ns: _env_identity(container_env(p, "build")),
    ),
    Runner(
        "arc",
        "job",
        lambda p: "runner-pod" in pod_labels(p) and _has_container(p, "job"),
        lambda p, ns: _env_identity(container_env(p, "job")),
    ),
    Runner("buildkite", "container-0", lambda p: "buildkite.com/job-uuid" in pod_labels(p), _buildkite),
    Runner("jenkins", "jnlp", lambda p: "jenkins/label" in pod_labels(p) and "runUrl" in pod_annotations(p), _jenkins),
    Runner("tekton", "step-build", lambda p: "tekton.dev/taskRun" in pod_labels(p), _tekton, ("step-", "sidecar-")),
    Runner("argo", "main", lambda p: "workflows.argoproj.io/workflow" in pod_labels(p), _argo),
)


# --------------------------------------------------------------------------- the operator's rules


class Source(BaseModel):
    """Where one field comes from: exactly one of a label, an annotation, an env var of the main
    container, the pod's namespace, or a fixed value."""

    model_config = ConfigDict(extra="forbid")
    label: str | None = None
    annotation: str | None = None
    env: str | None = None
    namespace: Literal[True] | None = None
    value: str | None = Field(default=None, min_length=1, max_length=NAME_MAX)

    @model_validator(mode="after")
    def _one(self) -> Source:
        given = [k for k in ("label", "annotation", "env", "namespace", "value") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of label, annotation, env, namespace, value")
        return self

    def read(self, pod: Pod, namespace: str, main: str) -> str:
        if self.label is not None:
            return pod_labels(pod).get(self.label, "")
        if self.annotation is not None:
            return pod_annotations(pod).get(self.annotation, "")
        if self.env is not None:
            return container_env(pod, main).get(self.env, "")
        if self.namespace:
            return namespace
        return self.value or ""


class Match(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: dict[str, str] = Field(default_factory=dict, description='label values; "*" for any value')
    annotations: dict[str, str] = Field(default_factory=dict, description='annotation values; "*" for any')
    namespaces: list[str] | None = None

    def holds(self, pod: Pod, namespace: str) -> bool:
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        for wanted, have in ((self.labels, pod_labels(pod)), (self.annotations, pod_annotations(pod))):
            for key, value in wanted.items():
                if key not in have or (value != "*" and have[key] != value):
                    return False
        return True


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=63)
    match: Match
    main: str | None = Field(default=None, description="the runner's main container (default: the pod's first)")
    org: Source
    repo: Source
    workflow: Source
    job: Source

    @model_validator(mode="after")
    def _matches_something(self) -> Rule:
        m = self.match
        if not (m.labels or m.annotations or m.namespaces):
            raise ValueError("match needs labels, annotations or namespaces (a rule for every pod is a mistake)")
        return self


class IdentityFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    identities: list[Rule] = Field(default_factory=list)


def load_rules(path: Path | None) -> tuple[Rule, ...]:
    if path is None:
        return ()
    parsed = read_config_file(path, IdentityFile, "identity", IdentityFileError)
    names = [r.name for r in parsed.identities]
    for name in names:
        if names.count(name) > 1:
            raise IdentityFileError(f"identity file {path} names the rule {name!r} twice")
    return tuple(parsed.identities)


# --------------------------------------------------------------------------- the rule


def _valid(value: str) -> bool:
    return 0 < len(value) <= NAME_MAX and name_problem(value) is None


def identify(pod: Pod, namespace: str, rules: Sequence[Rule] = ()) -> Identified | None:
    """The pod's job identity, or None when it cannot be told (an unknown identity: no patch)."""
    given = pod_annotations(pod)
    explicit = {f: given.get(ANNOTATION_PREFIX + f, "") for f in FIELDS}
    found: dict[str, str] | None = None
    rule, main = "annotations", given.get(ANNOTATION_PREFIX + "main-container") or first_container(pod)
    strip: tuple[str, ...] = ()
    for r in rules:
        if r.match.holds(pod, namespace):
            rule, main = r.name, r.main or first_container(pod)
            found = {f: getattr(r, f).read(pod, namespace, main) for f in FIELDS}
            break
    else:
        for runner in RUNNERS:
            if runner.marks(pod):
                rule, main, strip = runner.name, runner.main, runner.strip_prefixes
                found = runner.fields(pod, namespace)
                break
    values = {f: explicit[f] or (found or {}).get(f, "") for f in FIELDS}
    if not all(_valid(v) for v in values.values()) or not main:
        return None
    return Identified(ScopeKey(**values), rule, main, strip)
