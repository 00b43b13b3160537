"""The CLI's rough edges: commands that read the database say in one line when it is not migrated
or not reachable; ``collect --flush`` reports a corrupt spool file and a missing directory with a
non-zero exit; plot axes stay readable for short windows."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service import collector
from service.plots import line_panels, time_axis

from .helpers import container, run
from .live import LiveServer, free_port

WINDOW = ("--org", "acme", "--since", "2024-01-01T00:00:00Z", "--until", "2024-02-01T00:00:00Z")


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


@pytest.mark.parametrize("command", [["backtest"], ["simulate", *WINDOW]], ids=["backtest", "simulate"])
def test_an_unmigrated_database_is_one_line(command: list[str], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    done = cli(*command, "--database-url", url)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # not a traceback
    assert lines[0].startswith("ci-sizer: error: the database sqlite+aiosqlite:///")
    assert "is not migrated: run `ci-sizer migrate" in lines[0]


@pytest.mark.parametrize("command", [["backtest"], ["simulate", *WINDOW]], ids=["backtest", "simulate"])
def test_an_unmigrated_postgresql_database_is_one_line(command: list[str], postgres_server: object) -> None:
    import asyncio
    import uuid

    from sqlalchemy.engine import make_url

    from .conftest import _admin

    base = postgres_server.url  # type: ignore[attr-defined]
    name = f"ci_sizer_empty_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(base, f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(base).set(database=name).render_as_string(hide_password=False)
        done = cli(*command, "--database-url", url)
        assert done.returncode == 1
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "is not migrated" in done.stderr
    finally:
        asyncio.run(_admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    done = cli("backtest", "--database-url", f"postgresql://u:s3cret@127.0.0.1:{free_port()}/db")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("ci-sizer: error: cannot read the database postgresql+asyncpg://u:***@127.0.0.1:")
    assert "s3cret" not in done.stderr


def test_a_migrated_database_still_works(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.db'}"
    assert cli("migrate", "--database-url", url).returncode == 0
    done = cli("backtest", "--database-url", url)
    assert done.returncode == 1
    assert done.stderr.strip() == "ci-sizer: error: no stored runs to backtest"


def test_flush_reports_a_missing_directory(tmp_path: Path) -> None:
    done = cli("collect", "--flush", str(tmp_path / "nope"), "--url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert done.stderr.strip() == f"ci-sizer: error: --flush {tmp_path / 'nope'}: no such directory"


def test_flush_reports_a_corrupt_spool_file_and_still_sends_the_others(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    good = collector.spool(spool, run(1, container()))
    corrupt = spool / "run-0-corrupt.json"
    corrupt.write_text('{"org": "acme", "repo"')  # cut short, as by a full disk
    with LiveServer(f"sqlite:///{tmp_path / 'sizer.db'}") as server:
        done = cli("collect", "--flush", str(spool), "--url", server.url)
        assert done.returncode == 1
        assert f"ci-sizer: {corrupt.name}: not a spooled run, left in place (JSONDecodeError:" in done.stderr
        assert f"sent {good.name}" in done.stderr
        assert "Traceback" not in done.stderr
        assert f"1 run(s) still spooled in {spool}" in done.stderr
        assert httpx.post(server.url + "/api/v1/runs", json=run(1, container())).json()["result"] == "duplicate"
    assert sorted(p.name for p in spool.iterdir()) == [corrupt.name]  # kept for a person to look at


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
    done = cli("simulate", "--days", "0.02", "--builds-per-day", "3000", "--plot", str(out), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)
    ticks, unit = _x_ticks(out.read_text())
    assert unit == "minutes"
    assert len(set(ticks)) == len(ticks) >= 3
