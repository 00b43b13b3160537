"""Pod totals from a pipeline's steps (``shared/spec/stage.md``, rules H1-H7; ``docs/stages.md``, H8-H14).

``flatten`` turns the validated tree into the preorder arrays the core composes; ``wanted_jobs``
says which sized jobs the answer needs (rule H1 with ``use_recommendations``;
``sizing.fetch_many`` reads them); ``compose`` is a pure function from the tree and those answers to the reply.
CPU is in millicores and memory in MiB throughout, as the spec counts them; the reply also gives bytes.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from service import core
from service.errors import InvalidInput
from service.keys import ScopeKey
from service.quantity import QuantityError, format_cpu, format_memory
from service.sizing.answer import Answer, Container
from service.stages.schemas import (
    STAGE_EXPRESSION,
    STAGE_MAX_DEPTH,
    STAGE_MAX_ITEMS,
    StageCompute,
    StageGroup,
    StageItem,
    StageParallel,
    StageStep,
    StageStrategy,
    _stage_cpu,
    _stage_memory,
)

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


@dataclass(frozen=True)
class Flat:
    """One item of the stage in preorder; a looped item is a LOOP followed by its copies (H8)."""

    path: str
    kind: int
    count: int
    item: StageStep | StageParallel | StageGroup
    copy: str | None = None  # which copy of the enclosing loops, outermost first ("1/0_2")
    concurrency: int = 0  # a LOOP: its maxConcurrency
    text: tuple[Any, Any] = (None, None)  # a copy's cpu/memory as written, its expressions resolved

    @property
    def label(self) -> str:
        return self.item.name or self.path


def _too_many() -> InvalidInput:
    return InvalidInput(
        f"the stage has more than {STAGE_MAX_ITEMS} items",
        errors=[{"field": "body/stage", "message": f"more than {STAGE_MAX_ITEMS} items"}],
    )


def _scalar(v: Any) -> str:
    """A matrix or repeat value as Harness reads it: a string (YAML scalars are strings there)."""
    return v if isinstance(v, str) else json.dumps(v)


def _copies(strategy: StageStrategy, path: str) -> tuple[list[tuple[str, dict[str, str]]], int]:
    """Rule H8: the copies of a looped item (a postfix and the values its expressions see) and its
    maxConcurrency. ``matrix``: every combination of the axes in order, less those an ``exclude``
    entry matches (entries are read in order; one naming a key the matrix lacks ends the reading,
    as MatrixConfigServiceHelper.shouldExclude does), maxConcurrency by default all of them;
    ``parallelism: n`` and ``repeat``: n copies, parallelism with no maxConcurrency of its own."""
    where = f"body{path}/strategy"
    if strategy.parallelism is not None:
        return [(str(i), {}) for i in range(strategy.parallelism)], strategy.parallelism
    if strategy.repeat is not None:
        r = strategy.repeat
        items = [_scalar(x) for x in r.items] if r.items is not None else [None] * (r.times or 0)
        if len(items) > STAGE_MAX_ITEMS:
            raise _too_many()
        copies = [(str(i), {} if x is None else {"repeat.item": x}) for i, x in enumerate(items)]
        return copies, r.maxConcurrency or len(copies)
    matrix = strategy.matrix
    assert matrix is not None
    axes = {k: [_scalar(x) for x in v] for k, v in matrix.items() if k not in ("exclude", "maxConcurrency", "nodeName")}
    if math.prod(len(v) for v in axes.values()) > STAGE_MAX_ITEMS:
        raise _too_many()
    exclude = [{k: _scalar(x) for k, x in e.items()} for e in matrix.get("exclude", [])]
    copies = []
    for index in itertools.product(*(range(len(v)) for v in axes.values())):
        combo = {k: axes[k][i] for k, i in zip(axes, index, strict=True)}
        if not _excluded(combo, exclude):
            copies.append(("_".join(map(str, index)), {f"matrix.{k}": v for k, v in combo.items()}))
    if not copies:
        raise InvalidInput(
            "a matrix excludes every combination",
            errors=[{"field": where + "/matrix/exclude", "message": "every combination is excluded"}],
        )
    return copies, matrix.get("maxConcurrency") or len(copies)


def _excluded(combo: dict[str, str], exclude: list[dict[str, str]]) -> bool:
    for entry in exclude:
        if any(k not in combo for k in entry):
            return False
        if all(combo[k] == v for k, v in entry.items()):
            return True
    return False


def _resolve_text(value: Any, env: list[dict[str, str]], field: str) -> Any:
    """A copy's ``cpu``/``memory``: an expression takes the innermost loop's value for it (H8)."""
    if not (isinstance(value, str) and STAGE_EXPRESSION.fullmatch(value)):
        return value
    key = value[2:-1]
    for values in env:
        if key in values:
            return values[key]
    raise InvalidInput(
        f"{value} has no value here",
        errors=[{"field": field, "message": f"no enclosing loop gives {value}"}],
    )


def flatten(stage: list[StageItem]) -> list[Flat]:
    """The items in preorder, each with its JSON pointer, looped items expanded into copies (H8);
    too deep or too many items is a 422."""
    out: list[Flat] = []
    Todo = tuple[str, int, StageStep | StageParallel | StageGroup, list[dict[str, str]], str | None, bool]
    todo: list[Todo] = [(f"/stage/{i}", 1, item, [], None, False) for i, item in reversed(list(enumerate(stage)))]
    while todo:
        path, depth, item, env, copy, expanded = todo.pop()
        if depth > STAGE_MAX_DEPTH:
            raise InvalidInput(
                f"the stage nests deeper than {STAGE_MAX_DEPTH} levels",
                errors=[{"field": "body" + path, "message": f"nested deeper than {STAGE_MAX_DEPTH} levels"}],
            )
        strategy = None if isinstance(item, StageParallel) or expanded else item.strategy
        if strategy is not None:
            copies, concurrency = _copies(strategy, path)
            out.append(Flat(path, core.LOOP, len(copies), item, copy, concurrency))
            for postfix, values in reversed(copies):
                label = postfix if copy is None else f"{copy}/{postfix}"
                todo.append((path, depth, item, [values, *env], label, True))
        elif isinstance(item, StageStep):
            kind = core.NON_CI if item.non_ci else core.BACKGROUND if item.background else core.STEP
            text = tuple(
                _resolve_text(item._raw.get(f), env, f"body{path}/{f}") if env else item._raw.get(f)
                for f in ("cpu", "memory")
            )
            out.append(Flat(path, kind, 0, item, copy, text=(text[0], text[1])))
        else:
            children, key = (item.parallel, "parallel") if isinstance(item, StageParallel) else (item.group, "group")
            kind = core.PARALLEL if isinstance(item, StageParallel) else core.GROUP
            out.append(Flat(path, kind, len(children), item, copy))
            todo.extend(
                (f"{path}/{key}/{i}", depth + 1, c, env, copy, False) for i, c in reversed(list(enumerate(children)))
            )
        if len(out) > STAGE_MAX_ITEMS:
            raise _too_many()
    return out


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


_HARNESS_CPU = re.compile(r"\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?(m?)")
_HARNESS_MEMORY = re.compile(r"((?:[0-9]*\.)?[0-9]+)([GM]i?)")
_HARNESS_UNITS = {"Mi": 2.0**20, "Gi": 2.0**30, "M": 10.0**6, "G": 10.0**9}


def _harness_cpu(value: Any) -> int:
    """Rule H14: QuantityUtils.getCpuQuantityValueInUnit: the number before an optional ``m`` as a
    double, times 1000 for cores, then Java's ``Math.round`` (nearest, halves up)."""
    _stage_cpu(value)  # a Kubernetes quantity within bounds, else its message
    text = value if isinstance(value, str) else repr(value)
    m = _HARNESS_CPU.fullmatch(text)
    if m is None:
        raise ValueError("Harness reads CPU as a number of cores or of millicores (m)")
    numeric = text[:-1] if m[1] else text
    x = float(numeric) * ((10.0**-3 if m[1] else 10.0**0) / 10.0**-3)
    return math.floor(Fraction(x) + Fraction(1, 2))


