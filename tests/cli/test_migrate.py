"""``ci-sizer migrate``."""

from __future__ import annotations

import sys
from pathlib import Path

from .entry import python_m, run


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


def test_migrate_does_not_load_the_app(tmp_path: Path) -> None:
    # ``ci-sizer migrate`` runs as an init container or a Job before every rollout, and the tests run it
    # dozens of times: it needs the tables and Alembic, not the app's routers (importing service.main
    # doubled its CPU time, 3.0 s to 1.5 s here)
    db = tmp_path / "x.db"
    script = (
        "import sys\nfrom service.cli import main\n"
        f"code = main(['migrate', '--database-url', 'sqlite:///{db}'])\n"
        "print(code, 'service.main' in sys.modules, 'service.routers' in sys.modules)\n"
    )
    r = run((sys.executable, "-c", script))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "False", "False"]
    assert db.stat().st_size > 0
