"""The wire's shared pieces: names (rule I3), timestamps, bounded CPU and memory values,
the strict base model, and the naive-UTC time helpers the tables and the API share."""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)

from service.sizing.params import STAT_NAMES as STAT_NAMES
from service.sizing.params import CpuPercentile as CpuPercentile

NAME_MAX = 200
MAX_MEMORY_BYTES = 1 << 50  # 1 PiB: bounds inputs so the integer arithmetic never overflows
MAX_CPU_MILLICORES = 1e9  # a million cores


def is_json(content_type: bytes) -> bool:
    """Whether a ``Content-Type`` value is JSON: ``application/json`` or ``application/<x>+json``,
    parameters aside (what FastAPI parses as JSON)."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def utcnow() -> datetime:
    """Now, as the naive UTC datetime the tables store."""
    return datetime.now(UTC).replace(tzinfo=None)


def to_naive_utc(value: datetime) -> datetime:
    """Naive UTC; a value whose UTC time falls outside years 1-9999 (``9999-12-31T23:59:59-01:00``)
    raises ``ValueError``, which a validator reports as a 422 naming the field."""
    if value.tzinfo is None:
        return value
    try:
        return value.astimezone(UTC).replace(tzinfo=None)
    except OverflowError:
        raise ValueError("is out of range once converted to UTC (years 1 to 9999)") from None


def to_rfc3339(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


#: The Unicode Bidi_Control characters (UAX #9): they reorder how a name is displayed, so a name
#: could read as another one ("Trojan Source", CVE-2021-42574).
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

#: General categories refused in names (rule I3, and its clarification in docs/sizing.md): control
#: characters (Cc); lone surrogates (Cs: undecodable bytes, or a JSON ``\udc80`` escape); and the
#: invisible ones, format characters (Cf: zero-width joiner and space, BOM, soft hyphen, tag characters,
#: the bidirectional controls) and line and paragraph separators (Zl, Zp), with which ``build`` and a
#: look-alike would be two jobs. One exception: a zero-width joiner inside an emoji sequence.
_REFUSED = {
    "Cc": "must not contain control characters",
    "Cs": "must be valid UTF-8 (no lone surrogates)",
    "Cf": "must not contain invisible characters (format characters such as U+200D or U+FEFF)",
    "Zl": "must not contain invisible characters (line separators)",
    "Zp": "must not contain invisible characters (paragraph separators)",
}


def name_problem(value: str) -> str | None:
    """Why ``value`` cannot be a name (rule I3), or None: control, bidirectional control and other
    invisible characters, and lone surrogates are refused."""
    if value.isascii() and value.isprintable():  # the common case, in C: none of those can be in it
        return None
    return problem_by_character(value)


def problem_by_character(value: str) -> str | None:
    """``name_problem`` judged one character at a time (its definition, which the ASCII shortcut keeps)."""
    for i, ch in enumerate(value):
        if ch in BIDI_CONTROLS:
            return "must not contain bidirectional control characters"
        problem = _REFUSED.get(unicodedata.category(ch))
        if problem is not None and not (ch == ZWJ and _joins_emoji(value, i)):
            return problem
    return None


#: U+200D ZERO WIDTH JOINER
ZWJ = "\u200d"


def _joins_emoji(value: str, i: int) -> bool:
    """Whether the joiner at ``i`` is inside an emoji ZWJ sequence (UTS #51: ``👩‍💻`` is one glyph, and
    ``👩💻`` visibly two): an emoji, or its skin-tone modifier or U+FE0F, before it, an emoji after it."""
    if not 0 < i < len(value) - 1:
        return False
    before, after = value[i - 1], value[i + 1]
    return (before == "\ufe0f" or unicodedata.category(before) in ("So", "Sk")) and unicodedata.category(after) == "So"


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text by either database, or None: a control character (NUL
    is one, which PostgreSQL refuses) or a lone surrogate (no UTF-8). For free text such as a query."""
    if value.isascii() and value.isprintable():
        return None
    for ch in value:
        category = unicodedata.category(ch)
        if category in ("Cc", "Cs"):
            return _REFUSED[category]
    return None


def _no_control_chars(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _rfc3339_text(value: object) -> object:
    """Timestamps come as RFC 3339 strings; pydantic's lax mode would take a number as epoch seconds."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 date-time string such as 2026-11-20T10:07:12Z")
    return value


Timestamp = Annotated[datetime, BeforeValidator(_rfc3339_text)]

Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=NAME_MAX),
    AfterValidator(_no_control_chars),
]
CpuValue = Annotated[float, Field(strict=True, ge=0, le=MAX_CPU_MILLICORES, allow_inf_nan=False)]
MemoryBytes = Annotated[int, Field(strict=True, ge=0, le=MAX_MEMORY_BYTES)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
