"""A shutdown that ends within the Deployment's grace period (issue 39, item 5): one SIGTERM to a
2-worker server on PostgreSQL under load, with the database hanging; a background task that
ignores its cancellation; the change feed, which did (asyncio.wait_for on Python 3.11); and the
deadline that ends a process whose shutdown overruns (service/shutdown.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
import pytest
import yaml
from sqlalchemy.engine import make_url

from bench._proxy import Proxy  # the soak's proxy: a database that accepts connections and never answers
from service import shutdown
from service.cache import AnswerCache
from service.changes import ChangeFeed
from service.main import _periodic, create_app
from service.settings import Settings

from ..helpers import container, run, sizing_path
from ..live import free_port
from .test_metrics import samples, value


def _grace_seconds(repo_root: Path) -> float:
    deployment = yaml.safe_load((repo_root / "deploy/kubernetes/base/deployment.yaml").read_text())
    return float(deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])


def test_the_shutdown_budget_fits_the_grace_period(repo_root: Path) -> None:
    # uvicorn's drain, the lifespan's bounded steps and the interpreter's exit, in that order, end
    # before Kubernetes kills the pod
    grace = _grace_seconds(repo_root)
    steps = shutdown.TASKS_SECONDS + shutdown.WRITES_SECONDS + 2 * shutdown.CLOSE_SECONDS
    assert steps <= shutdown.SHUTDOWN_SECONDS
    assert shutdown.DRAIN_SECONDS + shutdown.SHUTDOWN_SECONDS + shutdown.EXIT_SECONDS < grace
    assert shutdown.uvicorn_settings() == {"timeout_graceful_shutdown": shutdown.DRAIN_SECONDS}


async def test_a_task_that_ignores_its_cancellation_does_not_hold_the_shutdown(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # as a task that swallows its cancellation
                await release.wait()

    app = create_app(Settings(database_url=db_url))
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    task = asyncio.create_task(stubborn(), name="stubborn analysis")
    app.state.analysis_tasks.add(task)
    await asyncio.sleep(0.1)  # it runs (a task cancelled before it starts just ends)
    started = time.monotonic()
    exiting = asyncio.create_task(lifespan.__aexit__(None, None, None))
    done, _ = await asyncio.wait({exiting}, timeout=shutdown.SHUTDOWN_SECONDS)
    took = time.monotonic() - started
    release.set()  # the old shutdown waited for it forever: let it end either way
    await exiting
    await task
    assert done, "the shutdown waited for a task that ignores its cancellation"
    assert took < shutdown.SHUTDOWN_SECONDS
    assert took >= shutdown.TASKS_SECONDS  # it was waited for, as long as the budget says
    assert any("background task stubborn analysis did not stop" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("moment", ["connect", "heartbeat"])
async def test_the_change_feed_stops_when_cancelled_as_a_call_completes(postgresql_only: str, moment: str) -> None:
    """The cancellation lands as the feed's connect, or its heartbeat query, completes: on Python
    3.11 ``asyncio.wait_for`` then returned the call's result and dropped the cancellation, and the
    feed went on heartbeating; the lifespan waited for it forever (the shutdown that hung in
    "Waiting for application shutdown", querying the database). The feed must end, its connection
    closed. (Real connections to PostgreSQL; the test only chooses the moment of the cancellation.)"""
    feed_task: list[asyncio.Task[None]] = []
    connections: list[Any] = []

    class CancelAsHeartbeatCompletes(asyncpg.Connection):  # type: ignore[misc]
        async def fetchval(self, *args: Any, **kwargs: Any) -> Any:
            answer = await super().fetchval(*args, **kwargs)
            feed_task[0].cancel()
            return answer

    async def connect(dsn: str) -> Any:
        if moment == "heartbeat":
            conn = await asyncpg.connect(dsn, connection_class=CancelAsHeartbeatCompletes)
        else:
            conn = await asyncpg.connect(dsn)
            feed_task[0].cancel()
        connections.append(conn)
        return conn

    feed = ChangeFeed(AnswerCache(10), postgresql_only, heartbeat_seconds=0.2, connect=connect)
    feed_task.append(asyncio.create_task(feed.run()))
    _, pending = await asyncio.wait(feed_task, timeout=5)
    for task in pending:  # stop it for good
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)
    assert not pending, f"the feed went on after a cancellation at its {moment}"
    assert feed_task[0].cancelled()
    assert len(connections) == 1
    assert connections[0].is_closed()
    assert not feed.listening.is_set()


@pytest.mark.parametrize("swallow", ["ignores it", "turns it into an error"])
async def test_a_periodic_task_ends_even_if_its_job_swallows_the_cancellation(swallow: str) -> None:
    # every background task of the lifespan is a _periodic loop: a job that drops its cancellation
    # (as asyncio.wait_for could on 3.11) or turns it into another error must not keep the loop going
    runs = 0
    checked = False

    async def job() -> None:
        nonlocal runs
        runs += 1
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if checked:
                raise
            if swallow == "turns it into an error":
                raise RuntimeError("a cleanup failed while cancelled") from None

    task = asyncio.create_task(_periodic(0.01, job, at_start=True))
    await asyncio.sleep(0.05)
    task.cancel()
    _, pending = await asyncio.wait({task}, timeout=2)
    checked = True  # from here the job lets a cancellation through: the loop can be stopped either way
    for left in pending:
        left.cancel()
        await asyncio.wait({left}, timeout=2)
    assert not pending, f"the loop went on after its job {swallow}"
    assert runs == 1


def test_a_shutdown_past_its_budget_ends_the_process(tmp_path: Path) -> None:
    # a process whose shutdown is held (here: a thread the interpreter joins at exit, as it joins an
    # analysis' worker thread) ends itself at the deadline, and the log says why
    script = (
        "import logging, threading, time\n"
        "from service import shutdown\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "shutdown.exit_after(0.5)\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert time.monotonic() - started < 20
    assert done.returncode == shutdown.OVERRUN_EXIT_STATUS
    assert "shutdown did not finish within 0.5s: the process ends itself" in done.stderr


async def _load(base: str, stop: asyncio.Event, counts: dict[str, int]) -> None:
    """Build-path traffic (runs posted, answers read) from 8 clients until ``stop``."""
    ids = itertools.count()
    prefix = uuid.uuid4().hex[:8]

    async def client(i: int) -> None:
        job = {"org": f"org-{prefix}", "repo": "web", "workflow": "ci.yml", "job": f"build-{i}"}
        async with httpx.AsyncClient(base_url=base, timeout=15) as c:
            while not stop.is_set():
                try:
                    r = await c.post("/api/v1/runs", json=run(next(ids), container(cpu=400 + i), job=job))
                    counts[str(r.status_code)] = counts.get(str(r.status_code), 0) + 1
                    r = await c.get(sizing_path(job))
                    counts[str(r.status_code)] = counts.get(str(r.status_code), 0) + 1
                except httpx.HTTPError:
                    counts["refused"] = counts.get("refused", 0) + 1
                    await asyncio.sleep(0.05)

    await asyncio.gather(*(client(i) for i in range(8)))


async def _until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


@pytest.mark.ci  # the CI tier (README): two workers under load
async def test_one_sigterm_stops_two_workers_under_load_within_the_grace_period(
    postgresql_only: str, repo_root: Path, tmp_path: Path
) -> None:
    """The pod's stop as Kubernetes does it: one SIGTERM, then the grace period. The two workers are
    answering builds when the database stops answering (it accepts connections and never replies),
    then the SIGTERM comes. The old shutdown waited on the database without a bound, step after step
    (the last fleet totals, a retention pass per job, closing each connection)."""
    grace = _grace_seconds(repo_root)
    u = make_url(postgresql_only)
    proxy = await Proxy((u.host or "127.0.0.1", u.port or 5432)).start()
    url = u.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--workers", "2", "--port", str(port), "--database-url", url],
            stdout=out,
            stderr=out,
            start_new_session=True,  # its own process group: the workers go with it if the test must kill
        )
    stop = asyncio.Event()
    counts: dict[str, int] = {}
    load: asyncio.Task[None] | None = None
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5) as c:

            async def ready() -> bool:
                assert proc.poll() is None, log.read_text()
                with contextlib.suppress(httpx.HTTPError):
                    metrics = samples((await c.get("/metrics")).text)
                    return (
                        (await c.get("/readyz")).status_code == 200
                        and value(metrics, "ci_sizer_database_ready") == 1
                        and value(metrics, "ci_sizer_change_feed_up", channel="ci_sizer_changes") == 1
                    )
                return False

            # both workers up, each listening on PostgreSQL (the feed is the worst worker's)
            await _until(ready, 60, "the server did not start")
        load = asyncio.create_task(_load(base, stop, counts))
        await asyncio.sleep(1.5)
        await proxy.set_mode("hang")
        await asyncio.sleep(0.5)  # requests in flight, waiting on the database
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        while proc.poll() is None and time.monotonic() - sent < grace + 5:
            await asyncio.sleep(0.1)
        took = time.monotonic() - sent
    finally:
        stop.set()
        if load is not None:
            await load
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, and only it
            proc.wait(10)
        await proxy.stop()
    assert counts.get("201", 0) > 0, counts  # it was under load
    assert took < grace, f"still running {took:.1f} s after the SIGTERM:\n{log.read_text()[-3000:]}"
    assert proc.returncode == 0
    # each worker ended on its own, every step within its bound: the deadline had nothing to end
    assert "the process ends itself" not in log.read_text()
