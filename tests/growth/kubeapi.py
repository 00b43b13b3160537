"""An emulated Kubernetes API and kubelet for one pod, for the guard's Kubernetes actuator to talk to
with the official client (no kube-apiserver runs here).

What it serves, over HTTP with a bearer token (the client configured by a kubeconfig):

- ``GET /api/v1/namespaces/{ns}/pods/{name}``: the pod.
- ``PATCH /api/v1/namespaces/{ns}/pods/{name}/resize``: a JSON Patch (RFC 6902; the only patch type it
  takes: ``application/json-patch+json``, what the client sends for this call; a body that is not a
  list is refused as the apiserver's JSON Patch decoding refuses it), then validated as
  kubernetes/kubernetes ``pkg/apis/core/validation/validation.go`` ``ValidatePodResize`` and
  ``validateContainerResize`` do (function by function below), with the QoS class computed as
  ``pkg/apis/core/helper/qos/qos.go`` ``ComputePodQOS`` does. A refusal is a ``Status`` with the
  apiserver's reasons (``Forbidden`` 403 for RBAC, ``Invalid`` 422 for validation).

Its kubelet follows ``pkg/kubelet/allocation/allocation_manager.go``: ``handlePodResourcesResize``
admits a resize that fits (``PodResizePending`` cleared, ``PodResizeInProgress`` set), the capacity
check of ``canResizePod`` makes a request above the node's allocatable ``Infeasible`` ("Node didn't
have enough capacity: memory, requested: R, capacity: C") and one that does not fit beside the other
pods ``Deferred`` ("Node didn't have enough resource: ..."), ``retryPendingResizes`` retries Deferred
ones (here every ``retry`` seconds) and never Infeasible ones. After ``delay`` seconds an admitted
resize is actuated: the new limit is written into the real cgroup the test gives (what the runtime's
UpdateContainerResources does), ``status.containerStatuses[].resources`` reports it, and
``PodResizeInProgress`` is cleared."""

from __future__ import annotations

import copy
import json
import threading
import time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes.utils import parse_quantity

MIB = 1 << 20
JSON_PATCH = "application/json-patch+json"


def quantity(value: Any) -> Decimal:
    """A quantity's exact value (the client's own parser: the test-only oracle for quantities)."""
    return Decimal(parse_quantity(value))  # type: ignore[no-untyped-call]


def canonical(n: int) -> str:
    """How the apiserver and the kubelet write a memory quantity back (binary SI when exact)."""
    for suffix, size in (("Gi", 1 << 30), ("Mi", MIB), ("Ki", 1024)):
        if n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def runner_pod(memory: int, *, guaranteed: bool = True, restart: str = "NotRequired") -> dict[str, Any]:
    """A running CI pod as a runner's Kubernetes executor makes one (a ``build`` container and a
    ``helper``, as the GitLab runner's pods have), its build container at ``memory`` bytes."""
    build_req = {"cpu": "1", "memory": canonical(memory)} if guaranteed else {"cpu": "500m", "memory": "128Mi"}
    build_lim = {"cpu": "1", "memory": canonical(memory)}
    helper = {"cpu": "100m", "memory": "64Mi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "runner-abc123-project-7-concurrent-0",
            "namespace": "ci",
            "uid": "0b5c7a8e-2f0d-4c55-9a55-1f3f3f0a9d11",
            "resourceVersion": "1",
            "generation": 1,
            "labels": {"pod": "runner-abc123-project-7-concurrent-0"},
        },
        "spec": {
            "containers": [
                {
                    "name": "build",
                    "image": "python:3.12",
                    "command": ["sh", "-c", "sleep infinity"],
                    "resources": {"requests": build_req, "limits": build_lim},
                    "resizePolicy": [
                        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
                        {"resourceName": "memory", "restartPolicy": restart},
                    ],
                },
                {
                    "name": "helper",
                    "image": "registry.gitlab.com/gitlab-org/gitlab-runner/gitlab-runner-helper:x86_64-latest",
                    "resources": {"requests": dict(helper), "limits": dict(helper)},
                },
            ],
            "restartPolicy": "Never",
            "serviceAccountName": "gitlab-runner",
            "nodeName": "node-1",
        },
        "status": {
            "phase": "Running",
            "qosClass": "Guaranteed" if guaranteed else "Burstable",
            "containerStatuses": [
                {
                    "name": name,
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-11-20T10:00:00Z"}},
                    "allocatedResources": dict(res["requests"]),
                    "resources": copy.deepcopy(res),
                }
                for name, res in (
                    ("build", {"requests": build_req, "limits": build_lim}),
                    ("helper", {"requests": helper, "limits": helper}),
                )
            ],
        },
    }


