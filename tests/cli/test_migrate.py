"""``ci-sizer migrate``."""

from __future__ import annotations

from pathlib import Path

from .entry import python_m


def test_migrate_creates_the_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    r = python_m("migrate", "--database-url", f"sqlite:///{db}")
    assert r.returncode == 0, r.stderr
    assert db.is_file()
    assert db.stat().st_size > 0


def test_migrate_unreachable_database_is_one_line(tmp_path: Path) -> None:
    r = python_m("migrate", "--database-url", "postgresql://nobody:secret-pw@127.0.0.1:1/x")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("ci-sizer: error: migration failed")
    assert "secret-pw" not in r.stderr  # the password never reaches the output
