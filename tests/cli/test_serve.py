"""``ci-sizer serve``: a bad setting is one clear line and a non-zero exit, before anything is served; the
event loop it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from .entry import python_m


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["serve", "--port", "70000"], {}, "--port"),
        (["serve", "--port", "abc"], {}, "--port"),
        (["serve", "--cpu-sizing-mode", "sometimes"], {}, "--cpu-sizing-mode"),
        (["serve", "--memory-qos", "besteffort"], {}, "--memory-qos"),
        (["serve", "--max-memory", "1K"], {}, "--max-memory"),
        (["serve", "--max-memory", "0"], {}, "--max-memory"),
        (["serve", "--log-level", "loud"], {}, "--log-level"),
        (["serve", "--database-url", "mysql://x"], {}, "--database-url"),
        (["serve"], {"CI_SIZER_PORT": "0"}, "CI_SIZER_PORT"),
        (["serve", "--host", "0.0.0.0"], {}, "--allow-anonymous"),
        (["serve", "--no-such-flag"], {}, "unrecognized"),
    ],
)
def test_bad_values_exit_non_zero_with_one_clear_line(args: list[str], env: dict[str, str], needle: str) -> None:
    r = python_m(*args, env=env)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ci-sizer: error:")
    assert needle in lines[0]
    assert "Traceback" not in r.stderr


def test_the_loop_is_asyncios_own_on_sqlite_and_uvloop_on_postgresql(tmp_path: Path) -> None:
    # uvloop accepts one new connection a turn of its loop; SQLite's misses are read on the loop, so
    # serve runs asyncio's own loop there (docs/performance.md, "uvloop's accept")
    from service.cli.serve import event_loop
    from service.settings import Settings

    assert event_loop(Settings(database_url=f"sqlite:///{tmp_path}/x.db")) == "asyncio"
    assert event_loop(Settings(database_url="sqlite+aiosqlite://")) == "asyncio"
    assert event_loop(Settings(database_url="postgresql://u@127.0.0.1:5432/db")) == "auto"
