"""What the browser tests of the operator's page share: one headless Chromium (Debian's ``chromium``
and ``chromium-driver``) driven by Selenium for the whole session, the screenshots folder, and the
page helpers. ``tests/ui/conftest.py`` makes the fixtures available.

The browser tests skip (loudly, with the reason) only when no Chromium and chromedriver are
installed; ``.ci/run`` installs them and sets ``CI_SIZER_REQUIRE_BROWSER=1``, which turns a skip into a
failure. Screenshots go to a temporary folder, or to ``$CI_SIZER_UI_SCREENSHOTS`` (docs/ui for
docs/ui.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from ..test_auth import SECRETS

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402

T = TypeVar("T")
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
REQUIRE = os.environ.get("CI_SIZER_REQUIRE_BROWSER", "") not in ("", "0")
DESKTOP = (1400, 1000)
PHONE = (390, 844)
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
)


def _chromium() -> str | None:
    return next((p for p in CHROMIUM if Path(p).exists()), None) or shutil.which("chromium")


@pytest.fixture(scope="session")
def browser_binary() -> str:
    binary = _chromium()
    if binary is None or not Path(CHROMEDRIVER).exists():
        why = f"no Chromium ({CHROMIUM}) or chromedriver ({CHROMEDRIVER}): apt-get install chromium chromium-driver"
        if REQUIRE:
            pytest.fail(f"the browser tests are required (CI_SIZER_REQUIRE_BROWSER=1) but {why}")
        pytest.skip(f"BROWSER TESTS SKIPPED: {why}")
    return binary


@pytest.fixture(scope="session")
def driver(browser_binary: str) -> Iterator[WebDriver]:
    """One browser for every browser test of the session (each test opens the page afresh)."""
    profile = tempfile.mkdtemp(prefix="ci-sizer-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser_binary
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    d.set_script_timeout(20)
    try:
        yield d
    finally:
        d.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="session")
def screenshots() -> Iterator[Path]:
    wanted = os.environ.get("CI_SIZER_UI_SCREENSHOTS")
    if wanted:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        yield Path(wanted)
        return
    with tempfile.TemporaryDirectory(prefix="ci-sizer-shots-") as tmp:
        yield Path(tmp)


# --------------------------------------------------------------------------- waiting


def wait(check: Callable[[], T], what: str, timeout: float = 20) -> T:
    """``check()`` until it returns something true (a condition, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except (NoSuchElementException, StaleElementReferenceException, AssertionError, KeyError):
            got = None  # type: ignore[assignment]
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def bearer(role: str) -> dict[str, str]:
    return {"authorization": f"Bearer {SECRETS[role]}"}


def summarised(url: str, jobs: int, **params: str) -> bool:
    r = httpx.get(f"{url}/api/v1/jobs", params={"limit": 1, **params}, headers=bearer("admin"))
    return bool(r.status_code == 200 and r.json()["totals"]["summarised"] >= jobs)


# --------------------------------------------------------------------------- page helpers


def open_page(
    d: WebDriver, url: str, secret: str, hash_: str = "#fleet", ready: str = "#jobs-fragment > section"
) -> WebElement:
    """A fresh tab state: load the page, forget any token, paste ``secret``, go to ``hash_`` and
    wait for its ``ready`` element."""
    d.get(f"{url}/ui/")
    d.execute_script("sessionStorage.clear(); location.hash = arguments[0]", hash_)
    d.refresh()
    box = wait(lambda: d.find_element(By.ID, "token"), "the token box")
    box.send_keys(secret)
    d.find_element(By.CSS_SELECTOR, "#token-form button").click()
    return wait(lambda: by(d, ready), f"{ready} at {hash_}")


def by(d: WebDriver | WebElement, css: str) -> WebElement:
    return d.find_element(By.CSS_SELECTOR, css)


def all_of(d: WebDriver | WebElement, css: str) -> list[WebElement]:
    return d.find_elements(By.CSS_SELECTOR, css)


def go(d: WebDriver, hash_: str, ready: str) -> WebElement:
    """Navigate the open page to ``hash_`` and wait for a new ``ready`` element."""
    marked = d.execute_script("const v = document.querySelector('#view > *'); if (v) v.dataset.old = '1'; return !!v")
    d.execute_script(
        "if (location.hash === arguments[0]) window.dispatchEvent(new HashChangeEvent('hashchange'));"
        "else location.hash = arguments[0]",
        hash_,
    )
    if marked:
        wait(lambda: not all_of(d, "#view > [data-old]"), f"the view of {hash_}")
    return wait(lambda: by(d, ready), f"{ready} at {hash_}")


def filter_jobs(d: WebDriver, **fields: str) -> list[WebElement]:
    form = by(d, "#job-filter")
    for name, value in fields.items():
        el = form.find_element(By.NAME, name)
        if el.tag_name == "select":
            d.execute_script("arguments[0].value = arguments[1]", el, value)
        else:
            el.clear()
            el.send_keys(value)
    d.execute_script("arguments[0].dataset.old = '1'", by(d, "#jobs-fragment > section"))
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(lambda: by(d, "#jobs-fragment > section:not([data-old])"), "the filtered jobs")
    return all_of(d, "#jobs-fragment tbody tr[data-job]")


def open_job(d: WebDriver, name: str) -> None:
    rows = filter_jobs(d, q=name)
    buttons = [b for r in rows for b in r.find_elements(By.CSS_SELECTOR, "[data-action=open-job]") if b.text == name]
    assert len(buttons) == 1, [r.text for r in rows]
    buttons[0].click()
    wait(lambda: by(d, "[data-testid=job-name]").text == name, f"the job view of {name}")


def in_viewport(d: WebDriver, el: WebElement) -> bool:
    """Whether ``el`` is shown inside the window as it is scrolled now."""
    return bool(
        d.execute_script(
            "const r = arguments[0].getBoundingClientRect();"
            "return r.height > 0 && r.top >= 0 && r.top < window.innerHeight && r.left >= 0 && r.right <= window.innerWidth",
            el,
        )
    )


def page_overflows(d: WebDriver) -> bool:
    """Whether the page scrolls sideways (a table may scroll inside its own box, the page may not)."""
    return bool(d.execute_script("return document.documentElement.scrollWidth > window.innerWidth + 1"))


def shot(
    d: WebDriver, path: Path, *, size: tuple[int, int] = DESKTOP, whole: bool = True, at: str | None = None
) -> None:
    """A screenshot: the whole page, top to bottom (``whole``), or one window of it, from the top or
    from the element ``at``."""
    d.execute_script("window.scrollTo(0, 0)")
    width, height = size
    if whole:
        d.set_window_size(width, height)
        full = d.execute_script("return document.documentElement.scrollHeight")
        height = min(max(int(full) + 40, height), 4200)
    d.set_window_size(width, height)
    try:
        if at is not None:
            d.execute_script("document.querySelector(arguments[0]).scrollIntoView()", at)
        d.save_screenshot(str(path))
    finally:
        d.set_window_size(*DESKTOP)


def api(url: str, method: str, path: str, role: str = "admin", **kwargs: Any) -> httpx.Response:
    return httpx.request(method, f"{url}{path}", headers=bearer(role), timeout=30, **kwargs)
