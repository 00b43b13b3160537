"""The commands that read the database (backtest, simulate --org) say in one line when it is not
migrated or not reachable, and never show the password."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..live import free_port
from .entry import python_m

WINDOW = ("--org", "acme", "--since", "2024-01-01T00:00:00Z", "--until", "2024-02-01T00:00:00Z")


@pytest.mark.parametrize("command", [["backtest"], ["simulate", *WINDOW]], ids=["backtest", "simulate"])
def test_an_unmigrated_database_is_one_line(command: list[str], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    done = python_m(*command, "--database-url", url)
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

    from ..conftest import _admin

    base = postgres_server.url  # type: ignore[attr-defined]
    name = f"ci_sizer_empty_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(base, f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(base).set(database=name).render_as_string(hide_password=False)
        done = python_m(*command, "--database-url", url)
        assert done.returncode == 1
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "is not migrated" in done.stderr
    finally:
        asyncio.run(_admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    done = python_m("backtest", "--database-url", f"postgresql://u:s3cret@127.0.0.1:{free_port()}/db")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("ci-sizer: error: cannot read the database postgresql+asyncpg://u:***@127.0.0.1:")
    assert "s3cret" not in done.stderr


def test_a_migrated_database_still_works(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.db'}"
    assert python_m("migrate", "--database-url", url).returncode == 0
    done = python_m("backtest", "--database-url", url)
    assert done.returncode == 1
    assert done.stderr.strip() == "ci-sizer: error: no stored runs to backtest"