def _harness_memory(value: Any) -> int:
    """Rule H14: QuantityUtils.getStorageQuantityValueInUnit: a number with M, G, Mi or Gi as a
    double, scaled to MiB and rounded up."""
    _stage_memory(value)
    text = value if isinstance(value, str) else repr(value)
    m = _HARNESS_MEMORY.fullmatch(text)
    if m is None:
        raise ValueError("Harness reads memory as a number with M, G, Mi or Gi (e.g. 500Mi)")
    return math.ceil(float(m[1]) * (_HARNESS_UNITS[m[2]] / 2.0**20))


def _declared(flat: Flat, harness: bool, errors: list[dict[str, str]]) -> tuple[int | None, int | None]:
    """A step's own ``cpu``/``memory``: as the model parsed them (H7), or with the harness generation
    read from the text as written (a copy's expressions resolved) by the source's rules (H14)."""
    step = flat.item
    assert isinstance(step, StageStep)
    if not harness:
        return step.cpu, step.memory
    out: list[int | None] = []
    for d, name in enumerate(("cpu", "memory")):
        text = flat.text[d]
        if text is None:
            out.append(None)
            continue
        try:
            out.append(_harness_cpu(text) if d == 0 else _harness_memory(text))
        except (ValueError, QuantityError) as exc:
            errors.append({"field": f"body{flat.path}/{name}", "message": f"{text!r}: {exc}"})
            out.append(0)
    return out[0], out[1]


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


