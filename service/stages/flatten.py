"""Rule H8 and the tree's bounds: the validated stage as the preorder arrays the core composes.

``flatten`` walks the tree (``shared/spec/stage.md``, ``docs/stages.md``), expands each looped item
into its copies (``matrix``, ``parallelism``, ``repeat``), resolves the copies' expressions in their
``cpu``/``memory``, and refuses a tree too deep or with too many items (a 422).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

from service import core
from service.errors import InvalidInput
from service.stages.schemas import (
    STAGE_EXPRESSION,
    STAGE_MAX_DEPTH,
    STAGE_MAX_ITEMS,
    StageGroup,
    StageItem,
    StageParallel,
    StageStep,
    StageStrategy,
)


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
