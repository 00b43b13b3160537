"""The browser tests' shared fixtures (``browser.py``): one Chromium for the session, the screenshots folder."""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("selenium") is not None:
    from .browser import browser_binary, driver, screenshots  # noqa: F401
