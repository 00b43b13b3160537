"""The jobs list's risk, money and trends (issue 34), through the API on both databases."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from service.cli import build_parser
from service.cli.common import CliError, settings_from
from service.growths import service as growths_service
from service.jobs import trends
from service.jobs.money import DEFAULT_PRICE_PER_CORE_HOUR, DEFAULT_PRICE_PER_GIB_HOUR, MONTH_DAYS, Prices
from service.jobs.service import JobFilter
from service.wire import utcnow

from ..helpers import GIB, MIB, sizing
from .test_jobs_api import all_pages, job, post, recent_run, summarise


def _cpu(body: dict[str, Any], p95: float) -> dict[str, Any]:
    for c in body["containers"]:
        c["cpu_stats_millicores"] = dict.fromkeys(("peak", "p99", "p95", "p75", "p50", "avg"), p95)
    return body


async def _risky_fleet(client: httpx.AsyncClient) -> None:
    """``linker`` pinned below its peak, ``terraform`` throttled by a CPU pin, ``flaky`` in OOM
    backoff, ``fine`` fine (org acme); ``other`` in org globex."""
    await post(
        client,
        *(recent_run(n, job("linker", repo="web"), mem=int(6.6 * GIB), limit=16 * GIB) for n in range(1, 5)),
        *(_cpu(recent_run(n, job("terraform", repo="infra"), mem=600 * MIB), 1500) for n in range(1, 5)),
        *(recent_run(n, job("flaky", repo="api"), mem=900 * MIB, limit=GIB, oom=n == 1) for n in range(1, 5)),
        *(recent_run(n, job("fine", repo="api"), mem=700 * MIB) for n in range(1, 5)),
        *(recent_run(n, job("other", org="globex"), mem=500 * MIB) for n in range(1, 4)),
    )
    assert (await client.put("/api/v1/sizing/overrides/acme/web", json={"memory_limit": "2Gi"})).status_code == 201
    assert (await client.put("/api/v1/sizing/overrides/acme/infra", json={"cpu_limit": "1"})).status_code == 201
    await summarise(client)


def _by_job(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["job"]: i for i in items}


async def test_risk_is_flagged_and_a_saving_below_use_is_not_counted(client: httpx.AsyncClient) -> None:
    await _risky_fleet(client)
    body = (await client.get("/api/v1/jobs", params={"org": "acme"})).json()
    rows = _by_job(body["items"])
    linker = rows["linker"]
    assert linker["risk"] == {"level": "critical", "reasons": ["pinned below peak"]}
    (c,) = linker["containers"]
    assert c["below_peak"] is True
    assert c["answer"]["memory_limit_bytes"] == 2 * GIB
    assert c["answer"]["memory_limit_source"] == "repo"
    assert c["used"]["memory_peak_bytes"] == int(6.6 * GIB)
    assert c["ran_with"] == {"memory_limit_bytes": 16 * GIB, "cpu_request_millicores": 2000.0}
    # 16Gi -> 2Gi would "save" 14 GiB a run: it is no saving, the job is killed instead
    assert linker["saved_per_day"]["memory_gib_hours"] is None
    assert linker["saved_per_day"]["cpu_core_hours"] is not None
    terraform = rows["terraform"]
    assert terraform["risk"] == {"level": "warn", "reasons": ["throttled"]}
    assert terraform["containers"][0]["throttled"] is True
    assert terraform["containers"][0]["used"]["cpu_p95_millicores"] == 1500
    assert terraform["saved_per_day"]["cpu_core_hours"] is None
    assert terraform["saved_per_day"]["memory_gib_hours"] is not None
    assert rows["flaky"]["risk"] == {"level": "high", "reasons": ["OOM backoff"]}
    assert rows["fine"]["risk"] == {"level": None, "reasons": []}
    assert rows["fine"]["containers"][0]["below_peak"] is False
    totals = body["totals"]
    assert (totals["at_risk"], totals["pinned_below_peak"], totals["oom_backoff"]) == (3, 1, 1)
    known = [r["saved_per_day"]["memory_gib_hours"] for r in rows.values()]
    assert totals["saved_memory_gib_hours_per_day"] == pytest.approx(sum(v for v in known if v is not None), abs=2e-3)
    # raising the pin above the peak takes the risk away, and the saving counts again
    assert (await client.put("/api/v1/sizing/overrides/acme/web", json={"memory_limit": "8Gi"})).status_code == 200
    await summarise(client)
    linker = _by_job((await client.get("/api/v1/jobs", params={"org": "acme"})).json()["items"])["linker"]
    assert linker["risk"]["level"] is None
    assert linker["saved_per_day"]["memory_gib_hours"] == pytest.approx(8 * 4 * 0.5 / 7, rel=1e-3)


async def test_sorting_by_risk_and_by_money_pages_through_every_job_once(client: httpx.AsyncClient) -> None:
    await _risky_fleet(client)
    # twins: the same money, told apart by their ids
    await post(client, *(recent_run(n, job(f"twin-{k}", repo="api"), mem=700 * MIB) for k in (1, 2) for n in (1, 2)))
    await summarise(client)
    everything = (await client.get("/api/v1/jobs", params={"limit": 500, "sort": "risk"})).json()["items"]
    assert [i["job"] for i in everything[:3]] == ["linker", "flaky", "terraform"]  # critical, high, warn
    paged = await all_pages(client, "/api/v1/jobs?limit=2&sort=risk")
    assert [i["job"] for i in paged] == [i["job"] for i in everything]
    prices = Prices()
    money = await all_pages(client, "/api/v1/jobs?limit=2&sort=money")
    assert len(money) == len(everything) == 7
    values = [i["saved_money"]["per_day"] for i in money]
    known = [v for v in values if v is not None]
    assert known == sorted(known, reverse=True)
    assert values[len(known) :] == [None] * (len(values) - len(known))
    for i in money:
        s = i["saved_per_day"]
        if s["memory_gib_hours"] is not None and s["cpu_core_hours"] is not None:
            want = s["memory_gib_hours"] * prices.per_gib_hour + s["cpu_core_hours"] * prices.per_core_hour
            assert i["saved_money"]["per_day"] == pytest.approx(want, abs=1e-3)
            assert i["saved_money"]["per_month"] == pytest.approx(want * MONTH_DAYS, abs=0.01)
    bad = await client.get("/api/v1/jobs", params={"sort": "risk", "cursor": "WyJyaXNrIiwgMSwgMV0"})
    assert bad.status_code == 422


async def test_totals_by_org_and_repo_are_each_group_s_totals(client: httpx.AsyncClient) -> None:
    from service.jobs import service as jobs_service

    await _risky_fleet(client)
    app = client.app  # type: ignore[attr-defined]
    async with app.state.engine.connect() as conn:
        groups = await jobs_service.breakdown(conn=conn, flt=JobFilter(), orgs=None, prices=Prices())
        limited = await jobs_service.breakdown(conn=conn, flt=JobFilter(), orgs=frozenset({"globex"}), prices=Prices())
        top = await jobs_service.breakdown(conn=conn, flt=JobFilter(), orgs=None, prices=Prices(), limit=2)
    by_org, by_repo = groups["org"], groups["repo"]
    assert [g["org"] for g in limited["org"]] == ["globex"]  # a token's orgs only
    assert top["repo"] == by_repo[:2]
    assert {g["org"] for g in by_org} == {"acme", "globex"}
    assert {(g["org"], g["repo"]) for g in by_repo} == {
        ("acme", "web"),
        ("acme", "infra"),
        ("acme", "api"),
        ("globex", "web"),
    }
    for g in by_org + by_repo:
        params = {"org": g["org"], **({"repo": g["repo"]} if g["repo"] else {})}
        want = (await client.get("/api/v1/jobs", params=params)).json()["totals"]
        for key in ("jobs", "at_risk", "pinned_below_peak", "saved_memory_gib_hours_per_day", "saved_money"):
            assert g[key] == want[key], (g, key)
    for rows in (by_org, by_repo):
        money = [g["saved_money"]["per_day"] for g in rows]
        assert money == sorted(money, reverse=True)


async def test_the_operator_s_prices_make_the_money(make_client: Any) -> None:
    async with make_client(price_per_gib_hour=2.0, price_per_core_hour=0.5, price_currency="EUR") as client:
        await post(client, *(recent_run(n, job("build"), mem=700 * MIB, minutes=60) for n in range(1, 5)))
        await summarise(client)
        body = (await client.get("/api/v1/jobs")).json()
        (row,) = body["items"]
        saved = row["saved_per_day"]
        want = saved["memory_gib_hours"] * 2.0 + saved["cpu_core_hours"] * 0.5
        assert row["saved_money"] == {
            "per_day": pytest.approx(want, abs=1e-3),
            "per_month": pytest.approx(want * 730 / 24, abs=0.01),
            "currency": "EUR",
        }
        assert body["totals"]["saved_money"]["currency"] == "EUR"
        # and the gauge Grafana reads
        from service.observability.fleet import refresh_saving

        app = client.app  # type: ignore[attr-defined]
        async with app.state.sessionmaker() as session:
            await refresh_saving(session, Prices(2.0, 0.5, "EUR"))
        gauge = REGISTRY.get_sample_value("ci_sizer_fleet_saving_per_day", {"resource": "memory", "currency": "EUR"})
        assert gauge == pytest.approx(body["totals"]["saved_memory_gib_hours_per_day"] * 2.0, rel=1e-3)


def test_prices_are_flags_and_environment_with_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    settings = settings_from(parser.parse_args(["serve"]))
    assert (settings.price_per_gib_hour, settings.price_per_core_hour, settings.price_currency) == (
        DEFAULT_PRICE_PER_GIB_HOUR,
        DEFAULT_PRICE_PER_CORE_HOUR,
        "USD",
    )
    args = ["serve", "--price-per-gib-hour", "0.01", "--price-per-core-hour", "0.04", "--price-currency", "EUR"]
    settings = settings_from(parser.parse_args(args))
    assert Prices.of(settings) == Prices(0.01, 0.04, "EUR")
    monkeypatch.setenv("CI_SIZER_PRICE_PER_CORE_HOUR", "0.05")
    assert settings_from(parser.parse_args(["serve"])).price_per_core_hour == 0.05
    with pytest.raises(CliError, match="--price-per-gib-hour"):
        settings_from(parser.parse_args(["serve", "--price-per-gib-hour", "-1"]))


async def test_trends_count_each_day_s_runs_kills_and_what_they_could_save(client: httpx.AsyncClient) -> None:
    j = job("build")
    # four one-hour runs on 16Gi, two of them today; one OOM-killed run two days ago elsewhere
    now = utcnow()
    bodies = []
    for n, hours in enumerate((1, 2, 49, 50)):
        body = recent_run(n, j, mem=700 * MIB, limit=16 * GIB, minutes=60)
        finished = now - timedelta(hours=hours)
        body["finished_at"] = finished.isoformat() + "Z"
        body["started_at"] = (finished - timedelta(hours=1)).isoformat() + "Z"
        bodies.append(body)
    killed = recent_run(9, job("flaky"), mem=GIB, limit=GIB, oom=True)
    killed["finished_at"] = (now - timedelta(hours=49)).isoformat() + "Z"
    killed["started_at"] = (now - timedelta(hours=50)).isoformat() + "Z"
    await post(client, *bodies, killed)
    await summarise(client)
    answer = (await sizing(client, j))["containers"][0]
    app = client.app  # type: ignore[attr-defined]
    async with app.state.engine.connect() as conn:
        days = await trends.trend(conn=conn, flt=JobFilter(), orgs=None, prices=Prices(), now=now)
        mine = await trends.trend(conn=conn, flt=JobFilter(job="build"), orgs=None, prices=Prices(), now=now)
        nobody = await trends.trend(conn=conn, flt=JobFilter(), orgs=frozenset(), prices=Prices(), now=now)
    assert len(days) == trends.TREND_DAYS
    assert days[-1].day == now.date()
    assert days == sorted(days, key=lambda d: d.day)
    counted = {d.day: (d.runs, d.oom_kills) for d in days if d.runs}
    want: dict[Any, list[int]] = {}
    for body, hours in zip([*bodies, killed], (1, 2, 49, 50, 49), strict=True):
        day = (now - timedelta(hours=hours)).date()
        want.setdefault(day, [0, 0])
        want[day][0] += 1
        want[day][1] += body is killed
    assert counted == {day: tuple(v) for day, v in want.items()}
    build_days = [d for d in mine if d.runs]
    assert sum(d.runs for d in build_days) == 4
    per_run = (16 * GIB - answer["memory"]["limit_bytes"]) / GIB * 1.0  # GiB-hours above today's answer, one hour
    assert sum(d.could_save_gib_hours for d in build_days) == pytest.approx(4 * per_run, abs=0.01)
    assert sum(d.reserved_gib_hours for d in build_days) == pytest.approx(4 * 16, abs=0.01)
    assert sum(d.used_gib_hours for d in build_days) == pytest.approx(4 * 700 / 1024, abs=0.01)
    assert all(d.growths == 0 for d in days)  # no run grew
    assert not any(d.runs for d in nobody)  # a token for no org sees nothing


async def test_trends_count_the_kills_growth_avoided_as_the_job_page_does(client: httpx.AsyncClient) -> None:
    # issue 34's growths series (issue 40's events): a run grown in place past the limit it started with and
    # not killed is a kill avoided; one grown within its first limit, or killed anyway (too_late), is not
    now = utcnow()

    def grown(n: int, *, peak: int, oom: bool = False, result: str = "grown") -> dict[str, Any]:
        body = recent_run(n, job("grower"), mem=peak, limit=2 * GIB, oom=oom)
        at = (now - timedelta(hours=n, minutes=10)).isoformat() + "Z"
        body["containers"][0]["growths"] = [{"at": at, "from_bytes": GIB, "to_bytes": 2 * GIB, "result": result}]
        return body

    await post(
        client,
        grown(1, peak=GIB + 300 * MIB),  # avoided a kill
        grown(2, peak=GIB + 500 * MIB),  # avoided a kill
        grown(3, peak=900 * MIB),  # grew at the threshold, never past 1Gi: nothing avoided
        grown(4, peak=2 * GIB, oom=True, result="too_late"),  # killed anyway
        recent_run(5, job("grower"), mem=GIB, limit=2 * GIB),  # no growth
    )
    app = client.app  # type: ignore[attr-defined]
    async with app.state.engine.connect() as conn:
        days = await trends.trend(conn=conn, flt=JobFilter(job="grower"), orgs=None, prices=Prices(), now=now)
        page = await growths_service.of_job(conn=conn, job_id=await _job_id(conn, "grower"), now=now)
    assert sum(d.growths for d in days) == 2 == page.kills_avoided
    assert sum(d.runs for d in days) == 5


async def _job_id(conn: Any, name: str) -> int:
    from sqlalchemy import text

    return int((await conn.execute(text("SELECT id FROM jobs WHERE job = :j"), {"j": name})).scalar_one())


async def test_trends_leave_out_a_job_kept_below_its_peak(client: httpx.AsyncClient) -> None:
    await _risky_fleet(client)
    app = client.app  # type: ignore[attr-defined]
    async with app.state.engine.connect() as conn:
        linker = await trends.trend(conn=conn, flt=JobFilter(job="linker"), orgs=None, prices=Prices())
        fine = await trends.trend(conn=conn, flt=JobFilter(job="fine"), orgs=None, prices=Prices())
    assert sum(d.runs for d in linker) == 4
    assert sum(d.could_save_gib_hours for d in linker) == 0.0  # 16Gi -> 2Gi would be 14 GiB-h a run: not a saving
    assert sum(d.could_save_gib_hours for d in fine) > 0
    assert sum(d.could_save_money for d in fine) == pytest.approx(
        sum(d.could_save_gib_hours for d in fine) * DEFAULT_PRICE_PER_GIB_HOUR
        + sum(d.could_save_core_hours for d in fine) * DEFAULT_PRICE_PER_CORE_HOUR,
        abs=1e-3,
    )
