"""The two ways to run the command as a user does: ``python -m service`` and the installed ``ci-sizer``
console script, both from the venv that runs the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: The console script pip installed next to this interpreter (pyproject's [project.scripts]).
SCRIPT = Path(sys.executable).with_name("ci-sizer")

PYTHON_M = (sys.executable, "-m", "service")


def run(
    prefix: tuple[str, ...],
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        input=stdin,
    )


def python_m(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m service ARGS``."""
    return run(PYTHON_M, *args, env=env, cwd=cwd, stdin=stdin)


def console_script(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``ci-sizer ARGS``, the installed script."""
    return run((str(SCRIPT),), *args, env=env, cwd=cwd, stdin=stdin)