# ------------------------------------------------------------------ JSON Patch (RFC 6902)


class PatchError(ValueError):
    pass


def _walk(doc: Any, path: str) -> tuple[Any, str | int]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    if not parts:
        raise PatchError("the whole document cannot be replaced")
    node = doc
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError):
            raise PatchError(f"path {path}: no {part!r}") from None
    last = parts[-1]
    return node, (int(last) if isinstance(node, list) and last != "-" else last)


def apply_json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        parent, key = _walk(doc, op["path"])
        kind = op.get("op")
        exists = (isinstance(parent, dict) and key in parent) or (
            isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent)
        )
        if kind == "test":
            if not exists or parent[key] != op["value"]:
                raise PatchError(f"testing value {op['path']} failed")
        elif kind == "replace":
            if not exists:
                raise PatchError(f"replace operation does not apply: doc is missing key: {op['path']}")
            parent[key] = op["value"]
        elif kind == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if key == "-" else key, op["value"])  # type: ignore[arg-type]
            else:
                parent[key] = op["value"]
        elif kind == "remove":
            if not exists:
                raise PatchError(f"remove operation does not apply: doc is missing path: {op['path']}")
            del parent[key]
        else:
            raise PatchError(f"unexpected kind: {kind}")
    return doc


# ------------------------------------------------------------------ validation, as upstream


def compute_qos(pod: dict[str, Any]) -> str:
    """qos.go ComputePodQOS: BestEffort without requests and limits, Guaranteed when every container has
    cpu and memory limits and the summed requests equal the summed limits, else Burstable."""
    spec = pod["spec"]
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        res = c.get("resources") or {}
        for name, q in (res.get("requests") or {}).items():
            if name in ("cpu", "memory") and quantity(q) > 0:
                requests[name] = requests.get(name, Decimal(0)) + quantity(q)
        found = set()
        for name, q in (res.get("limits") or {}).items():
            if name in ("cpu", "memory") and quantity(q) > 0:
                found.add(name)
                limits[name] = limits.get(name, Decimal(0)) + quantity(q)
        if not {"cpu", "memory"} <= found:
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and all(limits.get(k) == v for k, v in requests.items()) and len(requests) == len(limits):
        return "Guaranteed"
    return "Burstable"


def _container_resize(new: dict[str, Any], old: dict[str, Any], path: str) -> list[str]:
    """validation.go validateContainerResize."""
    errors = []
    nres, ores = new.get("resources") or {}, old.get("resources") or {}
    for kind in ("requests", "limits"):
        if set(ores.get(kind) or {}) - set(nres.get(kind) or {}):
            errors.append(f"{path}.resources.{kind}: Forbidden: resource {kind} cannot be removed")
    policy = next(
        (p.get("restartPolicy") for p in new.get("resizePolicy") or [] if p.get("resourceName") == "memory"), ""
    )
    if policy in ("NotRequired", "PreferNoRestart", ""):
        new_limit = (nres.get("limits") or {}).get("memory")
        old_limit = (ores.get("limits") or {}).get("memory")
        if new_limit is not None and old_limit is not None and quantity(new_limit) < quantity(old_limit):
            errors.append(f"{path}.resources.limits[memory]: Forbidden: memory limits cannot be decreased "
                          "unless resizePolicy is RestartContainer")  # fmt: skip
        elif new_limit is not None and old_limit is None:
            errors.append(f"{path}.resources.limits[memory]: Forbidden: memory limits cannot be added "
                          "unless resizePolicy is RestartContainer")  # fmt: skip
    return errors


