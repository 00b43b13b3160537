"""The operator's page without a browser: its shell and assets, its fragments' data (the same
services as the API), escaping, token checks and headers; on both databases."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.plots import line_panels
from service.sizing import formats
from service.sizing.answer import Answer

from ..helpers import GIB, MIB, container, run, sizing
from ..jobs.test_jobs_api import job, post, recent_run, summarise
from ..test_auth import SECRETS, write_tokens

HOSTILE = "<script>alert(1)</script>"
EVIL = job(HOSTILE, repo='"><img src=x onerror=alert(2)>')


def bearer(role: str) -> dict[str, str]:
    return {"authorization": f"Bearer {SECRETS[role]}"}


@pytest.fixture
async def secured(make_client: Any, tmp_path: Path) -> Any:
    async with make_client(tokens_file=write_tokens(tmp_path / "tokens.toml")) as client:
        yield client


async def test_shell_and_assets_are_served_without_data(secured: httpx.AsyncClient) -> None:
    r = await secured.get("/ui/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert "set-cookie" not in r.headers
    assert 'src="static/app.js"' in r.text
    assert "<script>" not in r.text  # no inline script: the policy forbids it
    for name, kind in (("app.js", "javascript"), ("app.css", "css")):
        asset = await secured.get(f"/ui/static/{name}")
        assert asset.status_code == 200
        assert kind in asset.headers["content-type"]
    assert (await secured.get("/ui/static/../routes.py")).status_code == 404
    assert (await secured.get("/ui/static/nope.js")).status_code == 404
    # the page's script puts the token in a header, never in a URL or a cookie
    script = (await secured.get("/ui/static/app.js")).text
    assert "sessionStorage" in script
    assert "Authorization" in script
    assert "document.cookie" not in script
    assert "localStorage" not in script


async def test_fragments_need_a_reading_token(secured: httpx.AsyncClient) -> None:
    for path in (
        "/ui/fragments/me",
        "/ui/fragments/jobs",
        "/ui/fragments/trends",
        "/ui/fragments/overrides",
        "/ui/fragments/analyses",
    ):
        assert (await secured.get(path)).status_code == 401, path
        assert (await secured.get(path, headers=bearer("ingest"))).status_code == 403, path
        assert (await secured.get(path, headers=bearer("read"))).status_code == 200, path
    job_query = {"org": "globex", "repo": "r", "workflow": "w", "job": "j"}
    assert (await secured.get("/ui/fragments/job", params=job_query, headers=bearer("read"))).status_code == 403
    assert (await secured.get("/ui/fragments/jobs?org=globex", headers=bearer("read"))).status_code == 403
    assert (await secured.get("/ui/fragments/trends?org=globex", headers=bearer("read"))).status_code == 403


async def test_control_characters_are_problems(client: httpx.AsyncClient) -> None:
    for path in (
        "/ui/fragments/job?org=a%00&repo=r&workflow=w&job=j",
        "/ui/fragments/jobs?q=%00",
        "/ui/fragments/trends?org=%07",
        "/ui/fragments/overrides?org=%00",
        "/ui/fragments/override?org=a&repo=%1b",
    ):
        r = await client.get(path)
        assert r.status_code == 422, path
        assert r.headers["content-type"].startswith("application/problem+json")


async def test_job_view_is_the_sizing_answer(client: httpx.AsyncClient) -> None:
    j = job("build")
    await post(client, *(recent_run(n, j, mem=(700 + n) * MIB) for n in range(1, 6)))
    await post(client, recent_run(6, j, mem=990 * MIB, limit=GIB, oom=True))
    r = await client.put("/api/v1/sizing/overrides/acme", json={"cpu_limit": "3"})
    assert r.status_code == 201
    r = await client.get("/ui/fragments/job", params=j)
    assert r.status_code == 200, r.text
    html = r.text
    answer = await sizing(client, j)
    for c in answer["containers"]:
        for field in ("cpu.request", "cpu.limit", "memory.request", "memory.limit"):
            kind, which = field.split(".")
            assert f'<span data-field="{field}">{c[kind][which]}</span>' in html
    # every runner format, as the formats service renders it
    for name, render in formats.RENDERERS.items():
        text = render(Answer.from_dict(answer))[1]
        found = re.search(rf'<pre id="fmt-{name}" data-format="{name}">(.*?)</pre>', html, re.S)
        assert found is not None, name
        assert unescape(found.group(1)) == text
    # resolution: the org pin supplies the CPU limit
    row = re.search(r'<tr data-field="cpu.limit">.*?</tr>', html, re.S)
    assert row is not None
    assert 'data-testid="effective">3<' in row.group(0)
    assert 'data-testid="source">org<' in row.group(0)
    # the plot marks the OOM kill
    assert html.count('class="marker"') == 1
    assert "<svg" in html


async def test_names_are_escaped_everywhere(client: httpx.AsyncClient) -> None:
    await post(client, *(recent_run(n, EVIL) for n in range(1, 4)))
    r = await client.put(
        "/api/v1/sizing/overrides/acme/" + "%22%3E%3Cimg%20src%3Dx%20onerror%3Dalert(2)%3E",
        json={"memory_limit": "2Gi", "reason": "<i>why</i>"},
    )
    assert r.status_code == 201, r.text
    await summarise(client)
    pages = [
        (await client.get("/ui/fragments/jobs")).text,
        (await client.get("/ui/fragments/job", params=EVIL)).text,
        (await client.get("/ui/fragments/overrides")).text,
        (await client.get("/ui/fragments/override", params={"org": "acme", "repo": EVIL["repo"]})).text,
    ]
    for html in pages:
        assert HOSTILE not in html
        assert "<img" not in html
        assert "<i>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[1]
    assert "&lt;i&gt;why&lt;/i&gt;" in pages[2]


async def test_write_controls_only_for_admins(secured: httpx.AsyncClient) -> None:
    await post(secured, recent_run(1, job("build")), headers=bearer("ingest"))
    r = await secured.put("/api/v1/sizing/overrides/acme", json={"memory_limit": "2Gi"}, headers=bearer("admin"))
    assert r.status_code == 201
    j = job("build")
    for role, shown in (("read", False), ("admin", True)):
        overrides = (await secured.get("/ui/fragments/overrides", headers=bearer(role))).text
        assert ('data-action="edit-override"' in overrides) is shown
        assert ('data-action="new-override"' in overrides) is shown
        view = (await secured.get("/ui/fragments/job", params=j, headers=bearer(role))).text
        assert ('id="job-override"' in view) is shown
        form = (await secured.get("/ui/fragments/override", params={"org": "acme"}, headers=bearer(role))).text
        assert ('data-action="save-override"' in form) is shown
    # and the server refuses the write whatever the page shows
    r = await secured.put("/api/v1/sizing/overrides/acme", json={"memory_limit": "1Gi"}, headers=bearer("read"))
    assert r.status_code == 403


async def test_fleet_totals_and_pages(client: httpx.AsyncClient) -> None:
    for i in range(60):
        await post(client, run(1, container(mem=700 * MIB, limit=4 * GIB), job=job(f"j{i:02}")))
    await summarise(client)
    html = (await client.get("/ui/fragments/jobs?sort=name")).text
    assert html.count("<tr data-job=") == 50
    assert '<dd data-total="jobs">60</dd>' in html
    cursor = re.search(r'data-action="jobs-page" data-cursor="([^"]+)"', html)
    assert cursor is not None
    rest = (await client.get(f"/ui/fragments/jobs?sort=name&cursor={cursor.group(1)}")).text
    assert rest.count("<tr data-job=") == 10
    assert 'data-cursor=""' in rest  # back to the first page
    assert re.findall(r'<tr data-job="(j\d\d)"', html + rest) == [f"j{i:02}" for i in range(60)]


async def test_conflict_fragment_shows_what_is_stored(client: httpx.AsyncClient) -> None:
    r = await client.put("/api/v1/sizing/overrides/acme/web", json={"memory_limit": "5Gi"})
    etag = r.headers["etag"]
    html = (await client.get("/ui/fragments/override?org=acme&repo=web&view=current")).text
    assert f'data-etag="{etag.replace(chr(34), "&#34;")}"' in html
    assert '<td data-field="memory_limit">5Gi</td>' in html
    gone = (await client.get("/ui/fragments/override?org=acme&repo=nothing&view=current")).text
    assert 'data-current="no"' in gone


async def test_analysis_fragment(client: httpx.AsyncClient) -> None:
    from ..helpers import poll

    body = {
        "synthetic": {"days": 1, "builds_per_day": 50},
        "pool": {"shapes": [{"name": "n", "cpu": 8, "memory": "32Gi"}]},
    }
    r = await client.post("/api/v1/simulations", json=body)
    assert r.status_code == 202, r.text
    done = await poll(client, r.headers["location"])
    assert done["status"] == "done"
    html = (await client.get(f"/ui/fragments/analysis?kind=simulation&id={done['id']}")).text
    assert 'data-status="done"' in html
    assert "node-hours" in html
    assert "<svg" in html
    assert (await client.get("/ui/fragments/analysis?kind=backtest&id=nope")).status_code == 404


def test_plot_marks_points_on_their_panel() -> None:
    svg = line_panels(
        "t",
        [("a", {"s": [(1.0, 1.0), (2.0, 4.0)]}), ("b", {"s": [(1.0, 2.0), (2.0, 2.0)]})],
        markers=[(1, "OOM <kill>", [(2.0, 2.0)])],
    )
    assert svg.count('class="marker"') == 1
    assert "OOM &lt;kill&gt;" in svg


async def test_new_views_escape_hostile_names(client: httpx.AsyncClient) -> None:
    # issue 34's views: container rows, runs by date, trends, past analyses, the risk alert
    sidecar = '"><img src=x onerror=alert(3)>'
    for n in range(1, 4):
        body = recent_run(n, EVIL, mem=int(3 * GIB))
        body["run_id"] = f"<i>run</i>-{n}"
        body["containers"].append({**body["containers"][0], "name": sidecar})
        await post(client, body)
    r = await client.put("/api/v1/sizing/overrides/acme", json={"memory_limit": "1Gi"})
    assert r.status_code == 201, r.text
    r = await client.post("/api/v1/backtests", json={"org": "acme"})
    assert r.status_code == 202, r.text
    await summarise(client)
    pages = [
        (await client.get("/ui/fragments/jobs", params={"sort": "risk"})).text,
        (await client.get("/ui/fragments/job", params=EVIL)).text,
        (await client.get("/ui/fragments/trends", params={"q": HOSTILE})).text,
        (await client.get("/ui/fragments/analyses")).text,
    ]
    for html in pages:
        assert HOSTILE not in html
        assert "<img" not in html
        assert "<i>" not in html
    assert 'data-container="&#34;&gt;&lt;img src=x onerror=alert(3)&gt;"' in pages[0]  # its own row
    assert "pinned below peak" in pages[0]
    assert "&lt;i&gt;run&lt;/i&gt;-1" in pages[1]  # the runs by date
    assert 'data-testid="risk-alert"' in pages[1]
    assert "names containing &#39;&lt;script&gt;" in pages[2]


def test_measured_memory_and_money_read_as_a_person_writes_them() -> None:
    from service.ui.render import human_memory, money, when

    assert human_memory(836677659) == "798 MiB"
    assert human_memory(int(6.6 * GIB)) == "6.6 GiB"
    assert human_memory(1500 * GIB) == "1,500 GiB"
    assert human_memory(512) == "512 B"
    assert human_memory(None) == "-"
    assert money(0.0142, "USD") == "0.014 USD"
    assert money(-0.0004, "USD") == "0.000 USD"  # never "-0.000"
    assert money(12.345, "EUR") == "12.35 EUR"
    assert money(-1234.5, "USD") == "-1,234 USD"  # whole units from 100 (round half to even)
    assert when("2026-11-26T09:43:28.372792Z") == "2026-11-26 09:43"
    assert when("2026-11-26T09:43:28.372792Z", True) == "2026-11-26 09:43:28"


def test_plots_scale_and_count_in_whole_ticks() -> None:
    svg = line_panels("t", [("a", {"s": [(1.0, 1.0)]})], x_label="run", hover=[{"s": ["run <r1>"]}])
    assert 'viewBox="0 0 900 ' in svg
    ticks = re.findall(r'text-anchor="middle" fill="#777">([^<]+)<', svg)
    assert ticks == ["0", "1", "2"]  # one run: whole ticks, the run mid-axis
    assert svg.count('class="dot"') == 1  # a series of one point is a dot
    assert "<title>run &lt;r1&gt;</title>" in svg


async def test_the_trends_view_keeps_a_trend_for_a_minute_and_says_when_it_was_computed(
    client: httpx.AsyncClient,
) -> None:
    await post(client, *(recent_run(n, job("build")) for n in range(1, 4)))

    def runs(html: str) -> int:
        found = re.search(r'data-sum="runs">(\d+)<', html)
        assert found is not None
        return int(found.group(1))

    first = (await client.get("/ui/fragments/trends")).text
    assert runs(first) == 3
    assert "Computed at " in first
    await post(client, recent_run(4, job("build")))
    assert runs((await client.get("/ui/fragments/trends")).text) == 3  # kept (for at most TREND_TTL)
    assert runs((await client.get("/ui/fragments/trends", params={"org": "acme"})).text) == 4  # another filter
    cache = client.app.state.ui_trends  # type: ignore[attr-defined]
    for key, (_, days, at) in list(cache.entries.items()):
        cache.entries[key] = (0.0, days, at)  # as if the minute had passed
    assert runs((await client.get("/ui/fragments/trends")).text) == 4
