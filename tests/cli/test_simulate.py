"""``ci-sizer simulate --plot``: the plot's time axis stays readable for any window."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from service.plots import line_panels, time_axis

from .entry import python_m


def _x_ticks(svg: str) -> tuple[list[str], str]:
    ticks = re.findall(r'text-anchor="middle" fill="#777">([^<]*)</text>', svg)
    (unit,) = re.findall(r'text-anchor="middle" fill="#555">([^<]*)</text>', svg)
    return ticks, unit


@pytest.mark.parametrize(
    ("span", "unit", "ticks"),
    [
        (20 * 60, "minutes", ["0", "5", "10", "15", "20"]),
        (45, "seconds", ["0", "10", "20", "30", "40"]),
        (3 * 3600, "hours", ["0", "0.5", "1", "1.5", "2", "2.5", "3"]),
        (7 * 86400, "days", ["0", "1", "2", "3", "4", "5", "6", "7"]),
    ],
)
def test_plot_axes_are_readable_for_any_window(span: float, unit: str, ticks: list[str]) -> None:
    svg = line_panels("t", [("nodes", {"a": [(0.0, 1.0), (span, 2.0)]})])
    got, got_unit = _x_ticks(svg)
    assert got_unit == unit
    assert got == ticks
    assert len(set(got)) == len(got)  # no two ticks say the same


def test_time_axis_ticks_are_round_and_within_the_window() -> None:
    for span in (1, 7, 59, 61, 119, 121, 3599, 7201, 86399, 172801, 10**7):
        _unit, scale, ticks = time_axis(span)
        assert 2 <= len(ticks) <= 8, (span, ticks)
        assert ticks[0] == 0
        assert ticks[-1] <= span * (1 + 1e-9)
        steps = {round((b - a) / scale, 9) for a, b in itertools.pairwise(ticks)}
        assert len(steps) == 1, (span, ticks)
        (step,) = steps
        mantissa = step / 10 ** int(f"{step:e}".split("e")[1])
        assert round(mantissa, 6) in (1, 2, 5), (span, step)


def test_the_simulation_plot_of_a_short_trace(tmp_path: Path) -> None:
    out = tmp_path / "plot.svg"
    done = python_m(
        "simulate", "--days", "0.02", "--builds-per-day", "3000", "--plot", str(out), "--json", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)
    ticks, unit = _x_ticks(out.read_text())
    assert unit == "minutes"
    assert len(set(ticks)) == len(ticks) >= 3
