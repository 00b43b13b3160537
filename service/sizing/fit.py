"""What an answer may write into a pod that keeps limits of its own: the one rule that the formats
(``service/sizing/formats.py``) and any later writer of pods (an admission webhook) follow.

A runner's own template may carry a CPU limit that the runner keeps beside what an answer writes:
Argo (``ApplyPodSpecPatch``), agent-stack-k8s (``PatchPodSpec``) and Tekton (``MergeStepsWithSpecs``)
merge ``limits`` key by key, and Jenkins' containerTemplate and GitLab's config.toml win over the
answer's. A request above that limit is a pod the API server rejects ("must be less than or equal to
cpu limit"): ``fit_cpu`` never writes one.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.sizing.answer import Cpu


@dataclass(frozen=True)
class TemplateCpu:
    """``template_cpu_limit=``: the CPU limit (millicores) that the runner's own template gives the pod's
    containers, which the runner may keep beside what an answer writes. ``every`` applies to each
    container written; ``by_pod`` names containers of the runner's pod (it wins over ``every``)."""

    every: int | None = None
    by_pod: tuple[tuple[str, int], ...] = ()

    def for_pod(self, pod: str) -> int | None:
        for name, millicores in self.by_pod:
            if name == pod:
                return millicores
        return self.every


def fit_cpu(cpu: Cpu, kept_limit: int | None) -> tuple[int, int | None]:
    """The CPU request and the CPU limit to write (None: none), in millicores, for a container whose
    pod may keep a CPU limit of its own (``kept_limit``: the runner's template, a LimitRange default,
    a pod an admission webhook is given) beside what is written.

    The one rule every format (and any later writer of pods) follows: a CPU limit in the pod is never
    left below the new request. The request is at most ``kept_limit``, since a container cannot use
    more CPU than its limit and a request above it only makes the API server reject the pod ("must be
    less than or equal to cpu limit"), and at most the limit written. The limit is written only where
    the answer enforces it (rule S17); then it replaces the template's where the runner merges key by
    key, and the request is still within the template's where the runner keeps that one instead
    (Jenkins' containerTemplate, GitLab without ``cpu_limit_overwrite_max_allowed``)."""
    request = cpu.request_millicores
    if kept_limit is not None:
        request = min(request, kept_limit)
    if cpu.enforced:
        return min(request, cpu.limit_millicores), cpu.limit_millicores
    return request, None


#: issue 40: a container the answer lets grow (``grow`` not null) states that resizing its CPU or memory
#: in place needs no restart (Kubernetes' default, stated so a pod template cannot have turned it off).
#: Written where the runner's merge keeps the field: ``k8s``, ``argo`` (ApplyPodSpecPatch), ``buildkite``
#: (PatchPodSpec: strategic merges of the PodSpec, whose resizePolicy is an atomic list), ``jenkins``
#: (PodTemplateUtils.combine builds the container from the yaml's), ``arc`` (mergeContainerWithOptions
#: copies every field); not ``tekton`` (stepSpecs carry computeResources only) nor ``gitlab`` (variables).
RESIZE_POLICY = (("cpu", "NotRequired"), ("memory", "NotRequired"))


def resize_policy() -> list[dict[str, str]]:
    """A container's ``resizePolicy`` for growth: a new list each time (callers may mutate theirs)."""
    return [{"resourceName": name, "restartPolicy": policy} for name, policy in RESIZE_POLICY]