def _without_cpu_memory(container: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """validation.go dropCPUMemoryResourcesFromContainer: cpu and memory taken back from the old container."""
    c = copy.deepcopy(container)
    res = c.get("resources") or {}
    ores = old.get("resources") or {}
    out: dict[str, Any] = {}
    for kind in ("limits", "requests"):
        if ores.get(kind) is None:
            continue
        munged = {k: v for k, v in (res.get(kind) or {}).items() if k not in ("cpu", "memory")}
        munged.update({k: v for k, v in ores[kind].items() if k in ("cpu", "memory")})
        out[kind] = munged
    c["resources"] = out
    return c


def validate_resize(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """validation.go ValidatePodResize, for what a pod's resize can change."""
    errors = []
    if new.get("metadata") != old.get("metadata"):
        errors.append("metadata: Invalid: metadata may not change through resize")  # ValidateObjectMetaUpdate
    for c in new["spec"].get("containers", []):  # part of validatePodMetadataAndSpec: requests within limits
        res = c.get("resources") or {}
        for k, q in (res.get("requests") or {}).items():
            lim = (res.get("limits") or {}).get(k)
            if lim is not None and quantity(q) > quantity(lim):
                errors.append(f"spec.containers[{c['name']}].resources.requests[{k}]: Invalid: must be less "
                              f"than or equal to {k} limit of {lim}")  # fmt: skip
    level = old["spec"].get("resources") or {}, new["spec"].get("resources") or {}
    if any(r.get("requests") or r.get("limits") for r in level):
        return [": Forbidden: pods with pod-level resources cannot be resized"]
    if "kubernetes.io/config.mirror" in (old["metadata"].get("annotations") or {}):
        return [": Forbidden: static pods cannot be resized"]
    if (old["spec"].get("os") or {}).get("name") == "windows":
        return [": Forbidden: windows pods cannot be resized"]
    if (old["status"].get("qosClass") or compute_qos(old)) != compute_qos(new):  # GetPodQOS(old) != ComputePodQOS(new)
        errors.append("spec: Invalid: Pod QOS Class may not change as a result of resizing")
    running = [s for s in old["status"].get("containerStatuses") or [] if "running" in (s.get("state") or {})]
    if running and running[0].get("resources") is None:  # isPodResizeRequestSupported
        errors.append("spec: Forbidden: Pod running on node without support for resize")
    olds, news = old["spec"]["containers"], new["spec"]["containers"]
    if len(olds) != len(news):
        return [*errors, "spec: Forbidden: only cpu and memory resources are mutable"]
    for i, (n, o) in enumerate(zip(news, olds, strict=True)):
        errors += _container_resize(n, o, f"spec.containers[{i}]")
        if _without_cpu_memory(n, o) != o:
            errors.append("spec: Forbidden: only cpu and memory resources are mutable")
    rest = {k: v for k, v in new["spec"].items() if k != "containers"}
    if rest != {k: v for k, v in old["spec"].items() if k != "containers"}:
        errors.append("spec: Forbidden: only cpu and memory resources are mutable")
    return errors


def _pod_memory_request(pod: dict[str, Any]) -> int:
    return int(
        sum(
            quantity((c.get("resources") or {}).get("requests", {}).get("memory", "0"))
            for c in pod["spec"]["containers"]
        )
    )


# ------------------------------------------------------------------ the server and its kubelet


class KubeApi:
    """One pod, its API and its node's kubelet. ``capacity`` is the node's allocatable memory,
    ``others`` the memory the other pods on it request (lower it to make room for a Deferred resize)."""

    def __init__(
        self,
        pod: dict[str, Any],
        *,
        cgroup: Path | None,
        token: str = "emulated-sa-token",
        delay: float = 0.1,
        capacity: int = 64 << 30,
        others: int = 0,
        retry: float = 0.2,
        forbid_resize: bool = False,
    ) -> None:
        self.pod = copy.deepcopy(pod)
        self.cgroup = cgroup
        self.token = token
        self.delay = delay
        self.capacity = capacity
        self.others = others
        self.retry = retry
        self.forbid_resize = forbid_resize
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str, str, Any]] = []  #: (method, path, content type, body)
        self.refusals: list[tuple[int, str]] = []
        self._pending = False
        self._stop = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self._kubelet = threading.Thread(target=self._kubelet_loop, daemon=True)
        self._kubelet.start()

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> KubeApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kubeconfig(self, path: Path) -> Path:
        ns = self.pod["metadata"]["namespace"]
        path.write_text(
            json.dumps({
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulated", "cluster": {"server": self.url}}],
                "users": [{"name": "runner", "user": {"token": self.token}}],
                "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "runner", "namespace": ns}}],
                "current-context": "emulated",
            })
        )  # fmt: skip
        return path

    def patches(self) -> list[Any]:
        return [body for method, _, _, body in self.requests if method == "PATCH"]

    # -------------------------------------------------------------- HTTP

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                api.refusals.append((code, message))
                self._send(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                  "message": message, "reason": reason, "code": code})  # fmt: skip

            def _route(self) -> str | None:
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    self._status(401, "Unauthorized", "Unauthorized")
                    return None
                meta = api.pod["metadata"]
                base = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                path = self.path.split("?", 1)[0]
                return path[len(base) :] if path.startswith(base) else "?"

            def do_GET(self) -> None:
                where = self._route()
                api.requests.append(("GET", self.path, "", None))
                if where is None:
                    return
                if where != "":
                    self._status(404, "NotFound", f"the server could not find the requested resource ({self.path})")
                    return
                with api.lock:
                    self._send(200, copy.deepcopy(api.pod))

            def do_PATCH(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                kind = self.headers.get("Content-Type", "").split(";")[0]
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                api.requests.append(("PATCH", self.path, kind, body))
                where = self._route()
                if where is None:
                    return
                name = api.pod["metadata"]["name"]
                if where != "/resize":
                    self._status(404, "NotFound", f"the server could not find the requested resource ({self.path})")
                elif api.forbid_resize:
                    self._status(403, "Forbidden", f'pods "{name}" is forbidden: User "system:serviceaccount:ci:'
                                 f'gitlab-runner" cannot patch resource "pods/resize" in API group "" in the '
                                 f'namespace "ci"')  # fmt: skip
                elif kind != JSON_PATCH:
                    self._status(415, "UnsupportedMediaType", f"the emulated API takes {JSON_PATCH} only, not {kind}")
                elif not isinstance(body, list):
                    self._status(
                        400, "BadRequest", "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
                    )
                else:
                    api._resize(self, body)

        return Handler

    def _resize(self, handler: Any, ops: list[dict[str, Any]]) -> None:
        with self.lock:
            old = self.pod
            try:
                new = apply_json_patch(old, ops)
            except (PatchError, KeyError, TypeError) as exc:
                handler._status(
                    422, "Invalid", f"the server rejected our request due to an error in our request: {exc}"
                )
                return
            errors = validate_resize(new, old)
            if errors:
                handler._status(422, "Invalid", f'Pod "{old["metadata"]["name"]}" is invalid: ' + ", ".join(errors))
                return
            if new["spec"] != old["spec"]:
                new["metadata"]["generation"] = old["metadata"]["generation"] + 1
            new["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
            self.pod = new
            self._pending = True
            handler._send(200, copy.deepcopy(new))

    # -------------------------------------------------------------- the kubelet

    def _set_condition(self, kind: str, reason: str = "", message: str = "") -> None:
        c: dict[str, Any] = {"type": kind, "status": "True", "lastTransitionTime": "2026-11-20T10:00:01Z",
                             "observedGeneration": self.pod["metadata"]["generation"]}  # fmt: skip
        if reason:
            c["reason"] = reason
        if message:
            c["message"] = message
        self._clear_condition(kind)
        self.pod["status"]["conditions"].append(c)

    def _clear_condition(self, kind: str) -> None:
        self.pod["status"]["conditions"] = [c for c in self.pod["status"].get("conditions", []) if c["type"] != kind]

    def _kubelet_loop(self) -> None:
        while not self._stop.wait(0.02):
            with self.lock:
                if not self._pending:
                    continue
                requested = _pod_memory_request(self.pod)
                if requested > self.capacity:
                    self._set_condition("PodResizePending", "Infeasible", f"Node didn't have enough capacity: memory, "
                                        f"requested: {requested}, capacity: {self.capacity}")  # fmt: skip
                    self._pending = False  # never re-evaluated
                    continue
                if requested + self.others > self.capacity:
                    self._set_condition("PodResizePending", "Deferred", f"Node didn't have enough resource: memory, "
                                        f"requested: {requested}, used: {self.others}, capacity: {self.capacity}")  # fmt: skip
                    retry_at = time.monotonic() + self.retry
                else:
                    self._clear_condition("PodResizePending")
                    self._set_condition("PodResizeInProgress")
                    self._pending = False
                    retry_at = 0.0
                    spec = copy.deepcopy({c["name"]: c["resources"] for c in self.pod["spec"]["containers"]})
            if retry_at:
                self._stop.wait(max(0.0, retry_at - time.monotonic()))
                continue
            if self._stop.wait(self.delay):
                return
            self._actuate(spec)

    def _actuate(self, spec: dict[str, dict[str, Any]]) -> None:
        """What the runtime's UpdateContainerResources does for the build container, then the status."""
        limit = int(quantity(spec["build"]["limits"]["memory"]))
        if self.cgroup is not None:
            (self.cgroup / "memory.limit_in_bytes").write_text(str(limit))
        with self.lock:
            for status in self.pod["status"]["containerStatuses"]:
                res = spec[status["name"]]
                status["allocatedResources"] = {
                    k: canonical(int(quantity(v))) if k == "memory" else v for k, v in res["requests"].items()
                }
                status["resources"] = {kind: {k: canonical(int(quantity(v))) if k == "memory" else v for k, v in res[kind].items()}
                                       for kind in ("requests", "limits")}  # fmt: skip
            self._clear_condition("PodResizeInProgress")
