"""Rule I3's names (service/wire.py ``name_problem``): the ASCII shortcut refuses exactly what the
character-by-character test refuses (control characters, bidirectional controls, lone surrogates)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.wire import name_problem, problem_by_character


@given(st.text(alphabet=st.characters(exclude_categories=()), max_size=40))  # surrogates (Cs) included
def test_any_text_is_judged_as_character_by_character(value: str) -> None:
    assert name_problem(value) == problem_by_character(value)


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=40))
def test_any_ascii_text_is_judged_as_character_by_character(value: str) -> None:
    assert name_problem(value) == problem_by_character(value)


def test_every_ascii_control_character_is_refused() -> None:
    for code in [*range(32), 127]:
        assert name_problem(f"a{chr(code)}b") == "must not contain control characters"
    assert name_problem("build (ubuntu-latest, 3.12) ~!@#$%^&*") is None


def test_surrogates_and_bidi_controls_are_refused() -> None:
    assert name_problem("a\udc80") == "must be valid UTF-8 (no lone surrogates)"
    assert name_problem("a\u202eb") == "must not contain bidirectional control characters"
    assert name_problem("héllo wörld") is None
