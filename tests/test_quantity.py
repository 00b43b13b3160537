"""Strict Kubernetes quantities (spec: Units), with the ``kubernetes`` client as a test-only oracle."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as k8s_parse

from service.quantity import (
    QuantityError,
    format_cpu,
    format_memory,
    parse_cpu_millicores,
    parse_memory_bytes,
    parse_quantity,
)

from .helpers import examples


@pytest.mark.parametrize(
    ("text", "millicores"),
    [
        ("500m", 500),
        ("0.5", 500),
        ("2", 2000),
        ("1500m", 1500),
        ("0.1m", 1),
        ("1e-3", 1),
        ("+1", 1000),
    ],
)
def test_cpu_examples(text: str, millicores: int) -> None:
    assert parse_cpu_millicores(text) == millicores


@pytest.mark.parametrize(
    ("text", "num_bytes"),
    [
        ("128974848", 128974848),
        ("129e6", 129_000_000),
        ("129M", 129_000_000),
        ("123Mi", 123 * 2**20),
        ("1Gi", 2**30),
        ("1.5Gi", 3 * 2**29),
        ("1G", 10**9),
        ("1k", 1000),
        ("1Ki", 1024),
        ("1.", 1),
        (".5Ki", 512),
    ],
)
def test_memory_examples(text: str, num_bytes: int) -> None:
    assert parse_memory_bytes(text) == num_bytes


@pytest.mark.parametrize(
    "text",
    [
        "1K",
        "1e3m",
        "NaN",
        "nan",
        "Inf",
        " 1",
        "1 ",
        "1_000",
        "",
        "1e",
        "1Mi ",
        "1mi",
        "1KB",
        "0x10",
        "1..0",
        ".",
        "1e1.5",
        "--1",
        "1Gi1",
        "\u0661",
        "1\n",
    ],
)
def test_rejects_what_kubernetes_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("millicores", "text"),
    [(500, "500m"), (1000, "1"), (2000, "2"), (1500, "1500m"), (1, "1m")],
)
def test_format_cpu(millicores: int, text: str) -> None:
    assert format_cpu(millicores) == text


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [
        (2**30, "1Gi"),
        (4 * 2**30, "4Gi"),
        (1536 * 2**20, "1536Mi"),
        (1024 * 2**20, "1Gi"),
        (3 * 1024, "3Ki"),
        (1000, "1000"),
        (0, "0"),
    ],
)
def test_format_memory(num_bytes: int, text: str) -> None:
    assert format_memory(num_bytes) == text


digits = st.text("0123456789", min_size=1, max_size=6)
suffixes = st.sampled_from(["", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti", "e3", "E2", "e-2", "u", "n"])


@st.composite
def valid_quantities(draw: st.DrawFn) -> str:
    whole = draw(digits)
    frac = draw(st.one_of(st.just(""), digits.map(lambda d: "." + d)))
    return whole + frac + draw(suffixes)


@settings(max_examples=examples(400), deadline=None)
@given(valid_quantities())
def test_agrees_with_kubernetes_client_on_valid_strings(text: str) -> None:
    # The kubernetes client parses valid quantities to a Decimal; ours must be the same exact value.
    ours = parse_quantity(text)
    theirs = Fraction(Decimal(k8s_parse(text)))
    assert ours == theirs


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(min_value=1, max_value=10**7))
def test_cpu_format_round_trips(millicores: int) -> None:
    assert parse_cpu_millicores(format_cpu(millicores)) == millicores


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(min_value=0, max_value=2**50))
def test_memory_format_round_trips(num_bytes: int) -> None:
    assert parse_memory_bytes(format_memory(num_bytes)) == num_bytes


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=12))
def test_never_crashes_and_only_accepts_the_grammar(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError:
        return
    assert isinstance(value, Fraction)
    assert text == text.strip()
    assert "_" not in text
