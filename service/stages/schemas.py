"""Request schemas of stages (stage.md) and the typed quantities placement shares; replies: ``stages.public``."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    Tag,
    WithJsonSchema,
    model_validator,
)

from service.quantity import parse_cpu_millicores, parse_memory_bytes
from service.wire import MAX_CPU_MILLICORES, MAX_MEMORY_BYTES, Name, Strict

# --------------------------------------------------------------------------- wire: stages (stage.md)

STAGE_MAX_ITEMS = 2000
STAGE_MAX_DEPTH = 32


def _quantity_text(v: Any, what: str) -> str:
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise ValueError(f"a {what} quantity: a string such as {'500m or 2' if what == 'CPU' else '500Mi or 1Gi'}")
    return v if isinstance(v, str) else repr(v)


def bounded_quantity(v: Any, what: Literal["CPU", "memory"], *, positive: bool, maximum: float) -> int:
    """A typed quantity in base units (millicores, bytes; rounded up), within its bounds."""
    parse = parse_cpu_millicores if what == "CPU" else parse_memory_bytes
    value = parse(_quantity_text(v, what))
    if positive and value <= 0:
        raise ValueError("must be greater than zero")
    if value < 0:
        raise ValueError("must not be negative")
    if value > maximum:
        raise ValueError("is larger than any node")
    return value


def _stage_cpu(v: Any) -> int:
    """A CPU limit in whole millicores (rule H7); a bare number is cores."""
    return bounded_quantity(v, "CPU", positive=True, maximum=MAX_CPU_MILLICORES)


def _stage_memory(v: Any) -> int:
    """A memory limit in whole MiB, rounded up (rule H7); a bare number is bytes."""
    return -(-bounded_quantity(v, "memory", positive=True, maximum=MAX_MEMORY_BYTES) // (1 << 20))


QUANTITY_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "number"}]}
StageCpu = Annotated[
    int,
    BeforeValidator(_stage_cpu),
    WithJsonSchema({**QUANTITY_SCHEMA, "description": "CPU limit: 500m, 0.5, 2 (a bare number is cores)"}),
]
StageMemory = Annotated[
    int,
    BeforeValidator(_stage_memory),
    WithJsonSchema({**QUANTITY_SCHEMA, "description": "memory limit: 500Mi, 1Gi, 129M (rounded up to whole MiB)"}),
]


class StageJobRef(Strict):
    """The sized job a step runs as: with ``use_recommendations`` its recommended limits apply (H1)."""

    org: Name
    repo: Name
    workflow: Name
    job: Name
    container: Name | None = Field(default=None, description="which container of the job; optional when it has one")


#: A per-copy value in a looped step's ``cpu``/``memory`` (rule H8): ``<+matrix.KEY>`` or ``<+repeat.item>``.
STAGE_EXPRESSION = re.compile(r"<\+(?:matrix\.[A-Za-z_][A-Za-z0-9_]*|repeat\.item)>")
_STAGE_SCALAR = str | int | float | bool
_MATRIX_WORDS = ("exclude", "maxConcurrency", "nodeName")


def _matrix(v: dict[str, Any]) -> dict[str, Any]:
    """A Harness ``matrix``: axes (a key and a list of values), optional ``exclude`` (a list of
    partial combinations) and ``maxConcurrency`` (rule H8)."""
    axes = {k: a for k, a in v.items() if k not in _MATRIX_WORDS}
    if not axes:
        raise ValueError("a matrix needs at least one axis (a key with a list of values)")
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"axis {key!r}: a non-empty list of values")
        if any(isinstance(x, dict | list) or x is None for x in values):
            raise ValueError(f"axis {key!r}: values are strings or numbers")
    exclude = v.get("exclude", [])
    if not isinstance(exclude, list) or any(
        not isinstance(e, dict) or not e or any(isinstance(x, dict | list) or x is None for x in e.values())
        for e in exclude
    ):
        raise ValueError("exclude: a list of partial combinations ({axis: value, ...})")
    k = v.get("maxConcurrency")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError("maxConcurrency: a whole number of at least 1")
    if "nodeName" in v and not isinstance(v["nodeName"], str):
        raise ValueError("nodeName: a string")
    return v


StageMatrix = Annotated[
    dict[str, Any],
    AfterValidator(_matrix),
    WithJsonSchema(
        {
            "type": "object",
            "description": "axes (key: list of values), optional exclude (list of partial combinations) "
            "and maxConcurrency (default: every combination at once)",
            "properties": {
                "exclude": {"type": "array", "items": {"type": "object"}},
                "maxConcurrency": {"type": "integer", "minimum": 1},
            },
            "additionalProperties": {"type": "array"},
        }
    ),
]


class StageRepeat(Strict):
    times: Annotated[int, Field(strict=True, ge=1)] | None = None
    items: list[_STAGE_SCALAR] | None = Field(default=None, min_length=1)
    maxConcurrency: Annotated[int, Field(strict=True, ge=1)] | None = None

    @model_validator(mode="after")
    def _one(self) -> StageRepeat:
        if (self.times is None) == (self.items is None):
            raise ValueError("repeat takes times or items")
        return self


class StageStrategy(Strict):
    """A Harness looping strategy (rule H8): one of ``matrix``, ``parallelism`` or ``repeat``."""

    matrix: StageMatrix | None = None
    parallelism: Annotated[int, Field(strict=True, ge=1, le=STAGE_MAX_ITEMS)] | None = None
    repeat: StageRepeat | None = None

    @model_validator(mode="after")
    def _one(self) -> StageStrategy:
        if sum(x is not None for x in (self.matrix, self.parallelism, self.repeat)) != 1:
            raise ValueError("a strategy is one of matrix, parallelism or repeat")
        return self


class StageStep(Strict):
    name: Name | None = None
    cpu: StageCpu | None = None
    memory: StageMemory | None = None
    background: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="its own container for the whole stage (rule H4)"
    )
    job: StageJobRef | None = None
    strategy: StageStrategy | None = Field(
        default=None, description="looped into copies (rules H8-H10; generation harness)"
    )
    non_ci: Annotated[bool, Field(strict=True)] = Field(
        default=False,
        description="an approval or a shell script run on the delegate: no container, no request (rule H11; "
        "generation harness)",
    )
    #: ``cpu``/``memory`` as written (the quantity text, or a ``<+matrix.KEY>`` expression): the
    #: harness generation rounds them as the source does (H14), and copies resolve expressions (H8)
    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_raw(cls, data: Any, handler: ModelWrapValidatorHandler[StageStep]) -> StageStep:
        raw: dict[str, Any] = {}
        if isinstance(data, dict):
            data = dict(data)
            for field in ("cpu", "memory"):
                value = data.get(field)
                if value is not None:
                    raw[field] = value
                if isinstance(value, str) and STAGE_EXPRESSION.fullmatch(value):
                    data[field] = None  # resolved per copy by the service
        step = handler(data)
        if raw:
            step._raw = raw
        return step

    @model_validator(mode="after")
    def _non_ci(self) -> StageStep:
        if self.non_ci and (self.background or self.job is not None or self._raw_given()):
            raise ValueError("a non-CI step has no container: no cpu, memory, background or job")
        return self

    def _raw_given(self) -> bool:
        return self.cpu is not None or self.memory is not None


class StageParallel(Strict):
    name: Name | None = None
    parallel: list[StageItem] = Field(min_length=1, description="items run at once")


class StageGroup(Strict):
    name: Name | None = None
    group: list[StageItem] = Field(min_length=1, description="items run in sequence")
    strategy: StageStrategy | None = Field(
        default=None, description="looped into copies (rules H8-H10; generation harness)"
    )


def _stage_item_tag(v: Any) -> str:
    if isinstance(v, dict):
        if "parallel" in v:
            return "parallel"
        if "group" in v:
            return "group"
        return "step"
    if isinstance(v, StageParallel):
        return "parallel"
    if isinstance(v, StageGroup):
        return "group"
    return "step"


StageItem = Annotated[
    Annotated[StageStep, Tag("step")] | Annotated[StageParallel, Tag("parallel")] | Annotated[StageGroup, Tag("group")],
    Discriminator(_stage_item_tag),
]


class StageOptions(Strict):
    increase_default_resources: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="default step limits 1000m/3000Mi instead of 400m/500Mi (rule H1)"
    )
    conservative_addon_limits: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="the stage container is a flat 100m/100Mi (rule H3)"
    )
    use_recommendations: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="steps with a job reference take the sizer's recommended limits (rule H1)"
    )
    generation: Literal["doc", "harness"] = Field(
        default="doc",
        description="doc: the rules as the seed document states them (H1-H7); harness: as Harness CI's "
        "source does it (H8-H14: looping strategies, non-CI steps, its parallel divisor and rounding)",
    )
    disable_resource_optimization: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="CI_DISABLE_RESOURCE_OPTIMIZATION: every step's limit is its own (rule H12)"
    )
    extra_addon_resource: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="CI_EXTRA_ADDON_RESOURCE: the setup-addon init container is 300m/400Mi (rule H13)"
    )


class StageCompute(Strict):
    stage: list[StageItem] = Field(min_length=1, description="the top-level items, run in sequence")
    options: StageOptions = Field(default_factory=StageOptions)


StageParallel.model_rebuild()
StageGroup.model_rebuild()
StageCompute.model_rebuild()
