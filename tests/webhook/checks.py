"""What the API server does with a webhook's answer, emulated from its source where it cannot run here:
the response checked as k8s.io/apiserver ``pkg/admission/plugin/webhook/request/admissionreview.go``
VerifyAdmissionResponse checks it, the JSON patch applied with a JSON-patch library (RFC 6902, as
``jsonpatch.DecodePatch``/``Apply`` in the mutating dispatcher), and the pod held to what the API server
checks of it: it deserialises into the client's ``V1Pod`` with nothing dropped, its quantities parse
(the project's parser), names are unique, and no request is above its limit (tests/runner_pods.py
``check_pod``, from pkg/apis/core/validation)."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch

from service.quantity import parse_cpu_millicores, parse_memory_bytes

from ..runner_pods import check_pod
from .pods import Doc, from_dict, to_dict


def verify_response(review: Doc, answer: Doc) -> list[dict[str, Any]]:
    """The patch operations of a valid mutating response (empty for 'allowed, no patch')."""
    assert (answer["apiVersion"], answer["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response = answer["response"]
    assert response["uid"] == review["request"]["uid"]
    assert response["allowed"] is True  # the webhook never refuses a pod
    assert ("patch" in response) == ("patchType" in response)
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    assert ops
    return ops


def apply(pod: Doc, ops: list[dict[str, Any]]) -> Doc:
    """The patched pod, checked as the API server would."""
    patched: Doc = jsonpatch.apply_patch(pod, ops)
    model = from_dict(patched)
    assert to_dict(model) == _without_none(patched), "a field the V1Pod model does not know"
    spec = patched["spec"]
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        for kind in ("requests", "limits"):
            for resource, quantity in ((c.get("resources") or {}).get(kind) or {}).items():
                assert isinstance(quantity, str), (c["name"], resource, quantity)
                if resource == "cpu":
                    assert parse_cpu_millicores(quantity) > 0
                elif resource == "memory":
                    assert parse_memory_bytes(quantity) > 0
        for policy in c.get("resizePolicy") or []:
            assert policy["resourceName"] in ("cpu", "memory")
            assert policy["restartPolicy"] in ("NotRequired", "RestartContainer")
    check_pod(spec)
    return patched


def _without_none(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _without_none(v) for k, v in doc.items() if v is not None}
    if isinstance(doc, list):
        return [_without_none(v) for v in doc]
    return doc


def container(pod: Doc, name: str, field: str = "containers") -> Doc:
    found: Doc = next(c for c in pod["spec"][field] if c["name"] == name)
    return found
