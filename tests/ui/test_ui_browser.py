"""The operator's page in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by Selenium, against a live ``ci-sizer serve`` on SQLite and on
PostgreSQL, with tokens.

These tests skip (loudly, with the reason) only when no Chromium and chromedriver are installed;
``.ci/run`` installs them and sets ``CI_SIZER_REQUIRE_BROWSER=1``, which turns a skip into a failure.
Screenshots of each view go to a temporary folder, or to ``$CI_SIZER_UI_SCREENSHOTS`` (docs/ui
for docs/ui.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from service.sizing.formats import RENDERERS
from service.wire import utcnow

from ..conftest import _clean
from ..helpers import GIB, MIB
from ..live import LiveServer
from ..test_auth import SECRETS, write_tokens
from .browser import by, filter_jobs, open_job, open_page, shot, summarised
from .browser import wait as _wait

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402

#: the CI tier (README): a real Chromium drives the page
pytestmark = pytest.mark.ci

LOGS: dict[str, Path] = {}
HOSTILE = "<script>alert(1)</script>"


# --------------------------------------------------------------------------- the live server


def job(name: str, org: str = "acme", repo: str = "web", workflow: str = ".github/workflows/ci.yml") -> dict[str, str]:
    return {"org": org, "repo": repo, "workflow": workflow, "job": name}


BUILD = job("build")
TEST = job("test (3.12)")
EVIL = job(HOSTILE, repo="<b>repo</b>")
OOMY = job("integration", repo="api")


def _run(j: dict[str, str], n: int, *, mem: int, limit: int, oom: bool = False, cpu: float = 800.0) -> dict[str, Any]:
    finished = utcnow() - timedelta(hours=3 * n)
    container: dict[str, Any] = {
        "name": "build",
        "cpu_stats_millicores": dict.fromkeys(("peak", "p99", "p95", "p75", "p50", "avg"), cpu),
        "memory_peak_bytes": mem,
        "memory_limit_bytes": limit,
        "cpu_request_millicores": 2000,
    }
    if oom:
        container["oom_killed"] = True
    return {
        **j,
        "node_memory_bytes": 16 * GIB,
        "run_id": f"run-{n}",
        "started_at": (finished - timedelta(minutes=20 + n % 7)).isoformat() + "Z",
        "finished_at": finished.isoformat() + "Z",
        "containers": [container],
    }


def seed(url: str) -> None:
    headers = {"authorization": f"Bearer {SECRETS['admin']}"}
    ingest = {"authorization": f"Bearer {SECRETS['ingest']}"}
    bodies = [_run(BUILD, n, mem=(900 + 37 * (n % 5)) * MIB, limit=8 * GIB) for n in range(1, 13)]
    bodies += [_run(TEST, n, mem=400 * MIB, limit=2 * GIB, cpu=300) for n in range(1, 6)]
    bodies += [_run(EVIL, n, mem=600 * MIB, limit=4 * GIB) for n in range(1, 4)]
    bodies += [
        _run(OOMY, n, mem=(1010 if n in (1, 2, 6) else 640 + 15 * n) * MIB, limit=GIB, oom=n in (1, 2, 6))
        for n in range(1, 11)
    ]
    r = httpx.post(f"{url}/api/v1/runs:batch", json={"runs": bodies}, headers=ingest, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["created"] == len(bodies), r.text
    r = httpx.put(
        f"{url}/api/v1/sizing/overrides/acme",
        json={"cpu_limit": "4", "reason": "runner nodes have 4 cores"},
        headers=headers,
    )
    assert r.status_code == 201, r.text


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, browser_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    db_url: str = request.getfixturevalue(f"{request.param}_database")
    tmp = tmp_path_factory.mktemp(f"ui-{request.param}")
    tokens = write_tokens(tmp / "tokens.toml")
    live = LiveServer(
        db_url, "--tokens-file", str(tokens), log=tmp / "serve.log", env={"CI_SIZER_JOBS_SUMMARY_SECONDS": "0.2"}
    )
    with live:
        LOGS[live.url] = tmp / "serve.log"
        seed(live.url)
        _wait(lambda: summarised(live.url, 4), "job summaries")
        yield live.url
    import asyncio

    asyncio.run(_clean(db_url))


def sizing(url: str, j: dict[str, str]) -> dict[str, Any]:
    path = "/".join(quote(j[k], safe="") for k in ("org", "repo", "workflow", "job"))
    r = httpx.get(f"{url}/api/v1/sizing/{path}", headers={"authorization": f"Bearer {SECRETS['admin']}"})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def override(url: str, j: dict[str, str]) -> httpx.Response:
    path = "/".join(quote(j[k], safe="") for k in ("org", "repo", "workflow", "job"))
    return httpx.get(f"{url}/api/v1/sizing/overrides/{path}", headers={"authorization": f"Bearer {SECRETS['admin']}"})


# --------------------------------------------------------------------------- page helpers


def answer_cells(d: WebDriver) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for row in d.find_elements(By.CSS_SELECTOR, "[data-testid=answer] tbody tr"):
        name = row.get_attribute("data-container") or ""
        out[name] = {
            f.get_attribute("data-field") or "": f.text for f in row.find_elements(By.CSS_SELECTOR, "[data-field]")
        }
    return out


def api_cells(answer: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {
        c["name"]: {
            "cpu.request": c["cpu"]["request"],
            "cpu.limit": c["cpu"]["limit"],
            "memory.request": c["memory"]["request"],
            "memory.limit": c["memory"]["limit"],
        }
        for c in answer["containers"]
    }


def resolution(d: WebDriver) -> dict[str, tuple[str, str]]:
    out = {}
    for row in d.find_elements(By.CSS_SELECTOR, "[data-testid=resolution] tbody tr"):
        out[row.get_attribute("data-field") or ""] = (
            by(row, "[data-testid=effective]").text,
            by(row, "[data-testid=source]").text,
        )
    return out


def no_alert(d: WebDriver) -> None:
    with pytest.raises(NoAlertPresentException):
        d.switch_to.alert.text  # noqa: B018


def fetch_status(d: WebDriver, method: str, path: str, body: Any) -> int:
    """A request the page's own origin sends with the tab's token, as a forged write would."""
    status: int = d.execute_async_script(
        """
        const [method, path, body, done] = arguments;
        fetch(path, {method, headers: {"Authorization": "Bearer " + sessionStorage.getItem("ci-sizer-token"),
                                       "Content-Type": "application/json"}, body: JSON.stringify(body)})
          .then(r => done(r.status), e => done(-1));
        """,
        method,
        path,
        body,
    )
    return status


# --------------------------------------------------------------------------- the tests


def test_find_a_job_by_filter_and_read_its_answer(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["read"])
    totals = by(driver, "[data-testid=totals]").text
    assert "GiB-h" in totals
    assert "core-h" in totals
    rows = filter_jobs(driver, q="test (3")
    assert [r.get_attribute("data-job") for r in rows] == ["test (3.12)"]
    open_job(driver, "test (3.12)")
    assert answer_cells(driver) == api_cells(sizing(server, TEST))
    assert by(driver, "[data-testid=phase]").text == sizing(server, TEST)["meta"]["phase"] == "confident"
    # every runner format is on the page, each with a copy button
    formats = driver.find_elements(By.CSS_SELECTOR, "pre[data-format]")
    assert {f.get_attribute("data-format") for f in formats} == set(RENDERERS)
    assert {"k8s", "gitlab", "dotenv", "argo", "tekton", "buildkite", "jenkins", "arc"} <= set(RENDERERS)
    assert len(driver.find_elements(By.CSS_SELECTOR, "button[data-action=copy]")) == len(formats)
    # the org-scope CPU limit pin is resolved field by field with its scope
    assert resolution(driver)["cpu.limit"] == ("4", "org")
    assert driver.find_elements(By.CSS_SELECTOR, "[data-testid=plot] svg")
    # a job with OOM kills: each is marked on the plot, and the answer backs off
    driver.get(f"{server}/ui/#fleet")
    _wait(lambda: by(driver, "#jobs-fragment section"), "the fleet view")
    open_job(driver, "integration")
    assert len(driver.find_elements(By.CSS_SELECTOR, "[data-testid=plot] svg .marker")) == 3
    assert answer_cells(driver) == api_cells(sizing(server, OOMY))


def test_job_override_changes_answer_and_resolution(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["admin"])
    open_job(driver, "build")
    before = answer_cells(driver)
    assert resolution(driver)["memory.limit"][1] == "algorithm"
    form = _wait(lambda: by(driver, "#job-override form"), "the job-scope override form")
    form.find_element(By.NAME, "memory_limit").send_keys("3Gi")
    form.find_element(By.NAME, "reason").send_keys("pinned from the browser")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _wait(lambda: resolution(driver)["memory.limit"] == ("3Gi", "job"), "the job-scope pin in the resolution")
    after = answer_cells(driver)
    assert after != before
    assert after["build"]["memory.limit"] == "3Gi"
    assert after == api_cells(sizing(server, BUILD))
    assert by(driver, "[data-testid=override-scope]").text == "job"
    assert override(server, BUILD).status_code == 200
    delete = _wait(lambda: by(driver, "#job-override [data-action=delete-override]"), "the delete button")
    delete.click()
    # a delete asks first (issue 34)
    _wait(lambda: by(driver, "#job-override [data-action=confirm-delete]").is_displayed(), "the confirmation")
    assert override(server, BUILD).status_code == 200
    by(driver, "#job-override [data-action=confirm-delete]").click()
    _wait(lambda: resolution(driver)["memory.limit"][1] == "algorithm", "the pin gone from the resolution")
    assert answer_cells(driver) == before == api_cells(sizing(server, BUILD))
    assert override(server, BUILD).status_code == 404


def test_read_only_token_has_no_write_control_and_a_forged_write_is_refused(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["read"])
    open_job(driver, "build")
    assert not driver.find_elements(By.CSS_SELECTOR, "#job-override, form.override-form, [data-action$=-override]")
    driver.get(f"{server}/ui/#overrides")
    _wait(lambda: by(driver, "[data-testid=overrides]"), "the overrides list")
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-action$=-override], form.override-form")
    path = "/api/v1/sizing/overrides/acme/web/" + quote(BUILD["workflow"], safe="") + "/build"
    assert fetch_status(driver, "PUT", path, {"memory_limit": "1Gi"}) == 403
    assert fetch_status(driver, "DELETE", "/api/v1/sizing/overrides/acme", None) == 403
    assert override(server, BUILD).status_code == 404
    assert (
        httpx.get(
            f"{server}/api/v1/sizing/overrides/acme", headers={"authorization": f"Bearer {SECRETS['admin']}"}
        ).json()["cpu_limit"]
        == "4"
    )


def _edit_in_tab(d: WebDriver, handle: str, url: str) -> WebElement:
    d.switch_to.window(handle)
    open_page(d, url, SECRETS["admin"])
    d.get(f"{url}/ui/#overrides")
    _wait(lambda: by(d, "[data-testid=overrides]"), "the overrides list")
    edit = [
        b
        for b in d.find_elements(By.CSS_SELECTOR, "[data-action=edit-override]")
        if b.get_attribute("data-job") == "test (3.12)"
    ]
    assert len(edit) == 1
    edit[0].click()
    return _wait(lambda: by(d, "#override-editor form"), "the override editor")


def test_two_tabs_edit_one_override(driver: WebDriver, server: str, screenshots: Path) -> None:
    path = "/".join(quote(TEST[k], safe="") for k in ("org", "repo", "workflow", "job"))
    admin = {"authorization": f"Bearer {SECRETS['admin']}"}
    r = httpx.put(f"{server}/api/v1/sizing/overrides/{path}", json={"memory_limit": "2Gi"}, headers=admin)
    assert r.status_code == 201, r.text
    first = driver.current_window_handle
    driver.switch_to.new_window("tab")
    second = driver.current_window_handle
    try:
        form_b = _edit_in_tab(driver, second, server)
        form_a = _edit_in_tab(driver, first, server)
        # tab A saves first
        field = form_a.find_element(By.NAME, "memory_limit")
        field.clear()
        field.send_keys("5Gi")
        form_a.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        _wait(lambda: override(server, TEST).json()["memory_limit"] == "5Gi", "tab A's write")
        # tab B, opened before A saved, gets the conflict view, and A's value stays
        driver.switch_to.window(second)
        form_b = by(driver, "#override-editor form")
        field = form_b.find_element(By.NAME, "memory_limit")
        field.clear()
        field.send_keys("6Gi")
        form_b.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        conflict = _wait(lambda: by(driver, "[data-testid=conflict]:not([hidden])"), "the conflict view")
        assert by(conflict, "[data-field=memory_limit]").text == "5Gi"
        assert override(server, TEST).json()["memory_limit"] == "5Gi"  # nothing lost
        assert form_b.find_element(By.NAME, "memory_limit").get_attribute("value") == "6Gi"  # nor the operator's input
        shot(driver, screenshots / "overrides-conflict.png")
        # the operator retries on top of what is stored now
        by(conflict, "[data-action=retry-override]").click()
        _wait(lambda: override(server, TEST).json()["memory_limit"] == "6Gi", "tab B's retried write")
        driver.get(f"{server}/ui/#overrides")
        _wait(lambda: by(driver, "[data-testid=overrides]"), "the overrides list")
        shot(driver, screenshots / "overrides.png")
    finally:
        driver.switch_to.window(second)
        driver.close()
        driver.switch_to.window(first)
        httpx.delete(f"{server}/api/v1/sizing/overrides/{path}", headers=admin)


def test_hostile_job_name_renders_as_text(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["admin"])
    rows = filter_jobs(driver, q="script")
    assert [r.get_attribute("data-job") for r in rows] == [HOSTILE]
    names = rows[0].find_elements(By.CSS_SELECTOR, "[data-action=open-job]")
    assert [n.text for n in names] == [HOSTILE]
    assert "<b>repo</b>" in rows[0].text  # the repo's markup is text too
    assert not driver.find_elements(By.CSS_SELECTOR, "#view script, #view b")
    no_alert(driver)
    names[0].click()
    _wait(lambda: by(driver, "[data-testid=job-name]").text == HOSTILE, "the hostile job's view")
    assert not driver.find_elements(By.CSS_SELECTOR, "#view script, #view b")
    assert answer_cells(driver) == api_cells(sizing(server, EVIL))
    no_alert(driver)
    driver.get(f"{server}/ui/#overrides")
    _wait(lambda: by(driver, "[data-testid=overrides]"), "the overrides list")
    no_alert(driver)


def test_analyses_view_runs_a_backtest(driver: WebDriver, server: str, screenshots: Path) -> None:
    open_page(driver, server, SECRETS["admin"])
    driver.get(f"{server}/ui/#analyses")
    form = _wait(lambda: by(driver, "#backtest-form"), "the backtest form")
    form.find_element(By.NAME, "org").send_keys("acme")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _wait(
        lambda: by(driver, "[data-testid=analysis]").get_attribute("data-status") == "done",
        "the backtest to finish",
        timeout=60,
    )
    table = by(driver, "[data-testid=analysis-table]").text
    assert "ci-sizer" in table
    shot(driver, screenshots / "analyses.png")


def test_the_token_stays_out_of_urls_and_logs(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["admin"])
    open_job(driver, "build")
    assert SECRETS["admin"] not in driver.current_url
    entries = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert entries
    assert not [e for e in entries if SECRETS["admin"] in e]
    assert driver.get_cookies() == []
    log = LOGS[server].read_text()
    assert "GET /ui/fragments/job" in log or "/ui/fragments/job" in log
    assert not [s for s in SECRETS.values() if s in log]
