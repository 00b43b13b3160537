"""The dashboard's queries, run by a real Prometheus against two replicas on one PostgreSQL (issue 39,
item 2): every panel answers, and the fleet figures, which every replica reads from the shared
database, are counted once, as SQL counts them, not once per replica.

The ``prometheus`` binary comes with Debian's ``prometheus`` package (as promtool does): without it
the test skips on a developer's machine and fails under CI."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
import pytest
import yaml
from sqlalchemy.engine import make_url

from ..helpers import MIB, container, run, sizing_path
from ..live import LiveServer, free_port

#: the CI tier (README): two live servers on one database and a real Prometheus
pytestmark = pytest.mark.ci

#: Grafana's $__rate_interval is at least four scrape intervals; Prometheus scrapes every 0.5 s here
RATE_INTERVAL = "3s"


@pytest.fixture
def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        message = "prometheus is not installed: install Debian's prometheus package; the dashboard was NOT checked"
        if os.environ.get("CI", "") not in ("", "0", "false"):
            pytest.fail(message + " (CI must check it: .ci/run installs it)")
        pytest.skip(message)
    return found


@pytest.fixture
def fleet(postgresql_only: str, prometheus_binary: str, tmp_path: Path) -> Iterator[tuple[LiveServer, LiveServer, str]]:
    """Two replicas (two ``ci-sizer serve``, one worker each, as two pods) on one database, and a
    Prometheus scraping both every 0.5 s; all started at once (Prometheus takes its first scrape
    about 5 s after it starts)."""
    env = {"CI_SIZER_FLEET_FLUSH_SECONDS": "0.3"}  # the fleet totals written and read back often
    replicas = [LiveServer(postgresql_only, log=tmp_path / f"{name}.log", env=env) for name in "ab"]
    port = free_port()
    config = {
        "global": {"scrape_interval": "500ms", "scrape_timeout": "500ms", "evaluation_interval": "500ms"},
        "scrape_configs": [
            {"job_name": "ci-sizer", "static_configs": [{"targets": [r.url.removeprefix("http://") for r in replicas]}]}
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    with open(tmp_path / "prometheus.log", "wb") as log:
        prom = subprocess.Popen(
            [
                prometheus_binary,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=log,
        )
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(LiveServer.start, replicas))
        yield replicas[0], replicas[1], f"http://127.0.0.1:{port}"
    finally:
        for replica in replicas:
            replica.stop()
        prom.terminate()
        prom.wait(30)


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    """An instant query, as Grafana sends a panel's (with its interval variable filled in)."""
    expr = re.sub(r"\$__rate_interval\b", RATE_INTERVAL, expr)
    r = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def by(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {row["metric"].get(label, ""): float(row["value"][1]) for row in result}


def _wait(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


async def _sql_totals(database_url: str) -> dict[str, Any]:
    """What the database says, read apart from the service: the fleet's totals and the overrides."""
    u = make_url(database_url)
    conn = await asyncpg.connect(host=u.host, port=u.port, user=u.username, database=u.database)
    try:
        row = await conn.fetchrow(
            "SELECT count(fleet_cpu_request_millicores) AS jobs,"
            " sum(fleet_cpu_request_millicores) AS cpu_req, sum(fleet_cpu_observed_millicores) AS cpu_obs,"
            " sum(fleet_memory_request_bytes) AS mem_req, sum(fleet_memory_observed_bytes) AS mem_obs FROM jobs"
        )
        scopes = dict(await conn.fetch("SELECT scope, count(*) FROM overrides GROUP BY scope"))
    finally:
        await conn.close()
    return {**{k: float(v) for k, v in row.items()}, "scopes": scopes}


def test_dashboard_on_two_replicas_of_one_database(
    fleet: tuple[LiveServer, LiveServer, str], postgresql_only: str, repo_root: Path
) -> None:
    a, b, prometheus = fleet
    org = f"org-{uuid.uuid4().hex[:8]}"
    jobs = [{"org": org, "repo": "web", "workflow": "ci.yml", "job": f"build-{i}"} for i in range(6)]
    with httpx.Client(timeout=10) as c:
        for i, job in enumerate(jobs):  # runs through either replica, answers from both
            writer = a if i % 2 else b
            for n in range(2):
                body = run(n, container(cpu=300 + 50 * i + 10 * n, mem=(400 + 20 * i) * MIB), job=job)
                assert c.post(f"{writer.url}/api/v1/runs", json=body).status_code == 201
            for reader in (a, b):
                assert c.get(f"{reader.url}{sizing_path(job)}").status_code == 200
        assert c.put(f"{a.url}/api/v1/sizing/overrides/{org}/web", json={"cpu_limit": "2"}).status_code == 201
        assert c.post(f"{b.url}/api/v1/runs", json={"org": "x"}).status_code == 422  # a rejected one

    # both replicas wrote their notes and read the totals back; Prometheus scraped them since
    def scraped_everything() -> bool:
        jobs_seen = by(query(prometheus, "ci_sizer_fleet_jobs"), "instance")
        repo = by(query(prometheus, 'ci_sizer_overrides{scope="repo"}'), "instance")
        # and a rate over $__rate_interval has two scrapes of each replica to go on (the first scrape can be
        # the one that saw the totals)
        scrapes = by(query(prometheus, f"count_over_time(up[{RATE_INTERVAL}])"), "instance")
        enough = len(scrapes) == 2 and min(scrapes.values()) >= 2
        return enough and len(jobs_seen) == 2 and set(jobs_seen.values()) == {6.0} and set(repo.values()) == {1.0}

    _wait(scraped_everything, 30, "Prometheus did not see both replicas' fleet totals")
    sql = asyncio.run(_sql_totals(postgresql_only))
    assert sql["jobs"] == 6

    dashboard = json.loads((repo_root / "grafana/dashboards/ci-sizer.json").read_text())
    panels = {p["id"]: p for p in dashboard["panels"]}

    def panel(pid: int, ref: str = "A") -> list[dict[str, Any]]:
        (target,) = [t for t in panels[pid]["targets"] if t["refId"] == ref]
        return query(prometheus, target["expr"])

    # every replica reports the whole fleet: two copies of each figure reach Prometheus ...
    assert len(query(prometheus, 'ci_sizer_fleet_cpu_cores{kind="recommended"}')) == 2
    # ... and the panels count it once, as SQL does (they doubled it before: sum by (kind))
    cpu = by(panel(7), "kind")
    assert cpu == pytest.approx({"recommended": sql["cpu_req"] / 1000, "observed": sql["cpu_obs"] / 1000})
    memory = by(panel(8), "kind")
    assert memory == pytest.approx({"recommended": float(sql["mem_req"]), "observed": float(sql["mem_obs"])})
    (cpu_headroom,) = panel(9, "A")
    assert float(cpu_headroom["value"][1]) == pytest.approx(sql["cpu_req"] / sql["cpu_obs"])
    (memory_headroom,) = panel(9, "B")
    assert float(memory_headroom["value"][1]) == pytest.approx(sql["mem_req"] / sql["mem_obs"])
    overrides = by(panel(6, "B"), "scope")
    assert overrides == {scope: float(sql["scopes"].get(scope, 0)) for scope in overrides}
    assert overrides["repo"] == 1
    # the per-replica figures stay per replica: each answers, its feed listens
    assert by(panel(15, "A"), "instance") == {a.url.removeprefix("http://"): 1.0, b.url.removeprefix("http://"): 1.0}
    assert set(by(panel(15, "B"), "instance").values()) == {1.0}
    # and every query of every panel answers with data (but the admission webhook's, whose series come from
    # its own process: tests/webhook checks that it exports them)
    for p in dashboard["panels"]:
        for target in p["targets"]:
            if "ci_sizer_webhook_" not in target["expr"]:
                assert query(prometheus, target["expr"]), (p["title"], target["refId"])
