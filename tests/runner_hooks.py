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
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = os.environ.get("CI_SIZER_RUNNER_HOOKS", "")
NODE = shutil.which("node")
NAMESPACE = "arc-runners"
RUNNER_POD = "runner-abc"


def versions() -> list[str]:
    """The built hook versions, e.g. ``["v0.7.0", "v0.8.1"]``; empty when none was built."""
    if not ROOT or NODE is None:
        return []
    return sorted(p.name for p in Path(ROOT).iterdir() if (p / "packages" / "k8s" / "lib" / "index.js").exists())


@dataclass
class Prepared:
    pod: dict[str, Any] | None  # the pod the hook created, as it sent it
    returncode: int
    output: str


class FakeApi:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("content-length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def do_POST(self) -> None:
                body = self._body()
                if self.path.endswith("/selfsubjectaccessreviews"):
                    self._send(201, {**body, "status": {"allowed": True}})
                elif re.fullmatch(rf"/api/v1/namespaces/{NAMESPACE}/pods", self.path):
                    api.created.append(body)
                    self._send(201, body)
                else:
                    self._send(404, {"kind": "Status", "status": "Failure", "code": 404})

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == f"/api/v1/namespaces/{NAMESPACE}/pods":
                    self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []})
                elif path == f"/api/v1/namespaces/{NAMESPACE}/pods/{RUNNER_POD}":
                    pod = {"metadata": {"name": RUNNER_POD}, "spec": {"nodeName": "node-1", "containers": []}}
                    self._send(200, {"apiVersion": "v1", "kind": "Pod", **pod})
                elif path.startswith(f"/api/v1/namespaces/{NAMESPACE}/pods/"):
                    name = path.rsplit("/", 1)[1]
                    pod = {"metadata": {"name": name}, "spec": {"containers": []}, "status": {"phase": "Failed"}}
                    self._send(200, {"apiVersion": "v1", "kind": "Pod", **pod})
                else:
                    self._send(404, {"kind": "Status", "status": "Failure", "code": 404})

            def do_DELETE(self) -> None:
                self._send(200, {"kind": "Status", "status": "Success"})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def prepare_job(version: str, tmp: Path, template: str | None, services: tuple[str, ...] = ()) -> Prepared:
    """Run the hook's prepare_job for a job container ``node:20`` and ``services``, with
    ACTIONS_RUNNER_CONTAINER_HOOK_TEMPLATE set to ``template`` (a path) unless None."""
    assert NODE is not None
    api = FakeApi()
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
        pod = api.created[0] if api.created else None
        return Prepared(pod, p.returncode, p.stdout + p.stderr)
    finally:
        api.close()
