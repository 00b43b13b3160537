"""Fixtures of the observability tests."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool comes with Debian's ``prometheus`` package, which ``.ci/run`` installs when it is
    absent. Without it the tests that need it skip, loudly, on a developer's machine; under CI
    (``CI`` set, as CI runs ``.ci/run``) they fail instead, so the rules are never merged untested."""
    found = shutil.which("promtool")
    if found is None:
        message = (
            "promtool is not installed: install Debian's prometheus package "
            "(apt-get install --no-install-recommends prometheus); the alert rules were NOT checked"
        )
        if os.environ.get("CI", "") not in ("", "0", "false"):
            pytest.fail(message + " (CI must check them: .ci/run installs it)")
        pytest.skip(message)
    return found
