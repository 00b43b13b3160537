"""``/metrics`` after real traffic, request ids and JSON request logs, the Grafana dashboard's
queries against what the service exports, and multiprocess mode with a real 2-worker server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from service.observability.logs import JsonFormatter
from service.observability.metrics import EXPORTED, latency_buckets
from service.runs.bodies import MIN_BYTES

from ..helpers import MIB, container, post_runs, run, sizing, sizing_path
from ..live import healthy

SIZING_ROUTE = "/api/v1/sizing/{org}/{repo}/{workflow}/{job}"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(snapshot: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return snapshot.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return samples(r.text)


async def test_metrics_move_with_traffic(make_client: Any) -> None:
    async with make_client(fleet_flush_seconds=0.05) as client:
        await _metrics_move_with_traffic(client)


async def _metrics_move_with_traffic(client: httpx.AsyncClient) -> None:
    before = await scrape(client)
    await post_runs(client, run(1, container(cpu=400, mem=700 * MIB)), run(2, container(cpu=600, mem=800 * MIB)))
    await client.post("/api/v1/runs", json=run(2, container(cpu=600, mem=800 * MIB)))  # duplicate
    await client.post("/api/v1/runs", json=run(2, container(cpu=1, mem=1)))  # conflict
    await client.post("/api/v1/runs", json={"org": "x"})  # rejected
    await post_runs(client, run(3, container(oom_killed=True)))  # created, OOM-suspect
    await client.put("/api/v1/sizing/overrides/acme/web", json={"cpu_limit": "2"})
    answer = await sizing(client)
    await sizing(client, {"org": "o", "repo": "r", "workflow": "w", "job": "never-seen"})
    # the gauges read from the database follow within a pass of the background task (a scrape
    # itself never touches the database)
    deadline = time.monotonic() + 30
    while True:
        after = await scrape(client)
        if value(after, "ci_sizer_fleet_jobs") == 1 and value(after, "ci_sizer_overrides", scope="repo") == 1:
            break
        assert time.monotonic() < deadline, "the database gauges were not refreshed"
        await asyncio.sleep(0.05)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("ci_sizer_runs_ingested_total", result="created") == 3
    assert delta("ci_sizer_runs_ingested_total", result="duplicate") == 1
    assert delta("ci_sizer_runs_ingested_total", result="conflict") == 1
    assert delta("ci_sizer_runs_ingested_total", result="rejected") == 1
    assert delta("ci_sizer_oom_suspect_runs_total") == 1
    assert delta("ci_sizer_recommendations_total", phase="learning", override_scope="repo") == 1
    assert delta("ci_sizer_recommendations_total", phase="unknown", override_scope="global") == 1
    # requests are labelled by route template, never by raw path
    assert delta("ci_sizer_http_requests_total", route=SIZING_ROUTE, method="GET", status_class="2xx") == 2
    assert delta("ci_sizer_http_requests_total", route="/api/v1/runs", method="POST", status_class="4xx") == 2
    assert delta("ci_sizer_http_request_duration_seconds_count", route=SIZING_ROUTE, method="GET") == 2
    assert delta("ci_sizer_core_compute_duration_seconds_count", operation="size_job") == 2
    assert value(after, "ci_sizer_overrides", scope="repo") == 1
    assert value(after, "ci_sizer_overrides", scope="job") == 0
    from service import core

    assert value(after, "ci_sizer_build_info", version=_version(), core_backend=core.BACKEND) == 1
    # fleet totals: the one job with history, latest recommendation (learning: 3 x peaks)
    c = answer["containers"][0]
    assert value(after, "ci_sizer_fleet_jobs") == 1
    assert value(after, "ci_sizer_fleet_cpu_cores", kind="recommended") == pytest.approx(
        c["cpu"]["request_millicores"] / 1000
    )
    assert value(after, "ci_sizer_fleet_cpu_cores", kind="observed") == pytest.approx(
        c["observed"]["cpu_millicores"] / 1000
    )
    assert value(after, "ci_sizer_fleet_memory_bytes", kind="recommended") == c["memory"]["request_bytes"]
    assert value(after, "ci_sizer_fleet_memory_bytes", kind="observed") == c["observed"]["memory_bytes"]


async def test_a_scrape_never_writes_to_the_database(make_client: Any, db_url: str) -> None:
    # issue 18, item 8: every scrape wrote the fleet totals noted since the last one; now only the
    # background task writes them (here: never within the test)
    from sqlalchemy import text

    from service.db import build_engine

    async with make_client(fleet_flush_seconds=3600) as client:
        await post_runs(client, run(1))
        await sizing(client)  # notes the job's totals in memory
        for _ in range(3):
            await scrape(client)
        engine = build_engine(db_url)
        try:
            async with engine.connect() as conn:
                written = (
                    await conn.execute(text("SELECT count(*) FROM jobs WHERE fleet_updated_at IS NOT NULL"))
                ).scalar_one()
        finally:
            await engine.dispose()
        assert written == 0


def _version() -> str:
    from service import __version__

    return __version__


async def test_no_label_per_org_repo_workflow_or_job(client: httpx.AsyncClient) -> None:
    await post_runs(client, run(1))
    await sizing(client)
    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name.startswith("ci_sizer_"):
            for s in family.samples:
                assert not {"org", "repo", "workflow", "job"} & set(s.labels), s
                assert "acme" not in s.labels.get("route", "")


def test_metric_names_follow_practice() -> None:
    for metric in EXPORTED:
        name = metric._name  # type: ignore[attr-defined]
        assert name.startswith("ci_sizer_")
        kind = metric._type  # type: ignore[attr-defined]
        assert name.endswith("_total") == (kind == "counter") or kind == "counter", name
        assert not re.search(r"_(ms|milliseconds|millicores|kb|mb|mib|gib)\b", name), name


async def test_request_id_is_echoed_or_made(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz", headers={"X-Request-ID": "build-42.attempt:1"})
    assert r.headers["X-Request-ID"] == "build-42.attempt:1"
    r = await client.get("/healthz")
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-ID"])
    r = await client.get("/healthz", headers={"X-Request-ID": "bad id\twith junk" + "x" * 200})
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-ID"])


async def test_one_json_log_line_per_request(client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ci_sizer.access")
    await client.get(sizing_path(), headers={"X-Request-ID": "abc123", "Authorization": "Bearer cis_do-not-log"})
    records = [r for r in caplog.records if r.name == "ci_sizer.access"]
    assert len(records) == 1
    line = json.loads(JsonFormatter().format(records[0]))
    assert line["http"] == {
        "method": "GET",
        "route": SIZING_ROUTE,
        "status": 200,
        "duration_ms": line["http"]["duration_ms"],
        "request_id": "abc123",
    }
    assert line["http"]["duration_ms"] > 0
    assert "cis_do-not-log" not in json.dumps(line)


def _dashboard(repo_root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((repo_root / "grafana" / "dashboards" / "ci-sizer.json").read_text())
    return data


def _exprs(repo_root: Path) -> list[str]:
    return [t["expr"] for p in _dashboard(repo_root)["panels"] for t in p["targets"]]


#: Grafana's interval variables, given a value so that a dashboard query parses as PromQL
_GRAFANA_VARIABLES = re.compile(r"\$__(rate_interval|interval|range)\b")


def _metric_names(expr: str) -> set[str]:
    tree = repr(promql_parser.parse(_GRAFANA_VARIABLES.sub("1m", expr)))
    return set(re.findall(r'VectorSelector \{\s*name: Some\(\s*"([^"]+)"', tree))


def _exported_series() -> set[str]:
    names = set()
    for metric in EXPORTED:
        base = metric._name  # type: ignore[attr-defined]
        kind = metric._type  # type: ignore[attr-defined]
        if kind == "counter":
            names.add(base + "_total" if not base.endswith("_total") else base)
        elif kind == "histogram":
            names |= {base + "_bucket", base + "_sum", base + "_count"}
        else:
            names.add(base)
    return names


def test_every_dashboard_query_parses_and_uses_exported_metrics(repo_root: Path) -> None:
    exprs = _exprs(repo_root)
    assert len(exprs) >= 10
    exported = _exported_series()
    for expr in exprs:
        names = _metric_names(expr)  # raises ValueError on a PromQL syntax error
        assert names, expr
        assert names <= exported, (expr, names - exported)


def test_dashboard_ranges_follow_the_scrape_interval(repo_root: Path) -> None:
    # $__rate_interval (at least four scrape intervals) rather than a fixed [5m]
    for expr in _exprs(repo_root):
        for window in re.findall(r"\[([^\]]*)\]", expr):
            assert window == "$__rate_interval", expr


def test_dashboard_has_cache_and_analyses_panels(repo_root: Path) -> None:
    names = set().union(*(_metric_names(e) for e in _exprs(repo_root)))
    assert {
        "ci_sizer_sizing_cache_lookups_total",
        "ci_sizer_analyses_total",
        "ci_sizer_analyses_running",
        "ci_sizer_change_feed_up",
        "ci_sizer_database_ready",
        "ci_sizer_retention_backlog_jobs",
    } <= names


def test_panels_link_to_every_alert(repo_root: Path) -> None:
    # Grafana's rule list takes a `rule:NAME` search term (grafana/grafana,
    # public/app/features/alerting/unified/search/rulesSearchParser.ts)
    rules = yaml.safe_load((repo_root / "prometheus/rules/ci-sizer.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    linked = set()
    for p in _dashboard(repo_root)["panels"]:
        for link in p.get("links", []):
            m = re.fullmatch(r"/alerting/list\?search=rule:(\w+)", link["url"])
            assert m, link
            assert m.group(1) in alerts, link  # a link to an alert that exists
            assert link["title"] == f"Alert rule: {m.group(1)}"
            linked.add(m.group(1))
    assert linked == alerts


def test_promql_check_catches_mistakes() -> None:
    with pytest.raises(ValueError, match="parenthesis"):
        promql_parser.parse("sum(rate(ci_sizer_http_requests_total[5m])")
    assert _metric_names("rate(ci_sizer_nope_total[5m])") - _exported_series() == {"ci_sizer_nope_total"}


async def test_every_panel_queries_a_real_series(client: httpx.AsyncClient, repo_root: Path, db_url: str) -> None:
    await post_runs(client, run(1), run(2, container(oom_killed=True)))
    await sizing(client)
    present = {name for name, _ in await scrape(client)}
    # SQLite has no change feed, so no ci_sizer_change_feed_up (an alert on it must not fire there)
    absent = set() if db_url.startswith("postgresql") else {"ci_sizer_change_feed_up"}
    # the admission webhook's series come from its own process (tests/webhook checks them there)
    absent |= {n for n in _exported_series() if n.startswith("ci_sizer_webhook_")}
    for expr in _exprs(repo_root):
        for name in _metric_names(expr) - absent:
            assert name in present, (expr, name)


def test_dashboard_datasource_and_scrape_config_are_wired(repo_root: Path) -> None:
    # a datasource template variable, not a fixed uid: the dashboard imports into any Grafana
    provisioned = yaml.safe_load((repo_root / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert provisioned["datasources"][0]["type"] == "prometheus"
    (variable,) = [v for v in _dashboard(repo_root)["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    ref = {"type": "prometheus", "uid": "${" + variable["name"] + "}"}
    for p in _dashboard(repo_root)["panels"]:
        assert p["datasource"] == ref, p["title"]
        assert all(t["datasource"] == ref for t in p["targets"]), p["title"]
    assert provisioned["datasources"][0]["uid"] not in (repo_root / "grafana/dashboards/ci-sizer.json").read_text()
    prom = yaml.safe_load((repo_root / "prometheus/prometheus.yml").read_text())
    target = prom["scrape_configs"][0]["static_configs"][0]["targets"][0]
    compose = yaml.safe_load((repo_root / "docker-compose.yml").read_text())
    host, port = target.split(":")
    assert host in compose["services"]
    assert compose["services"][host]["environment"]["CI_SIZER_PORT"] == port
    assert {"prometheus", "grafana", "postgres"} <= set(compose["services"])
    mounts = " ".join(compose["services"]["grafana"]["volumes"])
    assert "./grafana/dashboards" in mounts
    assert "./grafana/provisioning" in mounts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.ci  # the CI tier (README): a live server with two workers
def test_several_workers_aggregate_metrics(tmp_path: Path) -> None:
    """Two workers: counters summed across both; each worker's process_* and python_info kept,
    labelled pid; an operator-set PROMETHEUS_MULTIPROC_DIR is never emptied or deleted: the service
    works in a directory it creates there, and removes only that one at exit."""
    operator_dir = tmp_path / "prom"
    (operator_dir / "other-service").mkdir(parents=True)
    (operator_dir / "other-service" / "counter_1.db").write_bytes(b"not ours")
    (operator_dir / "notes.txt").write_text("keep me")
    port = _free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(operator_dir)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service",
            "serve",
            "--workers",
            "2",
            "--port",
            str(port),
            "--database-url",
            f"sqlite:///{tmp_path}/w.db",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not healthy(port):
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        with httpx.Client(base_url=base, timeout=5) as c:
            for _ in range(40):
                assert c.get("/api/v1/sizing/a/b/c/d").status_code == 200
            # issue 39: the worst worker's readiness says what /readyz says, whichever worker answers
            # (the supervisor, which serves nothing, kept a 0 in the directory, and this read 0 for ever).
            # A worker still starting is not ready yet: wait until both are (the supervisor's 0 never goes)
            deadline = time.monotonic() + 60
            while value(samples(c.get("/metrics").text), "ci_sizer_database_ready") != 1:
                assert time.monotonic() < deadline, "the workers never all read ready"
                time.sleep(0.2)
            for _ in range(10):
                assert c.get("/readyz").status_code == 200
                assert value(samples(c.get("/metrics").text), "ci_sizer_database_ready") == 1
            # a large body is reduced in a process a worker starts, which writes to the directory too:
            # its six stats are counted, and its gauges (created at 0) are no worker's readiness
            samples_run = run(1, container(cpu=[float(i % 97) for i in range(60_000)]))
            assert len(json.dumps(samples_run)) > MIN_BYTES
            assert c.post("/api/v1/runs", json=samples_run, timeout=60).status_code == 201
            after = samples(c.get("/metrics").text)
            assert value(after, "ci_sizer_core_compute_duration_seconds_count", operation="six_stats") == 1
            assert value(after, "ci_sizer_database_ready") == 1
            text = c.get("/metrics").text
            pids_seen = set()
            for _ in range(20):  # whichever worker answers, every worker's process is there
                families = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
                pids = {s.labels["pid"] for s in families["process_resident_memory_bytes"].samples}
                pids_seen |= pids
                assert len(pids) >= 3, pids  # two workers and their supervisor
                assert {s.labels["pid"] for s in families["python_info"].samples} == pids
                assert {s.labels["pid"] for s in families["process_cpu_seconds"].samples} == pids
        assert len(pids_seen) == len(pids)  # the same processes at every scrape
        snapshot = samples(text)
        # the latency histogram's edges are the configured deadline's (250 ms), in every process's
        # file: none written with other edges before the app's startup chose them
        edges = {
            dict(labels)["le"]
            for name, labels in snapshot
            if name == "ci_sizer_http_request_duration_seconds_bucket" and dict(labels)["route"] == SIZING_ROUTE
        }
        assert edges == {*(str(e) for e in latency_buckets(0.25)), "+Inf"}
        served = value(snapshot, "ci_sizer_http_requests_total", route=SIZING_ROUTE, method="GET", status_class="2xx")
        assert served == 40  # summed across both workers' files
        assert value(snapshot, "ci_sizer_recommendations_total", phase="unknown", override_scope="global") == 40
        (ours,) = [p for p in operator_dir.iterdir() if p.name.startswith("ci-sizer-metrics-")]
        assert len(list(ours.glob("counter_*.db"))) >= 2  # both workers wrote their values
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0
    # what was there before is untouched; the directory the service made is gone
    assert sorted(p.name for p in operator_dir.iterdir()) == ["notes.txt", "other-service"]
    assert (operator_dir / "notes.txt").read_text() == "keep me"
    assert (operator_dir / "other-service" / "counter_1.db").read_bytes() == b"not ours"


def test_multiprocess_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--workers", "2", "--database-url", f"sqlite:///{tmp_path}/w.db"],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(blocker / "sub")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"ci-sizer: error: cannot create the metrics directory in {blocker / 'sub'}: Not a directory"
    ]
    assert blocker.read_text() == ""
