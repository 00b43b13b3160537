"""A sizing answer in each CI system's own shape (``GET /api/v1/sizing/...?format=``).

Every strategic-merge format (``k8s``, ``jenkins``, ``argo``, ``arc``, ``buildkite``, ``tekton``,
``tekton-v1beta1``) and ``gitlab`` name containers of the pod the runner builds, and nothing else:
those runners merge containers by name, and a name the pod lacks becomes a new container without an
image, which the API server rejects (or, for Tekton, a TaskRun the controller rejects). So:

- with no ``containers=`` mapping, an answer names only the runner's main container (``MAIN``),
  sized from the job's main recorded container (``build``, else the only one, else the first);
- ``containers=POD[=RECORDED],...`` names exactly the pod containers listed, each sized from the
  recorded container of that name (``RECORDED``, by default ``POD`` itself; for the main pod name,
  the main recorded container). A listed container with no recorded counterpart is left out (the
  runner's defaults apply), except for a never-seen job, whose unknown-phase defaults size what the
  main recorded container would (the main pod name, and any container sized from ``build``). Names are those of the containers in the runner's pod:

  - ``arc``: ``job`` and the service containers, named by runner-container-hooks after their image
    (``postgres`` for ``postgres:16``); the hook template addresses them as ``$job``, ``$postgres``;
  - ``tekton``: ``step-NAME`` and ``sidecar-NAME`` (the pod's names for a Task's steps and sidecars):
    steps go to ``stepSpecs``, sidecars to ``sidecarSpecs`` (``stepOverrides``/``sidecarOverrides``
    with ``resources`` for ``tekton-v1beta1``);
  - ``gitlab``: ``build`` sets ``KUBERNETES_*``, ``helper`` ``KUBERNETES_HELPER_*``, any other name
    (a service alias, or ``svc-N``) ``KUBERNETES_SERVICE_*``: the largest of them, since the job's
    variables have one setting for every service.

A never-seen job (one container named ``*`` in the JSON answer, rule S6) gets the main container at
the unknown-phase defaults: ``*`` is never a container name in a format. ``dotenv`` is not merged by
anyone: it keeps one group of variables per recorded container (``*`` written as ``BUILD``).

A degraded answer (``meta.degraded``) says so in every format: the ``CI-Sizer-Degraded`` header (set
by the route), plus a first-line comment in the YAML formats and a ``CI_SIZER_DEGRADED`` variable in
``gitlab`` and ``dotenv``. ``argo`` and ``arc`` are JSON, which has no comments: the header only.

A CPU limit is only written where the answer enforces it (``cpu.enforced``, rule S17). A runner's own
template may keep a CPU limit beside what is written: ``template_cpu_limit=`` says what it is, and
``fit_cpu`` (``sizing/fit.py``, which says which runners keep it) holds every CPU request written at or
below it, so that a merged pod never asks for more CPU than its limit.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any, Protocol

import orjson
import yaml

from service.quantity import QuantityError, format_cpu, parse_cpu_millicores
from service.sizing.answer import Answer, Container, Cpu, Memory, Observed, Oom, Sources
from service.sizing.fit import TemplateCpu, fit_cpu, resize_policy

YAML = "application/yaml"
TEXT = "text/plain; charset=utf-8"
DEGRADED_HEADER = "CI-Sizer-Degraded"
DEGRADED_COMMENT = (
    "# ci-sizer: degraded answer (the sizer could not read its database in time): "
    "the last answer it served for this job, else the defaults for a job it has never seen\n"
)

#: the runner's main container, per format, as the runner names it in the pod
MAIN: dict[str, str] = {
    "k8s": "build",
    "jenkins": "jnlp",  # kubernetes-plugin: KubernetesCloud.JNLP_NAME, the agent container every pod has
    "argo": "main",  # argo-workflows: common.MainContainerName
    "arc": "job",  # runner-container-hooks: JOB_CONTAINER_NAME, addressed as $job in the template
    "buildkite": "container-0",  # agent-stack-k8s: DefaultCommandContainerName
    "tekton": "step-build",  # a Task step named build
    "tekton-v1beta1": "step-build",
    "gitlab": "build",  # gitlab-runner: buildContainerName
}

Mapping = tuple[tuple[str, str | None], ...]
"""``containers=``: (pod container name, recorded container name or None for the default)."""

MAX_MAPPED = 64
MAX_MAPPING_LENGTH = 4096
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS-1123 label, as the API server wants
UNSEEN = "*"


class MappingError(ValueError):
    """A ``containers=`` value that cannot be read; the message says why."""


def _items(value: str, output: str, parameter: str) -> list[str] | None:
    """The comma-separated items of a pod-format query parameter; ``None`` when it is empty."""
    if value == "":
        return None
    if len(value) > MAX_MAPPING_LENGTH:
        raise MappingError(f"at most {MAX_MAPPING_LENGTH} characters")
    if output not in MAIN:
        raise MappingError(f"{parameter}= applies to the formats {', '.join(MAIN)}, not {output}")
    return value.split(",")


def parse_containers(value: str, output: str) -> Mapping | None:
    """Read ``containers=POD[=RECORDED],...`` for the format ``output``; ``None`` when empty."""
    given = _items(value, output, "containers")
    if given is None:
        return None
    items: list[tuple[str, str | None]] = []
    seen: set[str] = set()
    for item in given:
        pod, sep, recorded = item.partition("=")
        if not _POD_NAME.fullmatch(pod):
            raise MappingError(f"{pod!r} is not a container name (lower-case letters, digits and '-', at most 63)")
        if sep and not recorded:
            raise MappingError(f"{item!r}: the recorded container after '=' is empty")
        if output.startswith("tekton") and not pod.startswith(("step-", "sidecar-")):
            raise MappingError(f"{pod!r}: a Tekton pod container is step-NAME or sidecar-NAME")
        if pod in seen:
            raise MappingError(f"{pod!r} is named twice")
        seen.add(pod)
        items.append((pod, recorded if sep else None))
    if len(items) > MAX_MAPPED:
        raise MappingError(f"at most {MAX_MAPPED} containers")
    return tuple(items)


def parse_template_cpu_limit(value: str, output: str) -> TemplateCpu | None:
    """Read ``template_cpu_limit=QUANTITY`` (every container written) or ``POD=QUANTITY,...`` (the pod's
    containers by name; a bare quantity among them is the default for the others); ``None`` when
    empty. A name the answer does not write is allowed and changes nothing (a recipe may pass every
    limit its template has)."""
    given = _items(value, output, "template_cpu_limit")
    if given is None:
        return None
    every: int | None = None
    by_pod: list[tuple[str, int]] = []
    for item in given:
        pod, sep, quantity = item.rpartition("=")
        if sep and not _POD_NAME.fullmatch(pod):
            raise MappingError(f"{pod!r} is not a container name (lower-case letters, digits and '-', at most 63)")
        try:
            millicores = parse_cpu_millicores(quantity)
        except QuantityError as exc:
            raise MappingError(f"{item!r}: {exc}") from None
        if millicores <= 0:
            raise MappingError(f"{item!r}: a CPU limit must be positive")
        if not sep:
            if every is not None:
                raise MappingError("more than one CPU limit without a container name")
            every = millicores
        elif any(name == pod for name, _ in by_pod):
            raise MappingError(f"{pod!r} is named twice")
        else:
            by_pod.append((pod, millicores))
    if len(by_pod) > MAX_MAPPED:
        raise MappingError(f"at most {MAX_MAPPED} containers")
    return TemplateCpu(every, tuple(by_pod))


def resources(c: Container, kept_cpu_limit: int | None = None) -> dict[str, dict[str, str]]:
    """A Kubernetes ``resources`` block for one container of the answer, for a pod that may keep a CPU
    limit of ``kept_cpu_limit`` millicores of its own (``fit_cpu``)."""
    request, limit = fit_cpu(c.cpu, kept_cpu_limit)
    limits = {"memory": c.memory.limit}
    if limit is not None:
        limits = {"cpu": c.cpu.limit if limit == c.cpu.limit_millicores else format_cpu(limit), **limits}
    cpu_request = c.cpu.request if request == c.cpu.request_millicores else format_cpu(request)
    return {"requests": {"cpu": cpu_request, "memory": c.memory.request}, "limits": limits}


def main_container(containers: list[Container]) -> Container:
    """The job's main recorded container: ``build``, else the only one, else the first."""
    for c in containers:
        if c.name == "build":
            return c
    return containers[0]


