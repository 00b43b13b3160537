"""The operator's page, round 2 (issue 34), in a real browser on a realistic fleet: three orgs, 56 jobs,
about 600 runs over two weeks, OOM kills, sidecars, a repo pin below what a job uses and a CPU pin that
throttles (``fleet_data.py``), on PostgreSQL, at desktop and phone widths.

One live server and one browser serve every test of the module. Tests that write make an org of
their own and look only at it; the others read the realistic fleet, which nothing here changes.
Each defect of the issue has a test that fails on the page as it was before.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy.engine import make_url

from service import migrations
from service.wire import utcnow

from ..conftest import _admin
from ..live import LiveServer
from ..pg import PostgresServer
from ..test_auth import SECRETS, write_tokens
from . import fleet_data
from .browser import (
    PHONE,
    all_of,
    api,
    bearer,
    by,
    filter_jobs,
    go,
    in_viewport,
    open_page,
    page_overflows,
    shot,
    summarised,
    wait,
)
from .fleet_data import GIB, LINKER, MIB

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402

#: the CI tier (README): a real Chromium drives the page
pytestmark = pytest.mark.ci


@pytest.fixture(scope="module")
def fleet() -> fleet_data.Fleet:
    return fleet_data.build()


@pytest.fixture(scope="module")
def database(postgres_server: PostgresServer) -> Iterator[str]:
    """A database of the module's own, migrated: the tests of other modules (which empty the shared
    ones after each test) never touch the fleet, in one process or several."""
    name = f"ci_sizer_ui_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres_server.url, f'CREATE DATABASE "{name}"'))
    url = make_url(postgres_server.url).set(database=name).render_as_string(hide_password=False)
    try:
        migrations.upgrade(url)
        yield url
    finally:
        asyncio.run(_admin(postgres_server.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def server(
    browser_binary: str,
    database: str,
    tmp_path_factory: pytest.TempPathFactory,
    fleet: fleet_data.Fleet,
) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("ui-operator")
    live = LiveServer(
        database,
        "--tokens-file",
        str(write_tokens(tmp / "tokens.toml")),
        log=tmp / "serve.log",
        env={"CI_SIZER_JOBS_SUMMARY_SECONDS": "0.2"},
    )
    with live:
        fleet_data.post(live.url, bearer("ingest"), fleet)
        # the pin: 2Gi for a repo whose linker peaks at 6.6 GiB; and a CPU limit that throttles
        for path, body in (
            ("acme/web", {"memory_limit": "2Gi", "reason": "web builds are small"}),
            ("globex/infra", {"cpu_limit": "500m", "reason": "terraform is single-threaded"}),
        ):
            assert api(live.url, "PUT", f"/api/v1/sizing/overrides/{path}", json=body).status_code == 201
        wait(lambda: summarised(live.url, len(fleet.jobs())), "the fleet's summaries", timeout=60)
        wait(lambda: _item(live.url, LINKER)["override_scope"] == "repo", "the pinned job's summary", timeout=30)
        yield live.url


# --------------------------------------------------------------------------- helpers


def _path(key: tuple[str, ...]) -> str:
    return "/".join(quote(k, safe="") for k in key)


def _items(url: str, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        r = api(url, "GET", "/api/v1/jobs", params={"limit": 500, **params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        items += r.json()["items"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return items


A = TypeVar("A")
P = TypeVar("P")


def _page_between_api_reads(
    read_api: Callable[[], A], read_page: Callable[[], P], same: Callable[[A], object] = lambda a: a
) -> tuple[P, A]:
    """What the page shows and what the API says, with no summaries' pass between them: the summaries' pass
    may land between the page's read and the API's (a CI run under load met it), so the API is read before
    and after the page, and both are read again (up to three times) when the two API reads differ."""
    for _ in range(3):
        before = read_api()
        page = read_page()
        after = read_api()
        if same(after) == same(before):
            break
    return page, after


def _item(url: str, key: tuple[str, str, str, str]) -> dict[str, Any]:
    org, repo, workflow, job = key
    (found,) = [i for i in _items(url, org=org, repo=repo, workflow=workflow) if i["job"] == job]
    return found


def _totals(url: str, **params: Any) -> dict[str, Any]:
    totals: dict[str, Any] = api(url, "GET", "/api/v1/jobs", params={"limit": 1, **params}).json()["totals"]
    return totals


def _runs(org: str, job: str, peaks: list[int], *, limit: int = 16 * GIB, repo: str = "web") -> list[dict[str, Any]]:
    now = utcnow()
    out = []
    for n, peak in enumerate(peaks):
        finished = now - timedelta(hours=2 * n + 1)
        out.append(
            {
                "org": org,
                "repo": repo,
                "workflow": "ci.yml",
                "job": job,
                "run_id": f"{job}-{n}",
                "started_at": (finished - timedelta(minutes=20)).isoformat() + "Z",
                "finished_at": finished.isoformat() + "Z",
                "containers": [
                    {
                        "name": "build",
                        "cpu_stats_millicores": dict.fromkeys(("peak", "p99", "p95", "p75", "p50", "avg"), 700.0),
                        "memory_peak_bytes": peak,
                        "memory_limit_bytes": limit,
                        "cpu_request_millicores": 2000,
                    }
                ],
            }
        )
    return out


def _seed(url: str, runs: list[dict[str, Any]]) -> None:
    r = httpx.post(f"{url}/api/v1/runs:batch", json={"runs": runs}, headers=bearer("ingest"), timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["created"] == len(runs), r.text
    orgs = {r["org"] for r in runs}
    jobs = {(r["org"], r["job"]) for r in runs}
    for org in orgs:
        wait(lambda o=org: summarised(url, len([j for j in jobs if j[0] == o]), org=o), f"{org}'s summaries")


def _new_override(d: WebDriver, url: str) -> WebElement:
    go(d, "#overrides", "#overrides-fragment > section")

    def click_new() -> bool:
        # found and clicked in one step, again if the list's fragment was drawn anew in between (a CI run
        # under load met the button gone stale between the two)
        by(d, "[data-action=new-override]").click()
        return True

    wait(click_new, "the new-override button")
    return wait(lambda: by(d, "#override-editor form"), "the override editor")


def _type(form: WebElement, **values: str) -> None:
    for name, value in values.items():
        el = form.find_element(By.NAME, name)
        el.clear()
        if value:
            el.send_keys(value)


def _field_error(form: WebElement, name: str) -> str:
    slot = by(form, f".field-error[data-error-for={name}]")
    return slot.text if slot.is_displayed() else ""


def _money(value: float) -> str:
    """An amount as the page writes it (whole units from 100, cents from 1, three decimals below)."""
    digits = 0 if abs(value) >= 100 else 2 if abs(value) >= 1 else 3
    return f"{value:,.{digits}f} USD"


def _cells(row: WebElement) -> dict[str, str]:
    return {c.get_attribute("data-label") or "": c.text for c in row.find_elements(By.CSS_SELECTOR, "td")}


# --------------------------------------------------------------------------- money, severity, trends
# (first: they read the realistic fleet alone, and make the screenshots of docs/ui.md)


def test_money_in_the_fleet_totals_groups_and_rows_is_the_api_s(driver: WebDriver, server: str) -> None:
    def api_reads() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, float]]:
        repos = {i["repo"] for i in _items(server, org="initech")}
        return (
            _totals(server, org="initech"),
            _items(server, org="initech", sort="money"),
            {repo: _totals(server, org="initech", repo=repo)["saved_money"]["per_day"] for repo in repos},
        )

    def page_reads() -> tuple[str, str, list[str | None], dict[str, str]]:
        open_page(driver, server, SECRETS["admin"], "#fleet?org=initech&sort=money")
        groups = {
            (g.get_attribute("data-group") or "").split("/", 1)[1]: by(g, "[data-money=day]").text
            for g in all_of(driver, "[data-testid=by-repo] tbody tr")
        }
        rows = [r.get_attribute("data-job") for r in all_of(driver, "#jobs-fragment tbody tr[data-job]")]
        return by(driver, "[data-total=money_day]").text, by(driver, "[data-total=money_month]").text, rows, groups

    (shown_day, shown_month, rows, groups), (totals, items, by_repo) = _page_between_api_reads(api_reads, page_reads)
    assert shown_day == _money(totals["saved_money"]["per_day"])
    assert shown_month == _money(totals["saved_money"]["per_month"])
    assert rows == [i["job"] for i in items]
    money = [i["saved_money"]["per_day"] for i in items]
    assert money == sorted(money, reverse=True)
    # by repo: each group is the API's totals of that repo
    assert len(groups) == 3
    assert groups == {repo: _money(day) for repo, day in by_repo.items()}


def test_severity_sorts_and_colours_the_fleet_with_a_row_per_container(
    driver: WebDriver, server: str, fleet: fleet_data.Fleet, screenshots: Path
) -> None:
    open_page(driver, server, SECRETS["admin"], "#fleet?sort=risk")
    rows = all_of(driver, "#jobs-fragment tbody tr[data-job]")
    levels = [next((lvl for lvl in ("critical", "high", "warn") if f"risk-{lvl}" in (r.get_attribute("class") or "")), "")
              for r in rows]  # fmt: skip
    order = {"critical": 0, "high": 1, "warn": 2, "": 3}
    assert [order[lvl] for lvl in levels] == sorted(order[lvl] for lvl in levels)
    assert {"critical", "high", "warn"} <= set(levels)
    colour = driver.execute_script(
        "return getComputedStyle(arguments[0].querySelector('td')).boxShadow", rows[levels.index("critical")]
    )
    assert "176, 0, 32" in colour  # the critical red
    # the throttled jobs are those the CPU pin holds below their p95
    throttled = {r.get_attribute("data-job") for r, lvl in zip(rows, levels, strict=True) if lvl == "warn"}
    assert throttled
    assert throttled <= set(fleet_data.LAYOUT["globex"]["infra"]["terraform.yml"])
    # a pod with a sidecar has a row per container
    side = wait(  # drawn with its job's row, which a CI run under load read before they were there
        lambda: all_of(driver, "#jobs-fragment tr.container-row[data-parent=docker-image]"), "docker-image's containers"
    )
    assert [r.get_attribute("data-container") for r in side] == ["build", "dind"]
    assert "peak 8" in side[1].text or "peak 9" in side[1].text  # the Docker daemon's ~900 MiB
    shot(driver, screenshots / "fleet.png", size=(1400, 1700), whole=False)
    driver.set_window_size(*PHONE)
    try:
        wait(lambda: driver.execute_script("return window.innerWidth") <= PHONE[0], "the phone width")
        assert not page_overflows(driver)
        card = all_of(driver, "#jobs-fragment tbody tr[data-job]")[0]
        assert driver.execute_script("return getComputedStyle(arguments[0]).display", card) == "block"
        assert in_viewport(driver, by(driver, "[data-total=money_day]"))
        shot(driver, screenshots / "fleet-phone.png", size=(PHONE[0], 1400), whole=False, at="[data-testid=jobs]")
    finally:
        driver.set_window_size(1400, 1000)


def _days_in_trend(d: WebDriver) -> dict[str, tuple[int, int]]:
    out = {}
    for row in all_of(d, "[data-testid=trend] tbody tr"):
        day = row.get_attribute("data-day") or ""
        runs, kills = (by(row, f"[data-series={k}]").get_attribute("textContent") or "" for k in ("runs", "oom_kills"))
        out[day] = (int(runs), int(kills))  # textContent: the table may be folded away
    return out


def _expected_days(runs: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for r in runs:
        day = r["finished_at"][:10]
        killed = any(c.get("oom_killed") for c in r["containers"])
        got = out.setdefault(day, [0, 0])
        got[0] += 1
        got[1] += killed
    return {day: (n, k) for day, (n, k) in out.items()}


def test_trends_of_the_fleet_an_org_and_a_job(
    driver: WebDriver, server: str, fleet: fleet_data.Fleet, screenshots: Path
) -> None:
    open_page(driver, server, SECRETS["admin"], "#trends?org=globex", "[data-testid=trend]")
    globex = [r for r in fleet.runs if r["org"] == "globex"]
    shown = {day: got for day, got in _days_in_trend(driver).items() if got != (0, 0)}
    assert shown == _expected_days(globex)
    assert sum(k for _, k in shown.values()) > 0  # the OOM kills are there
    assert "could save" in by(driver, "[data-testid=trend-plot]").text
    go(driver, "#trends", "[data-testid=trend]")
    assert int(by(driver, "[data-sum=runs]").text) >= len(fleet.runs)  # other tests add runs of their own orgs
    shot(driver, screenshots / "trends.png")
    # a job: its trend, and its runs by date with their ids, each peak's dot naming its run
    key = ("globex", "data", "pipeline.yml", "spark-tests")
    mine = [r for r in fleet.runs if (r["org"], r["repo"], r["workflow"], r["job"]) == key]
    go(driver, "#job/" + _path(key), "[data-testid=runs]")
    assert {d: g for d, g in _days_in_trend(driver).items() if g != (0, 0)} == _expected_days(mine)
    ids = [c.text for c in all_of(driver, "[data-testid=runs] [data-testid=run-id]")]
    assert ids == [r["run_id"] for r in sorted(mine, key=lambda r: r["finished_at"], reverse=True)]
    titles = driver.execute_script(
        "return Array.from(document.querySelectorAll('[data-testid=plot] .dot title')).map(t => t.textContent)"
    )
    assert any(mine[0]["run_id"] in t for t in titles)
    assert len(all_of(driver, "[data-testid=plot] .marker")) == 2 * 1  # the two newest runs' kills, on build
    shot(driver, screenshots / "job-oom.png")
    driver.set_window_size(*PHONE)
    try:
        wait(lambda: driver.execute_script("return window.innerWidth") <= PHONE[0], "the phone width")
        assert not page_overflows(driver)
        for svg in all_of(driver, "figure.plot svg"):
            assert driver.execute_script("return arguments[0].getBoundingClientRect().right", svg) <= PHONE[0]
        shot(driver, screenshots / "job-phone.png", size=PHONE, whole=False)
    finally:
        driver.set_window_size(1400, 1000)


def _avoided(runs: list[dict[str, Any]]) -> int:
    """Kills avoided, as growths/service.py and trends.py count them: grown past the first limit, not killed."""
    return sum(
        any(
            c.get("growths")
            and any(g["result"] == "grown" for g in c["growths"])
            and c["memory_peak_bytes"] > c["growths"][0]["from_bytes"]
            for c in r["containers"]
        )
        and not any(c.get("oom_killed") for c in r["containers"])
        for r in runs
    )


def test_kills_avoided_by_growth_in_the_trends_and_on_the_job_page(
    driver: WebDriver, server: str, fleet: fleet_data.Fleet
) -> None:
    # issue 34's growths series, from issue 40's events: the fleet's trend, an org's, and a grown job's page
    grown = [r for r in fleet.runs if (r["org"], r["repo"], r["workflow"], r["job"]) in fleet_data.GROWN]
    assert _avoided(grown) > 0
    open_page(driver, server, SECRETS["admin"], "#trends?org=globex", "[data-testid=trend]")
    globex = [r for r in fleet.runs if r["org"] == "globex"]
    assert int(by(driver, "[data-sum=growths]").get_attribute("textContent") or "") == _avoided(globex)
    assert "kills avoided" in by(driver, "[data-testid=trend-plot]").text
    key = sorted(fleet_data.GROWN)[0]
    mine = [r for r in fleet.runs if (r["org"], r["repo"], r["workflow"], r["job"]) == key]
    go(driver, "#job/" + _path(key), "[data-testid=kills-avoided]")
    # the job's trend: its 30 days; the figure beside its answer: the last 7 (the growths API's window)
    assert int(by(driver, "[data-sum=growths]").get_attribute("textContent") or "") == _avoided(mine)
    week = (utcnow() - timedelta(days=7)).isoformat()
    recent = _avoided([r for r in mine if r["finished_at"] >= week])
    shown = by(driver, "[data-testid=kills-avoided]").text
    assert shown.split()[0] == str(recent), shown
    assert api(server, "GET", "/api/v1/growths/" + _path(key)).json()["kills_avoided"] == recent


def test_the_job_view_of_the_pinned_linker(driver: WebDriver, server: str, screenshots: Path) -> None:
    open_page(driver, server, SECRETS["admin"], "#job/" + _path(LINKER), "[data-testid=risk-alert]")
    assert by(driver, "[data-testid=override-scope]").text == "repo"
    wait(lambda: by(driver, "#job-override form"), "the editor")
    shot(driver, screenshots / "job.png")


# --------------------------------------------------------------------------- defect 1: pins below use


def test_a_pin_below_what_jobs_use_is_named_and_confirmed_before_it_is_written(
    driver: WebDriver, server: str, screenshots: Path
) -> None:
    org = "pin-guard"
    _seed(server, _runs(org, "link", [int(6.6 * GIB)] * 4) + _runs(org, "lint", [300 * MIB] * 4))
    open_page(driver, server, SECRETS["admin"])
    form = _new_override(driver, server)
    _type(form, org=org, repo="web", memory_limit="2Gi", reason="web builds are small")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    check = wait(lambda: by(form, "[data-testid=pin-check]:not([hidden])"), "the pin check")
    # the jobs it would put below their peak are named, with their peaks; the others are not
    items = check.find_elements(By.CSS_SELECTOR, "li")
    assert [i.get_attribute("data-job") for i in items] == ["link"]
    assert "2Gi < peak 6.6 GiB" in items[0].text
    confirm = by(check, "[data-action=confirm-pin]")
    assert "pin-guard / web / ci.yml / link" in confirm.text
    shot(driver, screenshots / "pin-check.png", whole=False)
    assert api(server, "GET", f"/api/v1/sizing/overrides/{org}/web").status_code == 404  # nothing written yet
    by(check, "[data-action=cancel-pin]").click()
    assert not check.is_displayed()
    assert api(server, "GET", f"/api/v1/sizing/overrides/{org}/web").status_code == 404
    # asked again, and confirmed this time
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(lambda: by(form, "[data-testid=pin-check]:not([hidden]) [data-action=confirm-pin]"), "the pin check").click()
    wait(lambda: api(server, "GET", f"/api/v1/sizing/overrides/{org}/web").status_code == 200, "the confirmed pin")
    # a pin that puts nobody below their peak is written at once
    form = _new_override(driver, server)
    _type(form, org=org, repo="web", workflow="ci.yml", job="lint", memory_limit="1Gi")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(lambda: api(server, "GET", f"/api/v1/sizing/overrides/{org}/web/ci.yml/lint").status_code == 200, "the pin")


def test_a_job_pinned_below_its_peak_is_at_risk_and_its_saving_is_not_counted(driver: WebDriver, server: str) -> None:
    org, repo, _, job = LINKER
    open_page(driver, server, SECRETS["read"])
    row = next(r for r in filter_jobs(driver, org=org, repo=repo) if r.get_attribute("data-job") == job)
    assert "risk-critical" in (row.get_attribute("class") or "")
    cells = _cells(row)
    assert "pinned below peak" in cells["risk"]
    assert "none: below peak" in cells["saved / day"]
    assert by(driver, "[data-total=pinned_below_peak]").text == "1"
    # the API says the same, and the totals count only what the other jobs save
    item = _item(server, LINKER)
    assert item["risk"] == {"level": "critical", "reasons": ["pinned below peak"]}
    assert item["saved_per_day"]["memory_gib_hours"] is None  # no saving: it is killed instead
    others = [i for i in _items(server, org=org, repo=repo) if i["job"] != job]
    saved = sum(i["saved_per_day"]["memory_gib_hours"] or 0 for i in others)
    assert _totals(server, org=org, repo=repo)["saved_memory_gib_hours_per_day"] == pytest.approx(saved, abs=0.01)
    row.find_element(By.CSS_SELECTOR, "[data-action=open-job]").click()
    alert = wait(lambda: by(driver, "[data-testid=risk-alert]"), "the job's risk alert")
    assert "risk-critical" in (alert.get_attribute("class") or "")
    peak = item["containers"][0]["used"]["memory_peak_bytes"]
    assert f"below its peak of {peak / GIB:.3g} GiB" in alert.text
    assert "pinned at repo scope" in alert.text
    assert by(driver, "[data-testid=job-risk]").text == "pinned below peak"


def test_a_memory_pin_below_the_floor_is_refused_with_its_reason(driver: WebDriver, server: str) -> None:
    org = "floor"
    _seed(server, _runs(org, "build", [700 * MIB] * 3))
    open_page(driver, server, SECRETS["admin"], f"#job/{org}/web/ci.yml/build", "#job-override form")
    form = by(driver, "#job-override form")
    _type(form, memory_limit="500")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text = wait(lambda: _field_error(form, "memory_limit"), "the floor's reason beside the field")
    assert "500 bytes" in text.replace(",", "")
    assert "128Mi" in text
    assert "did you mean 500Mi?" in text
    assert form.find_element(By.NAME, "memory_limit").get_attribute("aria-invalid") == "true"
    assert api(server, "GET", f"/api/v1/sizing/overrides/{org}/web/ci.yml/build").status_code == 404


# --------------------------------------------------------------------------- defects 2 and 3: the editor's errors


def test_a_gap_in_the_scope_fields_is_an_error_naming_the_missing_field(driver: WebDriver, server: str) -> None:
    org = "gap"
    open_page(driver, server, SECRETS["admin"])
    form = _new_override(driver, server)
    _type(form, org=org, job="build", memory_limit="4Gi")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text = wait(lambda: _field_error(form, "repo"), "the error beside repo")
    assert "Fill in the repo" in text
    assert "job is set" in text
    assert form.find_element(By.NAME, "repo").get_attribute("aria-invalid") == "true"
    assert api(server, "GET", "/api/v1/sizing/overrides", params={"org": org}).json()["items"] == []


def test_form_errors_show_each_reason_of_the_api_beside_its_field(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["admin"])
    form = _new_override(driver, server)
    _type(form, org="errors", memory_limit="12XB", cpu_limit="lots")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    memory = wait(lambda: _field_error(form, "memory_limit"), "the memory limit's reason")
    assert "'12XB' is not a Kubernetes quantity" in memory
    assert "'lots' is not a Kubernetes quantity" in _field_error(form, "cpu_limit")
    for name in ("memory_limit", "cpu_limit"):
        assert form.find_element(By.NAME, name).get_attribute("aria-invalid") == "true"
    assert form.find_element(By.NAME, "cpu_request").get_attribute("aria-invalid") is None
    assert "422" in by(form, "[data-testid=form-status]").text


# --------------------------------------------------------------------------- defect 4: navigation errors


def test_a_navigation_error_is_shown_where_the_user_looks(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["read"])  # a token for acme only
    driver.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    driver.execute_script("location.hash = '#job/globex/platform/.gitlab-ci.yml/compile'")
    box = wait(lambda: by(driver, "[data-testid=error-view]"), "the error view")
    assert in_viewport(driver, box)
    assert "Cannot show the job globex / platform / .gitlab-ci.yml / compile" in box.text
    assert "403" in box.text
    # the view does not pretend to be the fleet any more
    assert not all_of(driver, "#view [data-testid=jobs], #view #job-filter")
    assert not all_of(driver, "#nav a.active")


# --------------------------------------------------------------------------- defect 5: the smaller ones


def test_observed_memory_reads_as_mib_or_gib(driver: WebDriver, server: str) -> None:
    open_page(
        driver,
        server,
        SECRETS["read"],
        "#job/acme/api/.github%2Fworkflows%2Fci.yml/integration",
        "[data-testid=answer]",
    )
    # the cell "observed CPU / memory" of each container (build and its postgres sidecar)
    cells = [
        c.text for r in all_of(driver, "[data-testid=answer] tbody tr") for c in all_of(r, "td") if " / " in c.text
    ]
    assert len(cells) == 2
    for text in cells:
        assert re.fullmatch(r"\S+ / \d+(\.\d+)? (MiB|GiB)", text), text
    assert not re.search(r"\d{6,}", by(driver, "[data-testid=answer]").text)


def test_the_job_plot_fits_a_phone_and_a_single_run_is_a_dot(driver: WebDriver, server: str) -> None:
    org = "one-run"
    _seed(server, _runs(org, "build", [900 * MIB]))
    open_page(driver, server, SECRETS["admin"], f"#job/{org}/web/ci.yml/build", "[data-testid=plot] svg")
    svg = by(driver, "[data-testid=plot] svg")
    assert svg.get_dom_attribute("viewBox")
    # the one run is a dot (its peak, and the limit it ran with), the peak's naming the run
    assert len(svg.find_elements(By.CSS_SELECTOR, ".dot")) == 2
    (title,) = svg.find_elements(By.CSS_SELECTOR, ".dot title")
    assert "run build-0" in (title.get_attribute("textContent") or "")
    ticks = [t.text for t in svg.find_elements(By.CSS_SELECTOR, "text[text-anchor=middle]") if t.text.strip()]
    assert ticks
    assert all(re.fullmatch(r"\d+|run \(oldest to newest\)", t) for t in ticks), ticks
    driver.set_window_size(*PHONE)
    try:
        wait(lambda: driver.execute_script("return window.innerWidth") <= PHONE[0], "the phone width")
        width = driver.execute_script("return arguments[0].getBoundingClientRect().width", svg)
        assert 0 < width <= PHONE[0]
        assert not page_overflows(driver)
    finally:
        driver.set_window_size(1400, 1000)


def test_the_backtest_counts_runs_and_shares_one_denominator(
    driver: WebDriver, server: str, fleet: fleet_data.Fleet
) -> None:
    open_page(driver, server, SECRETS["admin"], "#analyses", "#backtest-form")
    form = by(driver, "#backtest-form")
    form.find_element(By.NAME, "org").send_keys("acme")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(lambda: by(driver, "[data-testid=analysis]").get_attribute("data-status") == "done", "the backtest", 60)
    table = by(driver, "[data-testid=analysis-table]").text
    acme = [r for r in fleet.runs if r["org"] == "acme"]
    assert table.startswith(f"{len(acme)} runs of ")  # runs, not container-runs (acme has sidecars)
    assert f"{sum(len(r['containers']) for r in acme)} container-runs" in table.splitlines()[0]
    analysis = by(driver, "[data-testid=analysis-link]").text
    result = api(server, "GET", f"/api/v1/backtests/{analysis}").json()["result"]
    for policy in result["policies"]:
        row = next(line for line in table.splitlines() if line.startswith(policy["label"]))
        if policy["throttle_share"] is None:
            continue
        shown = f"{policy['throttled_runs']} ({policy['throttled_runs'] / policy['runs_scored']:.1%})"
        assert shown in row, (policy["label"], row)
    krr = next(p for p in result["policies"] if "KRR" in p["label"])
    assert krr["throttled_runs"] < krr["runs_scored"] / 2  # no CPU limit past its first run: rarely throttled


def test_each_fleet_row_says_when_it_was_computed(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["read"])
    # the summaries' pass runs every 30 s and may land between the page's read and the API's
    rows, items = _page_between_api_reads(
        lambda: _items(server, org="acme", sort="name"),
        lambda: filter_jobs(driver, org="acme", sort="name"),
        same=lambda items: [i["summarised_at"] for i in items],
    )
    assert [r.get_attribute("data-job") for r in rows] == [i["job"] for i in items]
    for row, item in zip(rows, items, strict=True):
        cell = by(row, "[data-testid=as-of]")
        assert cell.text == item["summarised_at"][11:19]
        assert cell.get_attribute("title") == item["summarised_at"]
    text = by(driver, ".pager .hint").text
    assert "at most every 30 s while its runs keep coming" in text


def test_delete_asks_for_confirmation(driver: WebDriver, server: str) -> None:
    org = "deletes"
    assert api(server, "PUT", f"/api/v1/sizing/overrides/{org}", json={"cpu_limit": "2"}).status_code == 201
    open_page(driver, server, SECRETS["admin"], "#overrides", "[data-testid=overrides]")
    by(driver, f"[data-action=edit-override][data-org={org}]").click()
    form = wait(lambda: by(driver, "#override-editor form"), "the editor")
    by(form, "[data-action=delete-override]").click()
    confirm = wait(lambda: by(form, "[data-testid=delete-confirm]:not([hidden])"), "the confirmation")
    assert api(server, "GET", f"/api/v1/sizing/overrides/{org}").status_code == 200
    by(confirm, "[data-action=cancel-delete]").click()
    assert not confirm.is_displayed()
    assert api(server, "GET", f"/api/v1/sizing/overrides/{org}").status_code == 200
    by(form, "[data-action=delete-override]").click()
    wait(lambda: by(form, "[data-action=confirm-delete]").is_displayed(), "the confirmation")
    by(form, "[data-action=confirm-delete]").click()
    wait(lambda: api(server, "GET", f"/api/v1/sizing/overrides/{org}").status_code == 404, "the delete")


def test_filters_and_sort_live_in_the_address_and_apply_at_once(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["admin"])
    filter_jobs(driver, org="globex")
    assert "org=globex" in driver.current_url
    before = [r.get_attribute("data-job") for r in all_of(driver, "#jobs-fragment tbody tr[data-job]")]
    select = by(driver, "#job-filter select[name=sort]")
    driver.execute_script("arguments[0].dataset.old = '1'", by(driver, "#jobs-fragment > section"))
    next(o for o in select.find_elements(By.TAG_NAME, "option") if o.get_attribute("value") == "name").click()
    # no Filter button pressed
    wait(lambda: by(driver, "#jobs-fragment > section:not([data-old])"), "the list sorted by name")
    assert "sort=name" in driver.current_url
    assert "org=globex" in driver.current_url
    after = [r.get_attribute("data-job") for r in all_of(driver, "#jobs-fragment tbody tr[data-job]")]
    assert after != before
    assert after == [i["job"] for i in _items(server, org="globex", sort="name")]
    driver.refresh()
    wait(lambda: by(driver, "#jobs-fragment > section"), "the fleet after a reload")
    assert by(driver, "#job-filter input[name=org]").get_attribute("value") == "globex"
    assert by(driver, "#job-filter select[name=sort]").get_attribute("value") == "name"
    assert [r.get_attribute("data-job") for r in all_of(driver, "#jobs-fragment tbody tr[data-job]")] == after


def test_a_read_only_token_is_told_it_is_read_only(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["read"])
    badge = wait(lambda: by(driver, "#who [data-testid=read-only]"), "the read-only badge")
    assert badge.is_displayed()
    assert badge.text == "read-only"
    go(driver, "#job/acme/api/.github%2Fworkflows%2Fci.yml/build", "[data-testid=job-view]")
    assert "admin role" in by(driver, "[data-testid=read-only-note]").text
    go(driver, "#overrides", "#overrides-fragment > section")
    assert by(driver, "[data-testid=read-only-note]").is_displayed()
    open_page(driver, server, SECRETS["admin"])
    assert not all_of(driver, "#who [data-testid=read-only]")


def test_the_job_page_says_what_the_job_runs_with_and_saves(
    driver: WebDriver, server: str, fleet: fleet_data.Fleet
) -> None:
    key = ("acme", "mobile", "ci.yml", "bundle")
    newest = max(
        (r for r in fleet.runs if (r["org"], r["repo"], r["workflow"], r["job"]) == key), key=lambda r: r["finished_at"]
    )
    limit = newest["containers"][0]["memory_limit_bytes"]

    def saving_shown() -> str:
        open_page(driver, server, SECRETS["read"], "#job/" + _path(key), "[data-testid=today]")
        return by(driver, "[data-testid=saving]").text

    saving, item = _page_between_api_reads(lambda: _item(server, key), saving_shown)
    assert (
        by(driver, "[data-testid=runs-with]").text
        == f"memory limit {limit // GIB}Gi, CPU request {newest['containers'][0]['cpu_request_millicores'] // 1000}"
    )
    assert saving.startswith(_money(item["saved_money"]["per_day"]) + " (" + _money(item["saved_money"]["per_month"]))
    assert "in force" not in by(driver, "#view").text.lower()
    go(driver, "#fleet", "#jobs-fragment > section")
    assert "in force" not in by(driver, "#view").text.lower()


def test_past_analyses_can_be_found_again(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["admin"], "#analyses", "#backtest-form")
    form = by(driver, "#backtest-form")
    form.find_element(By.NAME, "org").send_keys("globex")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(lambda: "#analysis/backtest/" in driver.current_url, "the analysis's own address")
    analysis = driver.current_url.rsplit("/", 1)[1]
    wait(lambda: by(driver, "[data-testid=analysis]").get_attribute("data-status") == "done", "the backtest", 60)
    go(driver, "#analyses", "#backtest-form")
    row = by(driver, f"[data-testid=past-analyses] tr[data-analysis='{analysis}']")
    assert "globex" in row.text
    by(row, "[data-testid=open-analysis]").click()
    wait(lambda: by(driver, "[data-testid=analysis-table]"), "the past analysis")
    driver.refresh()  # its address opens it again
    wait(lambda: by(driver, "[data-testid=analysis-table]"), "the analysis after a reload")
    assert by(driver, "[data-testid=analysis-link]").text == analysis


def test_a_backtest_of_an_unknown_org_is_refused_with_the_reason(driver: WebDriver, server: str) -> None:
    open_page(driver, server, SECRETS["admin"], "#analyses", "#backtest-form")
    before = len(all_of(driver, "[data-testid=past-analyses] tr[data-analysis]"))
    form = by(driver, "#backtest-form")
    form.find_element(By.NAME, "org").send_keys("no-such-org")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    status = wait(lambda: by(form, ".form-status"), "the refusal")
    assert "422" in status.text
    assert "no stored run of org 'no-such-org'" in status.text
    assert "#analysis/" not in driver.current_url
    go(driver, "#analyses", "#backtest-form")
    assert len(all_of(driver, "[data-testid=past-analyses] tr[data-analysis]")) == before
