"""What the ``harness`` generation reads differently from the doc one (``docs/stages.md``, H8-H14).

A step's ``cpu``/``memory`` as Harness's QuantityUtils reads the text (H14), and the shapes each
generation refuses: loops, non-CI steps and expressions outside ``harness`` (H8-H11), a parallel
block directly inside another within it (H10).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from service import core
from service.errors import InvalidInput
from service.quantity import QuantityError
from service.stages.flatten import Flat
from service.stages.schemas import STAGE_EXPRESSION, StageStep, _stage_cpu, _stage_memory

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


def declared_limits(flat: Flat, harness: bool, errors: list[dict[str, str]]) -> tuple[int | None, int | None]:
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


def harness_only(items: list[Flat]) -> None:
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


def no_nested_parallel(items: list[Flat]) -> None:
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