def _default_recorded(output: str, pod: str) -> str:
    if output.startswith("tekton"):
        return pod.partition("-")[2]  # step-build -> build, sidecar-postgres -> postgres
    return pod


def select(answer: Answer, output: str, mapping: Mapping | None) -> list[tuple[str, Container]]:
    """The pod containers to write, each with the recorded container of the answer that sizes it."""
    containers = answer.containers
    by_name = {c.name: c for c in containers}
    main_pod = MAIN[output]
    chosen: list[tuple[str, Container]] = []
    for pod, recorded in mapping if mapping is not None else ((main_pod, None),):
        if recorded is None and pod == main_pod:
            c: Container | None = main_container(containers)
        else:
            source = recorded if recorded is not None else _default_recorded(output, pod)
            c = by_name.get(source)
            if c is None and UNSEEN in by_name and (pod == main_pod or source == "build"):
                c = by_name[UNSEEN]  # never seen: the main container at the unknown-phase defaults
        if c is not None:
            chosen.append((pod, c))
    return chosen


def _degraded(answer: Answer) -> bool:
    return answer.meta.degraded


def _yaml(answer: Answer, doc: Any) -> tuple[str, str]:
    text = yaml.safe_dump(doc, sort_keys=False)
    return YAML, (DEGRADED_COMMENT + text if _degraded(answer) else text)


