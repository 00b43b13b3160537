"""Run the Alembic migrations programmatically (``ci-sizer migrate``, ``ci-sizer serve``, tests)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from alembic.config import Config

from alembic import command


def alembic_dir() -> Path:
    """The ``alembic/`` folder: next to the package in a checkout, else ``$CI_SIZER_ALEMBIC_DIR`` or ./alembic."""
    env = os.environ.get("CI_SIZER_ALEMBIC_DIR")
    candidates = [Path(env)] if env else []
    candidates += [
        Path(__file__).resolve().parent.parent / "alembic",
        Path.cwd() / "alembic",
    ]
    for path in candidates:
        if (path / "env.py").is_file():
            return path
    raise FileNotFoundError("cannot find the alembic/ migrations folder; set CI_SIZER_ALEMBIC_DIR")


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(alembic_dir()))
    cfg.attributes["database_url"] = database_url
    return cfg


def _outside_loop(fn: Callable[[], None]) -> None:
    """Alembic's async env.py calls ``asyncio.run``; from inside a running loop, use a thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        fn()
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(fn).result()


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision``."""
    _outside_loop(lambda: command.upgrade(alembic_config(database_url), revision))


def downgrade(database_url: str, revision: str = "base") -> None:
    _outside_loop(lambda: command.downgrade(alembic_config(database_url), revision))
