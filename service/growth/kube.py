"""The Kubernetes actuator: an in-place resize of the build's own container, through the pod's ``resize``
subresource (KEP-1287; beta and on by default from Kubernetes 1.33), with the official client
(``pip install 'ci-sizer[grow]'``; imported only here, only when this actuator is used).

Upstream, read for what is sent and followed (kubernetes/kubernetes):

- ``pkg/apis/core/validation/validation.go`` ``ValidatePodResize``: only cpu and memory of
  ``spec.containers[*].resources`` may change; the pod's QoS class may not (so a Guaranteed pod's
  memory request rises with its limit); pods with pod-level resources, static (mirror) pods and
  Windows pods cannot be resized; a running pod whose ``status.containerStatuses[].resources`` is
  unset is on a node without resize support (``isPodResizeRequestSupported``);
  ``validateContainerResize``: a memory limit may not be added, nor lowered while the memory
  ``resizePolicy`` is ``NotRequired`` (the default).
- ``pkg/apis/core/types.go``: the pod conditions ``PodResizePending`` (reason ``Deferred`` or
  ``Infeasible``: the kubelet has not allocated the resize) and ``PodResizeInProgress`` (allocated,
  not yet actuated).
- ``pkg/kubelet/allocation/allocation_manager.go`` ``handlePodResourcesResize``: a resize that fits is
  allocated (PodResizePending cleared, PodResizeInProgress set); one that does not gets
  PodResizePending with the admit handler's reason; ``retryPendingResizes`` re-evaluates ``Deferred``
  ones periodically and never ``Infeasible`` ones. The resize is done when the runtime reports the new
  limit in ``status.containerStatuses[].resources``.
- kubernetes/enhancements ``keps/sig-node/1287-in-place-update-pod-resources/README.md``
  ("Resize Status"): an unknown reason is to be read as ``Deferred``.

The patch is a JSON Patch (RFC 6902): the client's ``patch_namespaced_pod_resize`` sends
``application/json-patch+json`` whatever the body (kubernetes-client/python 33 and 37 alike), so the
body is a list of operations, the first a ``test`` of the container's name at its index.

The pod is named by the downward API: ``CI_SIZER_POD_NAME`` and ``CI_SIZER_POD_NAMESPACE`` (else the
service account's namespace file). Credentials are the pod's service account (in-cluster
configuration), else ``KUBECONFIG``."""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from service.growth.guard import NotResizable, Record

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
POD_ENV, NAMESPACE_ENV = "CI_SIZER_POD_NAME", "CI_SIZER_POD_NAMESPACE"
#: a pod is followed this often after a resize is asked, and this often while it is Deferred
FOLLOW, FOLLOW_DEFERRED = 0.1, 1.0


def pod_identity(env: Mapping[str, str]) -> tuple[str, str]:
    pod = env.get(POD_ENV, "")
    if not pod:
        raise NotResizable(f"no {POD_ENV} (set it from the downward API: fieldRef metadata.name)")
    namespace = env.get(NAMESPACE_ENV, "")
    if not namespace:
        try:
            namespace = NAMESPACE_FILE.read_text().strip()
        except OSError:
            raise NotResizable(f"no {NAMESPACE_ENV} and no {NAMESPACE_FILE}") from None
    return pod, namespace


def _condition(pod: Mapping[str, Any], kind: str, generation: int | None) -> dict[str, Any] | None:
    """The pod's condition ``kind`` when true, unless it says it is about an older resize
    (``observedGeneration`` below the generation the resize made)."""
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            seen = c.get("observedGeneration")
            if generation is not None and isinstance(seen, int) and seen < generation:
                return None
            return dict(c)
    return None