def _named(
    chosen: Sequence[tuple[str, Container]], limits: TemplateCpu | None, prefix: str = ""
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for pod, c in chosen:
        entry: dict[str, Any] = {"name": prefix + pod, "resources": resources(c, _kept(limits, pod))}
        if c.grow is not None:
            entry["resizePolicy"] = resize_policy()
        out.append(entry)
    return out


def _kept(limits: TemplateCpu | None, pod: str) -> int | None:
    return None if limits is None else limits.for_pod(pod)


def k8s(answer: Answer, mapping: Mapping | None = None, limits: TemplateCpu | None = None) -> tuple[str, str]:
    return _yaml(answer, {"containers": _named(select(answer, "k8s", mapping), limits)})


def jenkins(answer: Answer, mapping: Mapping | None = None, limits: TemplateCpu | None = None) -> tuple[str, str]:
    """A pod for the Kubernetes plugin's ``yaml``, merged by container name with the podTemplate's
    containers (PodTemplateUtils.combine)."""
    containers = _named(select(answer, "jenkins", mapping), limits)
    return _yaml(answer, {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": containers}})


def argo(answer: Answer, mapping: Mapping | None = None, limits: TemplateCpu | None = None) -> tuple[str, str]:
    """The value of a template's ``podSpecPatch``: a string holding JSON, served as text so that
    ``application/json`` stays the spec's shape."""
    patch = {"containers": _named(select(answer, "argo", mapping), limits)}
    return TEXT, orjson.dumps(patch).decode() + "\n"


def arc(answer: Answer, mapping: Mapping | None = None, limits: TemplateCpu | None = None) -> tuple[str, str]:
    """A container hook template (ACTIONS_RUNNER_CONTAINER_HOOK_TEMPLATE), as one line of JSON: the
    hooks read it with js-yaml (JSON is YAML), and a job-started script can merge it into a template
    of the user's own with ``jq`` (in ARC's runner image). runner-container-hooks merges a ``$NAME``
    entry into the pod's container NAME and appends every other entry as a new container, so every
    entry here is ``$``-prefixed."""
    template = {"spec": {"containers": _named(select(answer, "arc", mapping), limits, "$")}}
    return TEXT, orjson.dumps(template).decode() + "\n"


def _tekton(answer: Answer, mapping: Mapping | None, limits: TemplateCpu | None, output: str) -> tuple[str, str]:
    v1 = output == "tekton"
    field = "computeResources" if v1 else "resources"
    steps: list[dict[str, Any]] = []
    sidecars: list[dict[str, Any]] = []
    for pod, c in select(answer, output, mapping):
        kind, _, name = pod.partition("-")
        (steps if kind == "step" else sidecars).append({"name": name, field: resources(c, _kept(limits, pod))})
    doc: dict[str, Any] = {("stepSpecs" if v1 else "stepOverrides"): steps}
    if sidecars:
        doc["sidecarSpecs" if v1 else "sidecarOverrides"] = sidecars
    return _yaml(answer, doc)


def tekton(answer: Answer, mapping: Mapping | None = None, limits: TemplateCpu | None = None) -> tuple[str, str]:
    """TaskRun ``spec.stepSpecs`` (and ``sidecarSpecs``), tekton.dev/v1."""
    return _tekton(answer, mapping, limits, "tekton")


def tekton_v1beta1(
    answer: Answer, mapping: Mapping | None = None, limits: TemplateCpu | None = None
) -> tuple[str, str]:
    """TaskRun ``spec.stepOverrides`` (and ``sidecarOverrides``), tekton.dev/v1beta1."""
    return _tekton(answer, mapping, limits, "tekton-v1beta1")


def buildkite(answer: Answer, mapping: Mapping | None = None, limits: TemplateCpu | None = None) -> tuple[str, str]:
    """The ``containers`` items of the kubernetes plugin's ``podSpecPatch`` (agent-stack-k8s), as a YAML
    list. They go into the step's one kubernetes plugin entry, under its ``podSpecPatch.containers``
    beside the user's own: agent-stack-k8s decodes every kubernetes entry of a step into one struct
    (``ParseJob``), so a second entry's ``containers`` would overwrite the first's, index by index."""
    return _yaml(answer, _named(select(answer, "buildkite", mapping), limits))


def _env_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()
    return cleaned or "CONTAINER"


def env_names(names: Sequence[str]) -> list[str]:
    """Each container's variable name: its name upper-cased, every run of other characters one ``_``.
    Names that would share one (``a-b`` and ``a_b``, ``Build`` and ``build``) each get the first 8 hex
    digits of their name's SHA-256 appended (``A_B_1F2E3D4C``), so no container takes another's sizes."""
    plain = [_env_name(n) for n in names]
    shared = {p for p in plain if plain.count(p) > 1}
    return [
        f"{p}_{hashlib.sha256(n.encode()).hexdigest()[:8].upper()}" if p in shared else p
        for p, n in zip(plain, names, strict=True)
    ]


def dotenv(answer: Answer, mapping: Mapping | None = None, limits: TemplateCpu | None = None) -> tuple[str, str]:
    """One group of variables per recorded container: not merged into a pod by anyone, so neither
    ``containers=`` nor ``template_cpu_limit=`` applies (the route refuses both)."""
    lines = ["CI_SIZER_DEGRADED=true"] if _degraded(answer) else []
    names = env_names(["build" if c.name == UNSEEN else c.name for c in answer.containers])
    for c, name in zip(answer.containers, names, strict=True):
        prefix = f"CI_SIZER_{name}"
        lines += [
            f"{prefix}_CPU_REQUEST={c.cpu.request}",
            f"{prefix}_CPU_LIMIT={c.cpu.limit if c.cpu.enforced else ''}",
            f"{prefix}_MEMORY_REQUEST={c.memory.request}",
            f"{prefix}_MEMORY_LIMIT={c.memory.limit}",
        ]
    return TEXT, "\n".join(lines) + "\n"


def gitlab(answer: Answer, mapping: Mapping | None = None, limits: TemplateCpu | None = None) -> tuple[str, str]:
    """``variables:`` for the Kubernetes executor's overwrites (gitlab-runner
    ``executors/kubernetes/overwrites.go``). Helper and service variables only when mapped."""
    out: dict[str, str] = {}

    def put(prefix: str, c: Container, kept: int | None) -> None:
        res = resources(c, kept)
        out[f"{prefix}CPU_REQUEST"] = res["requests"]["cpu"]
        if "cpu" in res["limits"]:
            out[f"{prefix}CPU_LIMIT"] = res["limits"]["cpu"]
        out[f"{prefix}MEMORY_REQUEST"] = res["requests"]["memory"]
        out[f"{prefix}MEMORY_LIMIT"] = res["limits"]["memory"]

    services = []
    service_limits = []
    for pod, c in select(answer, "gitlab", mapping):
        if pod == "build":
            put("KUBERNETES_", c, _kept(limits, pod))
        elif pod == "helper":
            put("KUBERNETES_HELPER_", c, _kept(limits, pod))
        else:
            services.append(c)
            kept = _kept(limits, pod)
            if kept is not None:
                service_limits.append(kept)
    if services:
        # one job-level setting for every service container: the largest of each field
        cpu_req = max(services, key=lambda c: c.cpu.request_millicores).cpu
        cpu_lim = max(services, key=lambda c: c.cpu.limit_millicores).cpu
        mem_req = max(services, key=lambda c: c.memory.request_bytes).memory
        mem_lim = max(services, key=lambda c: c.memory.limit_bytes).memory
        biggest = Container(
            name="services",
            cpu=Cpu(
                request=cpu_req.request,
                limit=cpu_lim.limit,
                request_millicores=cpu_req.request_millicores,
                limit_millicores=cpu_lim.limit_millicores,
                enforced=any(c.cpu.enforced for c in services),
                source=Sources(cpu_req.source.request, cpu_lim.source.limit),
            ),
            memory=Memory(
                request=mem_req.request,
                limit=mem_lim.limit,
                request_bytes=mem_req.request_bytes,
                limit_bytes=mem_lim.limit_bytes,
                source=Sources(mem_req.source.request, mem_lim.source.limit),
            ),
            observed=Observed(cpu_millicores=None, memory_bytes=None),
            oom=Oom(consecutive=0, backoff_factor=1, capped=False),
        )
        # the one setting applies to every service: within the lowest CPU limit a service keeps
        put("KUBERNETES_SERVICE_", biggest, min(service_limits, default=None))
    if _degraded(answer):
        out["CI_SIZER_DEGRADED"] = "true"
    return _yaml(answer, {"variables": out})


class Renderer(Protocol):
    def __call__(
        self, answer: Answer, mapping: Mapping | None = None, limits: TemplateCpu | None = None
    ) -> tuple[str, str]: ...


RENDERERS: dict[str, Renderer] = {
    "k8s": k8s,
    "gitlab": gitlab,
    "dotenv": dotenv,
    "argo": argo,
    "tekton": tekton,
    "tekton-v1beta1": tekton_v1beta1,
    "buildkite": buildkite,
    "jenkins": jenkins,
    "arc": arc,
}


def render(
    output: str, answer: Answer, mapping: Mapping | None, limits: TemplateCpu | None = None
) -> tuple[str, bytes]:
    """(content type, body) of the answer in the format ``output``."""
    media_type, text = RENDERERS[output](answer, mapping, limits)
    return media_type, text.encode()
