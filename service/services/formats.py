"""A sizing answer in each CI system's own shape (``GET /api/v1/sizing/...?format=``).

Every renderer takes the JSON answer (the spec's shape) and returns ``(media type, text)``.
Container names map per format as documented in docs/integrations/README.md:

- ``k8s``, ``jenkins``, ``tekton``, ``dotenv``: the container names as reported;
- ``argo``: the first container (or one named ``build``) is Argo's ``main``;
- ``arc``: the first container (or one named ``build``) is the hook template's ``$job``;
- ``buildkite``: containers in answer order are ``container-0``, ``container-1``, ...;
- ``gitlab``: ``build`` (or the first container) sets ``KUBERNETES_*``, ``helper`` sets
  ``KUBERNETES_HELPER_*``, containers named ``svc-*``/``service*`` set ``KUBERNETES_SERVICE_*``
  (the largest of them: GitLab has one setting for all services).

A CPU limit is only written where the answer enforces it (``cpu.enforced``, rule S17): in observe
mode the CPU limit is advice, and a limit that is written is a limit that throttles.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson
import yaml

YAML = "application/yaml"


def resources(c: dict[str, Any]) -> dict[str, dict[str, str]]:
    """A Kubernetes ``resources`` block for one container of the answer."""
    limits = {"memory": c["memory"]["limit"]}
    if c["cpu"]["enforced"]:
        limits = {"cpu": c["cpu"]["limit"], **limits}
    return {"requests": {"cpu": c["cpu"]["request"], "memory": c["memory"]["request"]}, "limits": limits}


def _main_index(containers: list[dict[str, Any]]) -> int:
    for i, c in enumerate(containers):
        if c["name"] == "build":
            return i
    return 0


def _renamed(containers: list[dict[str, Any]], main: str) -> list[dict[str, Any]]:
    m = _main_index(containers)
    return [{"name": main if i == m else c["name"], "resources": resources(c)} for i, c in enumerate(containers)]


def _yaml(doc: Any) -> tuple[str, str]:
    return YAML, yaml.safe_dump(doc, sort_keys=False)


def k8s(answer: dict[str, Any]) -> tuple[str, str]:
    return _yaml({"containers": [{"name": c["name"], "resources": resources(c)} for c in answer["containers"]]})


def jenkins(answer: dict[str, Any]) -> tuple[str, str]:
    """A pod for the Kubernetes plugin's ``yaml`` with ``yamlMergeStrategy: merge()``."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {"containers": [{"name": c["name"], "resources": resources(c)} for c in answer["containers"]]},
    }
    return _yaml(pod)


def argo(answer: dict[str, Any]) -> tuple[str, str]:
    """The value of a template's ``podSpecPatch``: a string holding JSON, served as text so that
    ``application/json`` stays the spec's shape."""
    patch = {"containers": _renamed(answer["containers"], "main")}
    return "text/plain; charset=utf-8", orjson.dumps(patch).decode() + "\n"


def arc(answer: dict[str, Any]) -> tuple[str, str]:
    """A container hook template (ACTIONS_RUNNER_CONTAINER_HOOK_TEMPLATE): ``$job`` is the job container."""
    return _yaml({"spec": {"containers": _renamed(answer["containers"], "$job")}})


def tekton(answer: dict[str, Any]) -> tuple[str, str]:
    """TaskRun ``spec.stepSpecs``: compute resources per step, steps named as the containers."""
    steps = [{"name": c["name"], "computeResources": resources(c)} for c in answer["containers"]]
    return _yaml({"stepSpecs": steps})


def buildkite(answer: dict[str, Any]) -> tuple[str, str]:
    """The kubernetes plugin's ``podSpecPatch`` (agent-stack-k8s), commands in ``container-N``."""
    containers = [{"name": f"container-{i}", "resources": resources(c)} for i, c in enumerate(answer["containers"])]
    return _yaml({"kubernetes": {"podSpecPatch": {"containers": containers}}})


def _env_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()
    return cleaned or "CONTAINER"


def dotenv(answer: dict[str, Any]) -> tuple[str, str]:
    lines = []
    for c in answer["containers"]:
        prefix = f"CI_SIZER_{_env_name(c['name'])}"
        lines += [
            f"{prefix}_CPU_REQUEST={c['cpu']['request']}",
            f"{prefix}_CPU_LIMIT={c['cpu']['limit'] if c['cpu']['enforced'] else ''}",
            f"{prefix}_MEMORY_REQUEST={c['memory']['request']}",
            f"{prefix}_MEMORY_LIMIT={c['memory']['limit']}",
        ]
    return "text/plain; charset=utf-8", "\n".join(lines) + "\n"


def _is_service(name: str) -> bool:
    return name.startswith("svc-") or name.startswith("service")


def gitlab(answer: dict[str, Any]) -> tuple[str, str]:
    """``variables:`` for the Kubernetes executor's overwrites (``KUBERNETES_*``)."""
    containers = answer["containers"]
    out: dict[str, str] = {}

    def put(prefix: str, c: dict[str, Any]) -> None:
        out[f"{prefix}CPU_REQUEST"] = c["cpu"]["request"]
        if c["cpu"]["enforced"]:
            out[f"{prefix}CPU_LIMIT"] = c["cpu"]["limit"]
        out[f"{prefix}MEMORY_REQUEST"] = c["memory"]["request"]
        out[f"{prefix}MEMORY_LIMIT"] = c["memory"]["limit"]

    others = [c for c in containers if c["name"] != "helper" and not _is_service(c["name"])]
    if others:
        put("KUBERNETES_", others[_main_index(others)])
    for c in containers:
        if c["name"] == "helper":
            put("KUBERNETES_HELPER_", c)
    services = [c for c in containers if _is_service(c["name"])]
    if services:
        # one setting for every service container: the largest of each field
        biggest = {
            "cpu": {
                "request": max(services, key=lambda c: c["cpu"]["request_millicores"])["cpu"]["request"],
                "limit": max(services, key=lambda c: c["cpu"]["limit_millicores"])["cpu"]["limit"],
                "enforced": any(c["cpu"]["enforced"] for c in services),
            },
            "memory": {
                "request": max(services, key=lambda c: c["memory"]["request_bytes"])["memory"]["request"],
                "limit": max(services, key=lambda c: c["memory"]["limit_bytes"])["memory"]["limit"],
            },
        }
        put("KUBERNETES_SERVICE_", biggest)
    return _yaml({"variables": out})


RENDERERS: dict[str, Callable[[dict[str, Any]], tuple[str, str]]] = {
    "k8s": k8s,
    "gitlab": gitlab,
    "dotenv": dotenv,
    "argo": argo,
    "tekton": tekton,
    "buildkite": buildkite,
    "jenkins": jenkins,
    "arc": arc,
}
