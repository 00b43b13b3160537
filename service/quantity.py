"""Strict Kubernetes quantity parsing and canonical formatting (``shared/spec/sizing.md``, Units).

The grammar is Kubernetes' own: an optional sign, digits with an optional fraction, then either a
binary suffix (Ki Mi Gi Ti Pi Ei), a decimal suffix (n u m k M G T P E), a decimal exponent
(``e3``, ``E-2``) or nothing. Everything else (``1K``, ``NaN``, `` 1``, ``1_000``, ``1e``) is
rejected. Values are exact (``Fraction``); conversion to base units rounds up, as Kubernetes does.
"""

from __future__ import annotations

import re
from fractions import Fraction

_QUANTITY = re.compile(
    r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_BINARY = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
}
_DECIMAL = {
    "n": -9,
    "u": -6,
    "m": -3,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
#: Exponents beyond this are rejected rather than turned into astronomically large integers.
_MAX_EXPONENT = 30


class QuantityError(ValueError):
    """A string that is not a valid Kubernetes quantity, or not valid for its use."""


def parse_quantity(text: str) -> Fraction:
    """Parse a Kubernetes quantity string exactly."""
    if not isinstance(text, str):
        raise QuantityError("a quantity must be a string")
    m = _QUANTITY.fullmatch(text)
    if m is None:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 1.5Gi, 129M)")
    value = Fraction(m["num"])
    suffix = m["suffix"] or ""
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    if suffix in _DECIMAL:
        exponent = _DECIMAL[suffix]
    elif suffix:
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"{text!r}: exponent out of range")
    else:
        exponent = 0
    return value * Fraction(10) ** exponent


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


def parse_cpu_millicores(text: str) -> int:
    """A CPU quantity (a bare number is cores) in whole millicores, rounded up like Kubernetes."""
    return _ceil(parse_quantity(text) * 1000)


def parse_memory_bytes(text: str) -> int:
    """A memory quantity (a bare number is bytes) in whole bytes, rounded up like Kubernetes."""
    return _ceil(parse_quantity(text))


def format_cpu(millicores: int) -> str:
    """Canonical CPU: ``N`` for whole cores, else ``Nm``."""
    if millicores % 1000 == 0:
        return str(millicores // 1000)
    return f"{millicores}m"


def format_memory(num_bytes: int) -> str:
    """Canonical memory: ``NGi``, else ``NMi``, else ``NKi``, else plain bytes."""
    if num_bytes == 0:
        return "0"
    for suffix, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if num_bytes % size == 0:
            return f"{num_bytes // size}{suffix}"
    return str(num_bytes)
