"""Pod totals from a pipeline's steps (``shared/spec/stage.md``, rules H1-H7; ``docs/stages.md``, H8-H14).

``flatten`` (``stages.flatten``) turns the validated tree into the preorder arrays the core composes;
``wanted_jobs`` says which sized jobs the answer needs (rule H1 with ``use_recommendations``;
``sizing.fetch_many`` reads them); ``compose`` is a pure function from the tree and those answers to the reply.
CPU is in millicores and memory in MiB throughout, as the spec counts them; the reply also gives bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from service import core
from service.errors import InvalidInput
from service.keys import ScopeKey
from service.quantity import format_cpu, format_memory
from service.sizing.answer import Answer, Container
from service.stages.flatten import Flat
from service.stages.harness import declared_limits, harness_only, no_nested_parallel
from service.stages.schemas import StageCompute, StageGroup, StageStep

_MIB = core.MIB
DEFAULT_LIMITS = (
    400,
    500,
)  # rule H1: millicores, MiB (harness-core ci-manager-config.yml: defaultCPULimit, defaultMemoryLimit)
INCREASED_LIMITS = (1000, 3000)  # rule H1, increase_default_resources
ADDON = (100, 100)  # rule H3
STEP_REQUEST = (10, 10)  # rule H6
SETUP_ADDON = (100, 100)  # rule H13: the setup-addon init container, request = limit
EXTRA_SETUP_ADDON = (300, 400)  # rule H13 with extra_addon_resource (CI_EXTRA_ADDON_RESOURCE)


def _key(step: StageStep) -> ScopeKey:
    assert step.job is not None
    return ScopeKey(step.job.org, step.job.repo, step.job.workflow, step.job.job)


def wanted_jobs(body: StageCompute, items: Iterable[Flat]) -> list[ScopeKey]:
    """The jobs whose recommendations rule H1 needs: referenced by a step missing a limit."""
    if not body.options.use_recommendations:
        return []
    keys: dict[ScopeKey, None] = {}
    for f in items:
        s = f.item
        if isinstance(s, StageStep) and s.job is not None and (s.cpu is None or s.memory is None):
            keys[_key(s)] = None
    return list(keys)


@dataclass
class _Limits:
    cpu: int
    memory: int
    source: dict[str, Any]


def _container_of(answer: Answer, wanted: str | None) -> Container | str:
    """The referenced container of a job's answer, or the message of a 422."""
    containers = answer.containers
    names = ", ".join(c.name for c in containers)
    job = "/".join((answer.org, answer.repo, answer.workflow, answer.job))
    if wanted is None:
        if len(containers) == 1:
            return containers[0]
        return f"job {job} has containers {names}: name one in job.container"
    for c in containers:
        if c.name == wanted:
            return c
    return f"job {job} has no container {wanted!r} (it has {names})"