class KubeActuator:
    name = "kubernetes"
    inline = False

    def __init__(self, *, pod: str, namespace: str, container: str, timeout: float) -> None:
        # as Any: its typing differs between the client's versions (33 untyped, 37 typed per model)
        client: Any = importlib.import_module("kubernetes.client")
        config: Any = importlib.import_module("kubernetes.config")
        utils: Any = importlib.import_module("kubernetes.utils")
        self.pod, self.namespace, self.container, self.timeout = pod, namespace, container, timeout
        self._parse: Callable[[str], Any] = utils.parse_quantity
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            try:
                config.load_kube_config(client_configuration=cfg)
            except (config.ConfigException, OSError) as exc:
                raise NotResizable(f"no in-cluster service account and no usable KUBECONFIG ({exc})") from None
        cfg.retries = 1
        self._client = client.ApiClient(cfg)
        self.api: Any = client.CoreV1Api(self._client)
        try:
            found = self._get()
        except Exception as exc:
            raise NotResizable(f"cannot read pod {namespace}/{pod}: {_why(exc)}") from None
        self.index, self.raise_request = self._check(found)

    def _get(self) -> dict[str, Any]:
        r = self.api.read_namespaced_pod(
            self.pod, self.namespace, _preload_content=False, _request_timeout=self.timeout
        )
        pod: dict[str, Any] = json.loads(r.data)
        return pod

    def _check(self, pod: Mapping[str, Any]) -> tuple[int, bool]:
        """Where the container is, and whether its memory request rises with its limit (Guaranteed
        QoS). NotResizable when ValidatePodResize would refuse, or the resize would restart the build."""
        spec = pod.get("spec", {})
        names = [c.get("name") for c in spec.get("containers", [])]
        if self.container not in names:
            raise NotResizable(
                f"pod {self.pod} has no container {self.container!r} (it has {names}; give --pod-container)"
            )
        index = names.index(self.container)
        ours = spec["containers"][index]
        level = spec.get("resources") or {}
        if level.get("requests") or level.get("limits"):
            raise NotResizable("pods with pod-level resources cannot be resized")
        if (spec.get("os") or {}).get("name") == "windows":
            raise NotResizable("windows pods cannot be resized")
        if "kubernetes.io/config.mirror" in (pod.get("metadata", {}).get("annotations") or {}):
            raise NotResizable("static pods cannot be resized")
        if "memory" not in (ours.get("resources", {}).get("limits") or {}):
            raise NotResizable(
                f"container {self.container!r} has no memory limit to grow (one cannot be added in place)"
            )
        for policy in ours.get("resizePolicy") or []:
            if policy.get("resourceName") == "memory" and policy.get("restartPolicy") == "RestartContainer":
                raise NotResizable("its memory resizePolicy is RestartContainer: a resize would restart the build")
        for status in pod.get("status", {}).get("containerStatuses") or []:
            if status.get("name") == self.container and "running" in (status.get("state") or {}):
                if status.get("resources") is None:
                    raise NotResizable("its node does not support in-place resize (no status resources)")
        return index, pod.get("status", {}).get("qosClass") == "Guaranteed"

    def patch(self, target: int) -> list[dict[str, Any]]:
        base = f"/spec/containers/{self.index}"
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": f"{base}/name", "value": self.container},
            {"op": "replace", "path": f"{base}/resources/limits/memory", "value": str(target)},
        ]
        if self.raise_request:  # Guaranteed stays Guaranteed: request and limit rise together
            ops.append({"op": "replace", "path": f"{base}/resources/requests/memory", "value": str(target)})
        return ops

    def _actual(self, pod: Mapping[str, Any]) -> int | None:
        """The container's memory limit as the kubelet reports it running (``status.containerStatuses[].resources``)."""
        for status in pod.get("status", {}).get("containerStatuses") or []:
            if status.get("name") == self.container:
                limit = ((status.get("resources") or {}).get("limits") or {}).get("memory")
                return int(self._parse(limit)) if limit is not None else None
        return None

    def grow(self, current: int, target: int, record: Record, cancelled: threading.Event) -> bool:
        try:
            r = self.api.patch_namespaced_pod_resize(
                self.pod, self.namespace, self.patch(target), _preload_content=False, _request_timeout=self.timeout
            )
            generation = json.loads(r.data).get("metadata", {}).get("generation")
        except Exception as exc:
            record("error", current, target, f"PATCH pods/{self.pod}/resize: {_why(exc)}")
            return False
        deferred = False
        failures = 0
        while not cancelled.wait(FOLLOW_DEFERRED if deferred else FOLLOW):
            try:
                pod = self._get()
                actual = self._actual(pod)
            except Exception as exc:
                failures += 1
                if failures >= 3:
                    record("error", current, target, f"GET pods/{self.pod}: {_why(exc)}")
                    return False
                continue
            failures = 0
            if actual is not None and actual >= target:
                record("grown", current, actual, "")
                return True
            pending = _condition(pod, "PodResizePending", generation)
            if pending is not None:
                if pending.get("reason") == "Infeasible":
                    record("infeasible", current, target, pending.get("message") or "")
                    return False  # never re-evaluated by the kubelet: asking again cannot help
                if not deferred:  # Deferred, or a reason this guard does not know (the KEP: read as Deferred)
                    record("deferred", current, target, pending.get("message") or pending.get("reason") or "")
                    deferred = True
        return True  # the build ended first

    def close(self) -> None:
        pool = getattr(self._client, "rest_client", None)
        manager = getattr(pool, "pool_manager", None)
        if manager is not None:
            manager.clear()


def _why(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        body = getattr(exc, "body", None) or ""
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = str(body)[:200]
        return f"{status} {getattr(exc, 'reason', '')}: {message}".strip()
    return f"{type(exc).__name__}: {exc}"[:300]
