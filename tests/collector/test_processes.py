"""``ci-sizer collect`` wrapping a command: its exit code passes through, its own processes are
measured and the collector's share is not, and a missing identity is a clear error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .helpers import ALLOCATE, IDENTITY, MIB, TRIVIAL, collect


def test_exit_codes_pass_through(tmp_path: Path) -> None:
    spool = ("--spool-dir", str(tmp_path / "spool"))
    assert collect(*IDENTITY, *spool, "--", sys.executable, "-c", "raise SystemExit(42)").returncode == 42
    assert collect(*IDENTITY, *spool, "--", "/nonexistent/tool").returncode == 127
    killed = collect(
        *IDENTITY, *spool, "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    )
    assert killed.returncode == 128 + 9


def test_no_identity_is_a_clear_error(tmp_path: Path) -> None:
    clean = dict.fromkeys(("GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "JENKINS_URL"), "")
    done = collect("--", "true", env=clean)
    assert done.returncode == 2
    assert "no --org, --repo, --workflow, --job given" in done.stderr
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------- the command, not the collector


def test_a_trivial_command_is_not_charged_the_collector(tmp_path: Path) -> None:
    # the kernel's ru_maxrss of a child starts at its parent's peak: reading it counted the collector
    spool = tmp_path / "spool"
    script, report = tmp_path / "trivial.py", tmp_path / "collector-rss"
    script.write_text(TRIVIAL)
    done = collect(*IDENTITY, "--spool-dir", str(spool), "--interval", "0.1", "--", sys.executable, str(script), str(report), "0.5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    collector_rss = int(report.read_text())
    measured = json.loads(next(spool.glob("run-*.json")).read_text())["containers"][0]["memory_peak_bytes"]
    assert 0 < measured < collector_rss / 2, (measured, collector_rss)
    # `true` ends before it can be read: then nothing is posted, and never the collector's size
    done = collect(*IDENTITY, "--spool-dir", str(tmp_path / "true"), "--", "true")
    assert done.returncode == 0, done.stderr
    for path in (tmp_path / "true").glob("run-*.json"):
        assert json.loads(path.read_text())["containers"][0]["memory_peak_bytes"] < collector_rss / 2
    if not list((tmp_path / "true").glob("run-*.json")):
        assert "gave no readings: no memory" in done.stderr


def test_a_command_allocating_200_mib_reports_about_that(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    script, report = tmp_path / "allocate.py", tmp_path / "rss"
    script.write_text(ALLOCATE)
    done = collect(*IDENTITY, "--spool-dir", str(spool), "--interval", "0.1", "--", sys.executable, str(script), "200", "0.6", str(report))  # fmt: skip
    assert done.returncode == 0, done.stderr
    measured = json.loads(next(spool.glob("run-*.json")).read_text())["containers"][0]["memory_peak_bytes"]
    assert measured == pytest.approx(int(report.read_text()), rel=0.1)
    assert 200 * MIB <= measured < 240 * MIB