def _harness_only(items: list[Flat]) -> None:
    """Loops, non-CI steps and per-copy expressions are the source's (H8-H11): the doc generation has none."""
    errors = []
    for f in items:
        if f.kind == core.LOOP and f.copy is None:
            errors.append({"field": f"body{f.path}/strategy", "message": "a strategy needs generation harness"})
        elif f.kind == core.NON_CI:
            errors.append({"field": f"body{f.path}/non_ci", "message": "a non-CI step needs generation harness"})
        elif isinstance(f.item, StageStep) and f.kind != core.LOOP:
            for name, text in f.item._raw.items():
                if isinstance(text, str) and STAGE_EXPRESSION.fullmatch(text):
                    errors.append({"field": f"body{f.path}/{name}", "message": f"{text} needs generation harness"})
    errors = list({e["field"]: e for e in errors}.values())
    if errors:
        raise InvalidInput(
            "looping strategies, non-CI steps and matrix expressions are Harness's: set options.generation to harness",
            errors=errors,
        )


def _nested_parallel(items: list[Flat]) -> None:
    """Harness has no parallel block directly inside another (its source skips one: H10)."""
    stack: list[list[int]] = []
    for i, f in enumerate(items):
        parent = stack[-1][0] if stack else -1
        if f.kind == core.PARALLEL and parent >= 0 and items[parent].kind == core.PARALLEL:
            raise InvalidInput(
                "Harness has no parallel block directly inside another",
                errors=[{"field": f"body{f.path}", "message": "a parallel block directly inside a parallel block"}],
            )
        if stack:
            stack[-1][1] -= 1
        if f.count:
            stack.append([i, f.count])
        while stack and stack[-1][1] == 0:
            stack.pop()


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
        _nested_parallel(items)
    else:
        _harness_only(items)
    errors: list[dict[str, str]] = []
    declared = {i: _declared(f, harness, errors) for i, f in enumerate(items) if f.kind in (core.STEP, core.BACKGROUND)}
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


def render(answer: dict[str, Any]) -> str:
    """The answer as the ``ci-sizer stage`` table."""
    from service.console import table

    rows = []
    for s in answer["steps"]:
        src = s["source"]
        where = src["cpu"] if src["cpu"] == src["memory"] else f"cpu {src['cpu']}, memory {src['memory']}"
        if src.get("note"):
            where += f" ({src['note']})"
        rows.append(
            [
                s["name"] if s.get("iteration") is None else f"{s['name']} [{s['iteration']}]",
                "background" if s["background"] else "step",
                s["own"]["cpu"],
                s["own"]["memory"],
                s["cpu"]["request"],
                s["cpu"]["limit"],
                s["memory"]["request"],
                s["memory"]["limit"],
                where,
            ]
        )
    for n in answer.get("non_ci_steps", []):
        name = n["name"] if n.get("iteration") is None else f"{n['name']} [{n['iteration']}]"
        rows.append([name, "non-CI", "", "", "", "", "", "", "no container"])
    for c in answer.get("init_containers", []):
        rows.append(
            [
                c["name"],
                "init",
                "",
                "",
                c["cpu"]["request"],
                c["cpu"]["limit"],
                c["memory"]["request"],
                c["memory"]["limit"],
                "",
            ]
        )
    sc = answer["stage_container"]
    rows.append(
        [
            "stage container",
            "add-on",
            "",
            "",
            sc["cpu"]["request"],
            sc["cpu"]["limit"],
            sc["memory"]["request"],
            sc["memory"]["limit"],
            "",
        ]
    )
    headers = ["item", "kind", "own cpu", "own memory", "cpu req", "cpu limit", "mem req", "mem limit", "source"]
    out = [table(headers, rows, right=(2, 3, 4, 5, 6, 7))]
    pod, bg = answer["pod"], answer["total_with_background"]
    out.append("")
    out.append(f"stage with background: {bg['cpu']} CPU, {bg['memory']} memory")
    out.append(f"pod request (scheduling): {pod['request']['cpu']} CPU, {pod['request']['memory']} memory")
    out.append(f"pod limits (sum): {pod['limit']['cpu']} CPU, {pod['limit']['memory']} memory")
    for loop in answer.get("loops", []):
        where = "" if loop.get("iteration") is None else f" [{loop['iteration']}]"
        out.append(
            f"loop {loop['name']}{where}: {loop['copies']} copies, {loop['max_concurrency']} at once: "
            f"{loop['request']['cpu']} CPU, {loop['request']['memory']} memory"
        )
    out.append(f"CPU: {answer['decided_by']['cpu']['explanation']}")
    out.append(f"memory: {answer['decided_by']['memory']['explanation']}")
    if answer["degraded"]:
        out.append("degraded: the sizer's database failed or was slow; some steps took the defaults")
    return "\n".join(out)
