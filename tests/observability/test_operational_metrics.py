"""The metrics the alerting rules read (prometheus/rules/ci-sizer.yml): each one moves with what it
reports, and every labelled counter exists before its first event."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from service import analyses
from service.cache import AnswerCache
from service.changes import CHANNEL
from service.db import build_engine, build_sessionmaker
from service.keys import ScopeKey
from service.main import create_app
from service.observability import metrics
from service.runs.retention import Pruner
from service.settings import Settings

from ..helpers import run
from .promtool import TARGET, evaluate, replay, series_of
from .test_metrics import samples, scrape, value

UNREACHABLE = "postgresql+asyncpg://postgres@127.0.0.1:1/nowhere"


def test_labelled_counters_exist_before_their_first_event() -> None:
    # a fresh process that has served nothing: every label set a dashboard or alert rate() reads is
    # there at 0, so `rate(...)` is 0 rather than missing (no data) until the first event (the
    # request durations once the app's startup gave them the edges of its deadline)
    script = (
        "from service.observability import metrics as m; m.use_sizing_deadline(0.25); print(m.render()[0].decode())"
    )
    text = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    snapshot = samples(text)
    expected = [
        ("ci_sizer_runs_ingested_total", {"result": r}) for r in ("created", "duplicate", "conflict", "rejected")
    ]
    expected += [("ci_sizer_sizing_cache_lookups_total", {"result": r}) for r in ("hit", "miss")]
    expected += [
        ("ci_sizer_recommendations_total", {"phase": p, "override_scope": s})
        for p in ("unknown", "learning", "confident")
        for s in ("job", "workflow", "repo", "org", "global")
    ]
    expected += [
        ("ci_sizer_analyses_total", {"kind": k, "result": r})
        for k in ("simulation", "backtest")
        for r in ("done", "failed", "interrupted")
    ]
    expected += [
        ("ci_sizer_http_requests_total", {"route": route, "method": method, "status_class": c})
        for route, method in (
            ("/api/v1/sizing/{org}/{repo}/{workflow}/{job}", "GET"),
            ("/api/v1/runs", "POST"),
            ("/api/v1/runs:batch", "POST"),
        )
        for c in ("2xx", "4xx", "5xx")
    ]
    expected += [
        (
            "ci_sizer_http_request_duration_seconds_count",
            {"route": "/api/v1/sizing/{org}/{repo}/{workflow}/{job}", "method": "GET"},
        ),
        ("ci_sizer_core_compute_duration_seconds_count", {"operation": "size_job"}),
    ]
    for name, labels in expected:
        key = (name, tuple(sorted(labels.items())))
        assert key in snapshot, (name, labels)
        assert snapshot[key] == 0


async def test_sizing_deadline_and_database_ready_are_exported(make_client: Any) -> None:
    async with make_client(sizing_deadline_ms=1234) as client:
        snapshot = await scrape(client)
        assert value(snapshot, "ci_sizer_sizing_deadline_seconds") == pytest.approx(1.234)
        assert value(snapshot, "ci_sizer_database_ready") == 1  # checked at start


async def test_database_not_ready_is_exported() -> None:
    app = create_app(Settings(database_url=UNREACHABLE))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            metrics.DATABASE_READY.set(1)
            r = await client.get("/readyz")
            assert r.status_code == 503
            assert r.headers["content-type"] == "application/problem+json"
            assert value(await scrape(client), "ci_sizer_database_ready") == 0


async def test_the_readiness_gauge_follows_the_database_without_a_probe(db_url: str) -> None:
    from service.health import check_database

    good, bad = build_engine(db_url), build_engine(UNREACHABLE)
    try:
        assert await check_database(bad) is not None
        assert value(samples(metrics.render()[0].decode()), "ci_sizer_database_ready") == 0
        assert await check_database(good) is None
        assert value(samples(metrics.render()[0].decode()), "ci_sizer_database_ready") == 1
    finally:
        await good.dispose()
        await bad.dispose()


async def test_change_feed_gauge_follows_the_listening_connection(
    make_client: Any, db_url: str, promtool: str, repo_root: Path, tmp_path: Path
) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("the change feed is PostgreSQL's LISTEN/NOTIFY")
    async with make_client() as client:
        feed = client.app.state.change_feed
        feed.retry_seconds = 0.5
        up = await scrape(client)
        assert value(up, "ci_sizer_change_feed_up", channel=CHANNEL) == 1
        u = make_url(db_url)
        admin = await asyncpg.connect(host=u.host, port=u.port, user=u.username, database=u.database)
        try:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND query ILIKE $2",
                u.database,
                f"%LISTEN%{CHANNEL}%",
            )
            assert killed == 1
            await _until(lambda: not feed.listening.is_set())
            down = await scrape(client)
            assert value(down, "ci_sizer_change_feed_up", channel=CHANNEL) == 0
            await asyncio.wait_for(feed.listening.wait(), 10)
            assert value(await scrape(client), "ci_sizer_change_feed_up", channel=CHANNEL) == 1
        finally:
            await admin.close()
    # CiSizerChangeFeedDown on these scrapes: quiet while the feed listens, firing once it has been
    # down for its 2 minutes
    alert = "CiSizerChangeFeedDown"
    names = series_of(repo_root, alert)
    evaluate(promtool, repo_root, tmp_path, alert, replay(up, up, names, 10), eval_time="5m", exp_labels=[])
    evaluate(promtool, repo_root, tmp_path, alert, replay(up, down, names, 10), eval_time="5m", exp_labels=[TARGET])


async def _until(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not seen in time"
        await asyncio.sleep(0.02)


async def test_retention_backlog_counts_jobs_whose_pruning_failed(
    db_url: str, promtool: str, repo_root: Path, tmp_path: Path
) -> None:
    bad = build_engine(UNREACHABLE)
    good = build_engine(db_url)
    cache = AnswerCache(10)
    pruner = Pruner(keep=1)
    try:
        for job_id in (1, 2, 3):
            pruner.note(job_id, ScopeKey("o", "r", "w", f"j{job_id}"))
        await pruner.run_once(build_sessionmaker(bad), cache)
        failing = samples(metrics.render()[0].decode())
        assert value(failing, "ci_sizer_retention_backlog_jobs") == 3
        assert len(pruner.pending) == 3
        await pruner.run_once(build_sessionmaker(good), cache)  # no such jobs: nothing to prune, no failure
        healthy = samples(metrics.render()[0].decode())
        assert value(healthy, "ci_sizer_retention_backlog_jobs") == 0
    finally:
        await bad.dispose()
        await good.dispose()
    # CiSizerRetentionBacklog: quiet while passes succeed, firing once they have failed for 15 minutes
    alert = "CiSizerRetentionBacklog"
    names = series_of(repo_root, alert)
    evaluate(promtool, repo_root, tmp_path, alert, replay(healthy, healthy, names, 25), eval_time="20m", exp_labels=[])
    firing = replay(healthy, failing, names, 25)
    evaluate(promtool, repo_root, tmp_path, alert, firing, eval_time="10m", exp_labels=[])
    evaluate(promtool, repo_root, tmp_path, alert, firing, eval_time="20m", exp_labels=[TARGET])


async def test_retention_counts_the_runs_it_deletes(make_client: Any) -> None:
    from ..helpers import post_runs

    async with make_client(retention_runs=1) as client:
        before = value(await scrape(client), "ci_sizer_retention_pruned_runs_total")
        await post_runs(client, run(1), run(2), run(3))
        await client.app.state.pruner.run_once(client.app.state.write_sessionmaker, client.app.state.answers)
        assert value(await scrape(client), "ci_sizer_retention_pruned_runs_total") - before == 2


async def test_analyses_are_counted_by_result(db_url: str, promtool: str, repo_root: Path, tmp_path: Path) -> None:
    engine = build_engine(db_url)

    def count(result: str) -> float:
        return value(samples(metrics.render()[0].decode()), "ci_sizer_analyses_total", kind="backtest", result=result)

    async def good() -> analyses.Work:
        return lambda progress: {"ok": True}

    async def broken() -> analyses.Work:
        raise RuntimeError("the history could not be read")

    async def slow() -> analyses.Work:
        await asyncio.sleep(60)
        raise AssertionError("not reached")

    limits = analyses.Limits()
    try:
        done, failed, interrupted = count("done"), count("failed"), count("interrupted")
        scrapes = [samples(metrics.render()[0].decode())]
        for prepare in (good, broken):
            analysis_id = await analyses.create(engine=engine, kind="backtest", request={}, created_by="t")
            await analyses.run(engine=engine, analysis_id=analysis_id, prepare=prepare, kind="backtest", limits=limits)
            scrapes.append(samples(metrics.render()[0].decode()))
        assert (count("done") - done, count("failed") - failed) == (1, 1)
        analysis_id = await analyses.create(engine=engine, kind="backtest", request={}, created_by="t")
        task = asyncio.create_task(
            analyses.run(engine=engine, analysis_id=analysis_id, prepare=slow, kind="backtest", limits=limits)
        )
        await asyncio.sleep(0.2)
        running = value(samples(metrics.render()[0].decode()), "ci_sizer_analyses_running", kind="backtest")
        assert running == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert count("interrupted") - interrupted == 1
        interrupting = samples(metrics.render()[0].decode())
        assert value(interrupting, "ci_sizer_analyses_running", kind="backtest") == 0
    finally:
        limits.close()
        await engine.dispose()
    # CiSizerAnalysesFailing: quiet on analyses done or interrupted, firing on the failed one
    alert = "CiSizerAnalysesFailing"
    names = series_of(repo_root, alert)
    before, after_done, after_failed = scrapes
    for quiet in (replay(before, after_done, names, 10), replay(after_failed, interrupting, names, 10)):
        evaluate(promtool, repo_root, tmp_path, alert, quiet, eval_time="5m", exp_labels=[])
    firing = replay(after_done, after_failed, names, 10)
    evaluate(promtool, repo_root, tmp_path, alert, firing, eval_time="5m", exp_labels=[{"kind": "backtest"}])


def test_rule_metrics_are_documented(repo_root: Any) -> None:
    text = (repo_root / "docs" / "observability.md").read_text()
    for metric in metrics.EXPORTED:
        assert f"`{metric._name}" in text, metric._name  # type: ignore[attr-defined]


def test_exposition_has_no_series_without_help() -> None:
    for family in text_string_to_metric_families(metrics.render()[0].decode()):
        if family.name.startswith("ci_sizer_"):
            assert family.documentation, family.name


async def test_run_posts_that_fail_fire_the_ingest_alert(
    make_client: Any, db_url: str, promtool: str, repo_root: Path, tmp_path: Path
) -> None:
    # runs posted while another session holds the tables: each waits its ingest timeout and is
    # answered 503 (the collector retries, then spools); CiSizerIngestUnavailable reads the share
    if not db_url.startswith("postgresql"):
        pytest.skip("a table lock that stops the writes of a PostgreSQL database")
    job = {"org": "acme", "repo": "web", "workflow": "ci.yml", "job": "build"}
    async with make_client(ingest_timeout_seconds=0.3) as client:
        healthy_start = await scrape(client)
        for n in range(10):
            assert (await client.post("/api/v1/runs", json=run(n, job=job))).status_code == 201
        healthy = await scrape(client)
        u = make_url(db_url)
        locker = await asyncpg.connect(host=u.host, port=u.port, user=u.username, database=u.database)
        try:
            async with locker.transaction():
                await locker.execute("LOCK TABLE jobs, runs IN ACCESS EXCLUSIVE MODE")
                answers = await asyncio.gather(
                    *(client.post("/api/v1/runs", json=run(100 + n, job=job)) for n in range(10))
                )
        finally:
            await locker.close()
        failing = await scrape(client)
    assert [a.status_code for a in answers] == [503] * 10
    alert = "CiSizerIngestUnavailable"
    names = series_of(repo_root, alert)
    evaluate(
        promtool, repo_root, tmp_path, alert, replay(healthy_start, healthy, names, 15), eval_time="10m", exp_labels=[]
    )
    firing = replay(healthy, failing, names, 15)
    evaluate(promtool, repo_root, tmp_path, alert, firing, eval_time="4m", exp_labels=[])  # its 5 minutes not yet up
    evaluate(promtool, repo_root, tmp_path, alert, firing, eval_time="10m", exp_labels=[{}])