def _resolve(
    flat: Flat,
    body: StageCompute,
    answers: Mapping[ScopeKey, Answer],
    errors: list[dict[str, str]],
    declared: tuple[int | None, int | None],
) -> _Limits:
    """Rule H1 (and H4's default for background steps), field by field."""
    step = flat.item
    assert isinstance(step, StageStep)
    opts = body.options
    default = INCREASED_LIMITS if opts.increase_default_resources and not step.background else DEFAULT_LIMITS
    source: dict[str, Any] = {"cpu": "declared", "memory": "declared"}
    recommended: tuple[int, int] | None = None
    if opts.use_recommendations and step.job is not None and None in declared:
        answer = answers.get(_key(step))
        if answer is None:
            source["note"] = "the sizer did not answer in time: defaults"
        else:
            phase = answer.meta.phase
            source["phase"] = phase
            if phase == "unknown":
                source["note"] = "the job has no clean runs yet: defaults"
            else:
                picked = _container_of(answer, step.job.container)
                if isinstance(picked, str):
                    errors.append({"field": f"body{flat.path}/job/container", "message": picked})
                else:
                    recommended = (picked.cpu.limit_millicores, -(-picked.memory.limit_bytes // _MIB))
                    source["override_scope"] = answer.meta.override_scope
    values = []
    for i, name, own in ((0, "cpu", declared[0]), (1, "memory", declared[1])):
        if own is not None:
            values.append(own)
        elif recommended is not None:
            values.append(recommended[i])
            source[name] = "recommendation"
        else:
            values.append(default[i])
            source[name] = "default"
    return _Limits(values[0], values[1], source)


def _cpu(request: int, limit: int) -> dict[str, Any]:
    return {
        "request": format_cpu(request),
        "limit": format_cpu(limit),
        "request_millicores": request,
        "limit_millicores": limit,
    }


def _memory(request_mib: int, limit_mib: int) -> dict[str, Any]:
    return {
        "request": format_memory(request_mib * _MIB),
        "limit": format_memory(limit_mib * _MIB),
        "request_bytes": request_mib * _MIB,
        "limit_bytes": limit_mib * _MIB,
    }


def _total(cpu: int, memory_mib: int) -> dict[str, Any]:
    return {
        "cpu": format_cpu(cpu),
        "cpu_millicores": cpu,
        "memory": format_memory(memory_mib * _MIB),
        "memory_bytes": memory_mib * _MIB,
    }


def _describe(items: list[Flat], i: int) -> str:
    f = items[i]
    if f.kind == core.STEP:
        return f"step {f.label!r}"
    if f.kind == core.LOOP:
        what = "looped group" if isinstance(f.item, StageGroup) else "looped step"
        return f"{what} {f.label!r} (the top {min(f.concurrency, f.count)} of its {f.count} copies)"
    what = "parallel block" if f.kind == core.PARALLEL else "group"
    how = "the sum of" if f.kind == core.PARALLEL else "the largest of"
    return f"{what} {f.label!r} ({how} its {f.count} items)"


def _decider(
    items: list[Flat], requests: list[int], stage: int, container: int, conservative: bool, fmt: Any, what: str
) -> dict[str, Any]:
    """Which top-level item set the stage value (the first of equals), in a sentence."""
    top: list[int] = []
    i = 0
    while i < len(items):  # top-level items: skip each subtree
        top.append(i)
        j, pending = i + 1, items[i].count
        while pending:
            pending += items[j].count - 1
            j += 1
        i = j
    best = max(top, key=lambda t: (requests[t], -t))
    addon = fmt(container - stage) if not conservative else fmt(container)
    if requests[best] == 0:
        return {
            "path": None,
            "name": None,
            "explanation": f"only background steps: the stage container is the add-on alone ({addon} {what})",
        }
    f = items[best]
    desc = _describe(items, best)
    if conservative:
        text = (
            f"{fmt(container)} {what}: a flat add-on (conservative_addon_limits); the steps' largest need, "
            f"{fmt(stage)} from {desc}, is handed back to the steps"
        )
    else:
        text = f"{fmt(container)} {what} = {fmt(stage)} from {desc} + {addon} add-on"
    return {"path": f.path, "name": f.item.name, "explanation": text}


def compose(
    body: StageCompute,
    items: list[Flat],
    answers: Mapping[ScopeKey, Answer],
    *,
    degraded: bool = False,
    composer: Callable[..., tuple[list[int], list[int], int, int, int, int, int]] | None = None,
) -> dict[str, Any]:
    """The reply of ``POST /api/v1/stages:compute`` (rules H1-H14). ``composer`` is the core's
    ``compose_stage`` of a given backend (tests run both); by default the one ``core`` picked."""
    opts = body.options
    harness = opts.generation == "harness"
    if harness:
        no_nested_parallel(items)
    else:
        harness_only(items)
    errors: list[dict[str, str]] = []
    declared = {
        i: declared_limits(f, harness, errors) for i, f in enumerate(items) if f.kind in (core.STEP, core.BACKGROUND)
    }
    if errors:
        raise InvalidInput("a quantity Harness cannot read: " + errors[0]["message"], errors=errors)
    resolved = {i: _resolve(items[i], body, answers, errors, own) for i, own in declared.items()}
    if errors:
        raise InvalidInput("a job reference does not name one container: " + errors[0]["message"], errors=errors)
    kinds = [f.kind for f in items]
    counts = [f.count for f in items]
    conservative = opts.conservative_addon_limits
    init = EXTRA_SETUP_ADDON if opts.extra_addon_resource else SETUP_ADDON
    per: dict[str, tuple[list[int], list[int], int, int, int, int, int]] = {}
    for d, name in enumerate(("cpu", "memory")):
        values = [
            f.concurrency
            if f.kind == core.LOOP
            else 0
            if i not in resolved
            else (resolved[i].cpu, resolved[i].memory)[d]
            for i, f in enumerate(items)
        ]
        per[name] = (composer or core.compose_stage)(
            kinds,
            counts,
            values,
            ADDON[d],
            STEP_REQUEST[d],
            conservative,
            init=init[d],
            harness=harness,
            no_extra=opts.disable_resource_optimization,
        )
    c_req, c_lim, c_stage, c_container, c_bg, c_pod_req, c_pod_lim = per["cpu"]
    m_req, m_lim, m_stage, m_container, m_bg, m_pod_req, m_pod_lim = per["memory"]
    steps = []
    for i, limits in resolved.items():
        f = items[i]
        bg = f.kind == core.BACKGROUND
        # H4/H6: a background container requests its limit; a step container requests 10m/10Mi
        cpu_request, mem_request = (c_lim[i], m_lim[i]) if bg else STEP_REQUEST
        steps.append(
            {
                "name": f.label,
                "path": f.path,
                "background": bg,
                "own": _total(limits.cpu, limits.memory),
                "cpu": _cpu(cpu_request, c_lim[i]),
                "memory": _memory(mem_request, m_lim[i]),
                "source": limits.source,
                "iteration": f.copy,
            }
        )
    return {
        "stage_container": {
            "cpu": _cpu(c_container, c_container),
            "memory": _memory(m_container, m_container),
        },
        "total_with_background": _total(c_bg, m_bg),
        "pod": {"request": _total(c_pod_req, m_pod_req), "limit": _total(c_pod_lim, m_pod_lim)},
        "steps": steps,
        "non_ci_steps": [
            {"name": f.label, "path": f.path, "iteration": f.copy} for f in items if f.kind == core.NON_CI
        ],
        "loops": [
            {
                "name": f.label,
                "path": f.path,
                "iteration": f.copy,
                "copies": f.count,
                "max_concurrency": f.concurrency,
                "request": _total(c_req[i], m_req[i]),
            }
            for i, f in enumerate(items)
            if f.kind == core.LOOP
        ],
        "init_containers": [
            {"name": "setup-addon", "cpu": _cpu(init[0], init[0]), "memory": _memory(init[1], init[1])}
        ],
        "decided_by": {
            "cpu": _decider(items, c_req, c_stage, c_container, conservative, lambda v: f"{v}m", "CPU"),
            "memory": _decider(
                items, m_req, m_stage, m_container, conservative, lambda v: format_memory(v * _MIB), "memory"
            ),
        },
        "options": opts.model_dump(),
        "degraded": degraded,
    }
