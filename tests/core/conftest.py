"""The ``core`` fixture runs each core test on both backends, so a failure names its backend."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

PURE = os.environ.get("CI_SIZER_PURE_PYTHON", "") not in ("", "0")


def compiled() -> ModuleType | None:
    try:
        return importlib.import_module("service.core._sizing")
    except ImportError:
        return None


@pytest.fixture(params=["cython", "python"])
def core(request: pytest.FixtureRequest) -> ModuleType:
    if request.param == "python":
        return importlib.import_module("service.core._reference")
    if PURE:
        pytest.skip("CI_SIZER_PURE_PYTHON=1: the reference backend only")
    module = compiled()
    if module is None:
        pytest.skip("the compiled backend is not built")
    return module
