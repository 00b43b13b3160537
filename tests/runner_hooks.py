"""runner-container-hooks' own compiled k8s hook, run for its ``prepare_job`` against a fake Kubernetes API.

The hook (actions/runner-container-hooks packages/k8s, built by tests/tools/build-runner-hooks.sh into
``$CI_SIZER_RUNNER_HOOKS/<version>``) is given what the runner gives it on stdin (``{"command":
"prepare_job", "args": {"container": ..., "services": [...]}}``, packages/hooklib/src/interfaces.ts)
and a kubeconfig that points at a small HTTP server here. That server answers the calls prepare_job
makes before it creates the job pod (the access review, the pod list of prunePods, the runner's own
pod for its node) and records the pod the hook POSTs: that is the pod the hook really builds from the
template. It then reports the pod as failed, so that the hook stops there (it would exec into the pod
next, which needs a real cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .http_stub import Respond, StubServer

ROOT = os.environ.get("CI_SIZER_RUNNER_HOOKS", "")
NODE = shutil.which("node")
NAMESPACE = "arc-runners"
RUNNER_POD = "runner-abc"


def versions() -> list[str]:
    """The built hook versions, e.g. ``["v0.7.0", "v0.8.1"]``; empty when none was built."""
    if not ROOT or NODE is None or not Path(ROOT).is_dir():
        return []
    return sorted(p.name for p in Path(ROOT).iterdir() if (p / "packages" / "k8s" / "lib" / "index.js").exists())


@dataclass
class Prepared:
    pod: dict[str, Any] | None  # the pod the hook created, as it sent it
    returncode: int
    output: str


def _kubernetes(created: list[dict[str, Any]]) -> Respond:
    """The API server's answers to what prepare_job asks before and as it creates the job pod."""

    def respond(method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        path = path.split("?")[0]
        pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
        if method == "POST" and path.endswith("/selfsubjectaccessreviews"):
            return 201, {**json.loads(body), "status": {"allowed": True}}
        if method == "POST" and path == pods:
            created.append(json.loads(body))
            return 201, created[-1]
        if method == "GET" and path == pods:
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}
        if method == "GET" and path.startswith(pods + "/"):
            name = path.rsplit("/", 1)[1]
            if name == RUNNER_POD:  # the runner's own pod, for its node
                return 200, {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {"nodeName": "node-1"},
                }
            return 200, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "status": {"phase": "Failed"}}
        if method == "DELETE":
            return 200, {"kind": "Status", "status": "Success"}
        return 404, {"kind": "Status", "status": "Failure", "code": 404}

    return respond


def prepare_job(version: str, tmp: Path, template: str | None, services: tuple[str, ...] = ()) -> Prepared:
    """Run the hook's prepare_job for a job container ``node:20`` and ``services``, with
    ACTIONS_RUNNER_CONTAINER_HOOK_TEMPLATE set to ``template`` (a path) unless None."""
    assert NODE is not None
    created: list[dict[str, Any]] = []
    api = StubServer(_kubernetes(created))
    try:
        kubeconfig = tmp / "kubeconfig.json"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": api.url, "insecure-skip-tls-verify": True}}],
                    "users": [{"name": "runner", "user": {"token": "fake"}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "runner", "namespace": NAMESPACE}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        workspace = tmp / "_work" / "web" / "web"
        workspace.mkdir(parents=True, exist_ok=True)
        (tmp / "_temp").mkdir(exist_ok=True)
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp),
            "KUBECONFIG": str(kubeconfig),
            "ACTIONS_RUNNER_POD_NAME": RUNNER_POD,
            "ACTIONS_RUNNER_CLAIM_NAME": f"{RUNNER_POD}-work",
            "ACTIONS_RUNNER_KUBERNETES_NAMESPACE": NAMESPACE,
            "GITHUB_WORKSPACE": str(workspace),
            "RUNNER_TEMP": str(tmp / "_temp"),
        }
        if template is not None:
            env["ACTIONS_RUNNER_CONTAINER_HOOK_TEMPLATE"] = template
        container = {
            "image": "node:20",
            "workingDirectory": "/__w/web/web",
            "environmentVariables": {},
            "userMountVolumes": [],
            "systemMountVolumes": [],
            "portMappings": [],
        }
        service_args = [
            {"contextName": f"svc{i}", "image": image, "environmentVariables": {}, "portMappings": []}
            for i, image in enumerate(services)
        ]
        stdin = {
            "command": "prepare_job",
            "responseFile": str(tmp / "response.json"),
            "args": {"container": container, "services": service_args},
            "state": {},
        }
        index = Path(ROOT) / version / "packages" / "k8s" / "lib" / "index.js"
        p = subprocess.run(
            [NODE, str(index)], input=json.dumps(stdin), env=env, capture_output=True, text=True, timeout=120
        )
        pod = created[0] if created else None
        return Prepared(pod, p.returncode, p.stdout + p.stderr)
    finally:
        api.close()
