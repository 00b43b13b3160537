"""The pods each runner really creates, built with the official ``kubernetes`` client's models, and the
AdmissionReview the API server sends for one (k8s.io/apiserver ``pkg/admission/plugin/webhook/request/
admissionreview.go`` CreateV1AdmissionReview; k8s.io/api ``admission/v1/types.go``).

Labels, annotations, container names and env come from each runner's source (the versions read):

- ARC: actions/runner-container-hooks v0.8.1 ``packages/k8s/src/k8s/index.ts`` createJobPod (name
  ``<runner pod>-workflow``, the label ``runner-pod``, no annotation, the init container ``fs-init``,
  ``restartPolicy: Never``, ``fsGroup: 1001``) and ``src/hooks/prepare-job.ts`` createContainerSpec (the
  container ``job``, services named after their image, env: the workflow's ``container.env``, then
  ``GITHUB_ACTIONS`` and ``CI``);
- GitLab: gitlab-runner ``executors/kubernetes/kubernetes.go`` buildLabels (``pod``,
  ``project.runner.gitlab.com/*``, ``job.runner.gitlab.com/pod``, ``manager.runner.gitlab.com/*``),
  buildContainer (``build`` gets every public CI variable; ``helper``; a service ``svc-0``), and the
  init container ``init-permissions``;
- Buildkite: agent-stack-k8s v0.47.0 ``internal/controller/scheduler/scheduler.go`` Build (the label
  ``buildkite.com/job-uuid``, the annotations ``buildkite.com/build-url``, ``build-branch``,
  ``build-repo``, ``pipeline-slug``, ``step-key``, ``job-url``, ``job-priority``; containers ``agent``,
  ``checkout``, ``container-0``; the init container ``copy-agent``);
- Jenkins: kubernetes-plugin ``PodTemplate.java`` (labels ``jenkins/label``, ``jenkins/label-digest``),
  ``pipeline/PodTemplateStepExecution.java`` (annotations ``buildUrl``, ``runUrl``),
  ``PodTemplateBuilder.java`` agentEnvVars (``jnlp``'s ``JENKINS_*``);
- Tekton: pipeline ``pkg/pod/pod.go`` (``step-NAME``, ``sidecar-NAME``, init containers ``prepare`` and
  ``place-scripts``, makeLabels) with the labels the PipelineRun reconciler gives its TaskRuns;
- Argo: argo-workflows v3.7 ``workflow/controller/workflowpod.go`` (the label ``workflows.argoproj.io/workflow``,
  the annotations ``node-name``, ``node-id``, the init container ``init``, containers ``wait`` then
  ``main``), with ``ci-sizer.io/repo`` from the Workflow's ``spec.podMetadata`` (addMetadata).
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

from kubernetes import client

Doc = dict[str, Any]
_API = client.ApiClient()


def to_dict(model: Any) -> Doc:
    out: Doc = _API.sanitize_for_serialization(model)
    return out


def from_dict(doc: Doc, kind: str = "V1Pod") -> Any:
    """``doc`` deserialised into the client's model (what the client does with an API server's JSON)."""
    return _API.deserialize(json.dumps(doc), kind, "application/json")


def res(
    cpu_req: str | None = None,
    mem_req: str | None = None,
    cpu_lim: str | None = None,
    mem_lim: str | None = None,
    extra: dict[str, str] | None = None,
) -> client.V1ResourceRequirements:
    requests = {k: v for k, v in (("cpu", cpu_req), ("memory", mem_req)) if v is not None}
    limits = {k: v for k, v in (("cpu", cpu_lim), ("memory", mem_lim)) if v is not None}
    for name, value in (extra or {}).items():  # e.g. nvidia.com/gpu: in both
        requests[name] = limits[name] = value
    return client.V1ResourceRequirements(requests=requests or None, limits=limits or None)


def env(**values: str) -> list[client.V1EnvVar]:
    return [client.V1EnvVar(name=k, value=v) for k, v in values.items()]


def c(name: str, image: str, resources: client.V1ResourceRequirements | None = None, **kw: Any) -> client.V1Container:
    return client.V1Container(name=name, image=image, resources=resources, **kw)


def pod(
    name: str | None,
    labels: dict[str, str],
    annotations: dict[str, str] | None,
    spec: client.V1PodSpec,
    generate_name: str | None = None,
) -> Doc:
    return to_dict(
        client.V1Pod(
            api_version="v1",
            kind="Pod",
            metadata=client.V1ObjectMeta(
                name=name, generate_name=generate_name, labels=labels, annotations=annotations
            ),
            spec=spec,
        )
    )


# --------------------------------------------------------------------------- each runner's pod

GITHUB_ENV = {  # what a workflow's container.env passes (the runner's own values, by expression)
    "GITHUB_REPOSITORY": "acme/web",
    "GITHUB_WORKFLOW_REF": "acme/web/.github/workflows/ci.yml@refs/heads/main",
    "GITHUB_JOB": "build",
}


def arc(*, identity: bool = True, job_resources: client.V1ResourceRequirements | None = None) -> Doc:
    runner = "arc-runner-set-x7k2p-runner-4f9vq"
    container_env = {**(GITHUB_ENV if identity else {}), "GITHUB_ACTIONS": "true", "CI": "true"}
    return pod(
        f"{runner}-workflow",
        {"runner-pod": runner},
        {},
        client.V1PodSpec(
            init_containers=[
                c("fs-init", "ghcr.io/actions/actions-runner:latest", command=["sh", "-c", "mkdir -p /mnt/externals"])
            ],
            containers=[
                c(
                    "job",
                    "node:20",
                    job_resources,
                    env=env(**container_env),
                    command=["tail"],
                    args=["-f", "/dev/null"],
                ),
                c("postgres", "postgres:16", env=env(GITHUB_ACTIONS="true", CI="true")),
            ],
            restart_policy="Never",
            security_context=client.V1PodSecurityContext(fs_group=1001),
            volumes=[client.V1Volume(name="work", empty_dir=client.V1EmptyDirVolumeSource())],
        ),
    )


GITLAB_ENV = {
    "CI": "true",
    "GITLAB_CI": "true",
    "CI_PROJECT_NAMESPACE": "acme",
    "CI_PROJECT_NAME": "web",
    "CI_PROJECT_NAMESPACE_ID": "7",
    "CI_CONFIG_PATH": ".gitlab-ci.yml",
    "CI_JOB_NAME": "build",
    "CI_JOB_ID": "4242",
}


def gitlab(*, build_resources: client.V1ResourceRequirements | None = None) -> Doc:
    unique = "runner-abcd1234-project-7-concurrent-0"
    return pod(
        None,
        {
            "pod": unique,
            "project.runner.gitlab.com/id": "7",
            "project.runner.gitlab.com/namespace-id": "7",
            "project.runner.gitlab.com/name": "web",
            "project.runner.gitlab.com/namespace": "acme",
            "project.runner.gitlab.com/root-namespace": "acme",
            "project.runner.gitlab.com/root-namespace-id": "7",
            "job.runner.gitlab.com/pod": unique,
            "manager.runner.gitlab.com/name": "k8s-runner",
            "manager.runner.gitlab.com/id-short": "abcd1234",
        },
        {"job.runner.gitlab.com/id": "4242", "project.runner.gitlab.com/id": "7"},
        client.V1PodSpec(
            init_containers=[
                c(
                    "init-permissions",
                    "registry.gitlab.com/gitlab-org/gitlab-runner/gitlab-runner-helper:x86_64-v18.0.0",
                )
            ],
            containers=[
                c("build", "golang:1.23", build_resources or res("500m", "1Gi", "4", "8Gi"), env=env(**GITLAB_ENV)),
                c(
                    "helper",
                    "registry.gitlab.com/gitlab-org/gitlab-runner/gitlab-runner-helper:x86_64-v18.0.0",
                    res("100m", "128Mi", "500m", "256Mi"),
                ),
                c("svc-0", "postgres:16", res("250m", "512Mi", "2", "2Gi")),
            ],
            restart_policy="Never",
        ),
        generate_name=f"{unique}-",
    )


def buildkite(*, step_key: str = "build") -> Doc:
    job = str(uuid.UUID(int=42))
    return pod(
        None,
        {"buildkite.com/job-uuid": job, "tag.buildkite.com/queue": "kubernetes"},
        {
            "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
            "buildkite.com/build-url": "https://buildkite.com/acme/web/builds/42",
            "buildkite.com/build-branch": "main",
            "buildkite.com/build-repo": "git@github.com:acme/web.git",
            "buildkite.com/pipeline-slug": "web",
            "buildkite.com/step-key": step_key,
            "buildkite.com/job-url": f"https://buildkite.com/acme/web/builds/42#{job}",
            "buildkite.com/job-priority": "0",
        },
        client.V1PodSpec(
            init_containers=[c("copy-agent", "ghcr.io/buildkite/agent:3", command=["cp"])],
            containers=[
                c("agent", "ghcr.io/buildkite/agent:3", env=env(BUILDKITE_AGENT_ACQUIRE_JOB=job)),
                c("checkout", "ghcr.io/buildkite/agent:3"),
                c("container-0", "golang:1.23", env=env(BUILDKITE_COMMAND="make build")),
            ],
            restart_policy="Never",
        ),
        generate_name=f"buildkite-{job}-",
    )


def jenkins(*, cpu_limit: str | None = "1") -> Doc:
    return pod(
        "web-main-42-abcde-0x1y2",
        {"jenkins": "slave", "jenkins/label": "web_main_42-abcde", "jenkins/label-digest": "0" * 40},
        {
            "buildUrl": "http://jenkins.example.com/job/acme/job/web/job/main/42/",
            "runUrl": "job/acme/job/web/job/main/42/",
        },
        client.V1PodSpec(
            containers=[
                c(
                    "jnlp",
                    "jenkins/inbound-agent:3301.v4363ddcca_4e7-3",
                    res("100m", "256Mi", cpu_limit, "512Mi"),
                    env=env(
                        JENKINS_URL="http://jenkins.example.com/",
                        JENKINS_SECRET="x" * 64,
                        JENKINS_AGENT_NAME="web-main-42-abcde-0x1y2",
                        JENKINS_AGENT_WORKDIR="/home/jenkins/agent",
                    ),
                ),
                c("maven", "maven:3.9", command=["sleep"], args=["99d"]),
            ],
            restart_policy="Never",
        ),
    )


def tekton(*, pipeline: bool = True) -> Doc:
    lb = {
        "app.kubernetes.io/managed-by": "tekton-pipelines",
        "tekton.dev/taskRun": "web-ci-run-x7k2p-build",
        "tekton.dev/taskRunUID": str(uuid.UUID(int=7)),
        "tekton.dev/task": "golang-build",
    }
    if pipeline:
        lb |= {
            "tekton.dev/pipeline": "web-ci",
            "tekton.dev/pipelineRun": "web-ci-run-x7k2p",
            "tekton.dev/pipelineRunUID": str(uuid.UUID(int=8)),
            "tekton.dev/pipelineTask": "build",
        }
    return pod(
        "web-ci-run-x7k2p-build-pod",
        lb,
        {"pipeline.tekton.dev/release": "v1.15.0"},
        client.V1PodSpec(
            init_containers=[
                c("prepare", "ghcr.io/tektoncd/pipeline/entrypoint:v1.15.0"),
                c("place-scripts", "cgr.dev/chainguard/busybox"),
            ],
            containers=[
                c("step-build", "golang:1.23", res("1", "2Gi", "2", "4Gi")),
                c("step-test", "golang:1.23"),
                c("sidecar-postgres", "postgres:16"),
            ],
            restart_policy="Never",
        ),
    )


def argo(*, repo: str | None = "web", node: str = "ci-x7k2p.build") -> Doc:
    ann = {
        "workflows.argoproj.io/node-name": node,
        "workflows.argoproj.io/node-id": "ci-x7k2p-1234567890",
        "kubectl.kubernetes.io/default-container": "main",
    }
    if repo is not None:
        ann["ci-sizer.io/repo"] = repo
    executor = "quay.io/argoproj/argoexec:v3.7.18"
    return pod(
        "ci-x7k2p-build-1234567890",
        {"workflows.argoproj.io/workflow": "ci-x7k2p", "workflows.argoproj.io/completed": "false"},
        ann,
        client.V1PodSpec(
            init_containers=[c("init", executor, env=env(ARGO_CONTAINER_NAME="init"))],
            containers=[
                c("wait", executor, env=env(ARGO_CONTAINER_NAME="wait")),
                c("main", "golang:1.23", env=env(ARGO_CONTAINER_NAME="main")),
            ],
            restart_policy="Never",
        ),
    )


# --------------------------------------------------------------------------- the review


def review(pod_doc: Doc, namespace: str, *, dry_run: bool = False, operation: str = "CREATE") -> Doc:
    """An AdmissionReview as the API server sends a mutating webhook for a pod CREATE (CreateV1AdmissionReview)."""
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    user = to_dict(
        client.V1UserInfo(
            username="system:serviceaccount:ci:runner", uid=str(uuid.uuid4()), groups=["system:serviceaccounts"]
        )
    )
    obj = copy.deepcopy(pod_doc)
    obj["metadata"]["namespace"] = namespace
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": (pod_doc["metadata"].get("name") or ""),
            "namespace": namespace,
            "operation": operation,
            "userInfo": user,
            "object": obj,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
