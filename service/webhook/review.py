"""One admission review: read the ``admission.k8s.io/v1`` ``AdmissionReview``, answer it.

The answer is always ``allowed`` (the webhook never refuses a pod); it carries a JSON patch only when
the sizer gave a confident enough answer for a job the pod could be told to run, within the deadline.
Each review ends with one result (``ci_sizer_webhook_requests_total{result}``):

- ``patched``: the job's answer, in the containers it names;
- ``unknown_identity``: no job could be told from the pod (``identity.py``);
- ``no_answer``: the sizer answered but is unsure, so the runner's own resources stay: a job it has never
  seen (``meta.phase`` ``unknown``: its defaults know less than the runner's template does), a degraded
  answer (``meta.degraded``: its database did not answer in time), or an answer naming none of the
  pod's containers;
- ``deadline``: the sizer did not answer within the webhook's deadline;
- ``error``: the sizer could not be reached or answered an error, the pod holds a quantity that does not
  parse, or the review is not one this webhook is configured for (not a pod CREATE, or a pod of the
  webhook's own namespace, which the configuration excludes).

A dry run (``request.dryRun``) gets the same answer: the one call made is a read of the sizer.
Field names follow k8s.io/api ``admission/v1/types.go``; the API server checks the response as
k8s.io/apiserver ``pkg/admission/plugin/webhook/request/admissionreview.go`` VerifyAdmissionResponse does:
``apiVersion``/``kind`` of v1, ``response.uid`` the request's, ``patchType`` with every patch.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from service.quantity import QuantityError
from service.webhook import identity as identities
from service.webhook.patch import plan
from service.webhook.sizer import Sizer, SizerError

API_VERSION = "admission.k8s.io/v1"
log = logging.getLogger("ci_sizer.webhook")


class BadReview(ValueError):
    """A body that is not an AdmissionReview request (answered 400: the API server then applies the
    configuration's failurePolicy, Ignore)."""


@dataclass(frozen=True)
class Reviewer:
    sizer: Sizer
    deadline: float
    own_namespace: str | None = None
    rules: Sequence[identities.Rule] = ()

    async def review(self, body: bytes) -> tuple[dict[str, Any], str]:
        """The response AdmissionReview and the result; ``BadReview`` for a body that is not a review."""
        request = read_request(body)
        uid = request["uid"]
        result, patch = await self.decide(request)
        response: dict[str, Any] = {"uid": uid, "allowed": True, "auditAnnotations": {"result": result}}
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
        return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}, result

    async def decide(self, request: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        kind = request.get("kind") or {}
        namespace = str(request.get("namespace") or "")
        pod = request.get("object")
        if (
            (kind.get("group"), kind.get("version"), kind.get("kind")) != ("", "v1", "Pod")
            or request.get("operation") != "CREATE"
            or request.get("subResource")
            or not isinstance(pod, dict)
        ):
            log.warning("a review the configuration should not send: %s %s", request.get("operation"), kind)
            return "error", []
        if self.own_namespace is not None and namespace == self.own_namespace:
            log.warning("a pod of the webhook's own namespace %s: left as it is", namespace)
            return "error", []
        who = identities.identify(pod, namespace, self.rules)
        if who is None:
            return "unknown_identity", []
        try:
            async with asyncio.timeout(self.deadline):
                answer = await self.sizer.answer(who.key)
        except TimeoutError:
            log.warning("the sizer did not answer within %gs (%s): no patch", self.deadline, who.rule)
            return "deadline", []
        except SizerError as exc:
            log.warning("no answer from the sizer (%s): %s", who.rule, exc)
            return "error", []
        if answer.meta.degraded or answer.meta.phase == "unknown":
            return "no_answer", []
        try:
            ops = plan(pod, answer, who)
        except QuantityError as exc:
            log.warning("the pod holds a quantity that does not parse (%s): %s", who.rule, exc)
            return "error", []
        return ("patched", ops) if ops else ("no_answer", [])


def read_request(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadReview("the body is not JSON") from None
    if not isinstance(doc, dict) or doc.get("apiVersion") != API_VERSION or doc.get("kind") != "AdmissionReview":
        raise BadReview(f"the body is not an {API_VERSION} AdmissionReview")
    request = doc.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadReview("the review has no request.uid")
    return request
