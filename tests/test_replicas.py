"""Two replicas (two ``ci-sizer serve`` processes, as two pods of deploy/kubernetes) over one
PostgreSQL: what is written through one is served by the other within a second, although the
other held a cached answer from before the write."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import _clean
from .helpers import container, run, sizing_path
from .live import LiveServer
from .observability.test_metrics import samples, value

#: the CI tier (README): two live servers on one database
pytestmark = pytest.mark.ci


@pytest.fixture
def replicas(postgresql_database: str, tmp_path: Path) -> Iterator[tuple[LiveServer, LiveServer]]:
    # the database is migrated first, as the migration Job does before the Deployment rolls out
    a = LiveServer(postgresql_database, log=tmp_path / "a.log")
    b = LiveServer(postgresql_database, log=tmp_path / "b.log")
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        a.stop()
        b.stop()
        asyncio.run(_clean(postgresql_database))


def _feed_listening(server: LiveServer) -> bool:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    return value(samples(text), "ci_sizer_change_feed_up", channel="ci_sizer_changes") == 1


def _wait(check: object, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.05)


def test_an_override_written_through_one_replica_is_served_by_the_other_within_a_second(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    a, b = replicas
    job = {"org": f"org-{uuid.uuid4().hex[:8]}", "repo": "web", "workflow": "ci.yml", "job": "build"}
    with httpx.Client(base_url=a.url, timeout=5) as ca, httpx.Client(base_url=b.url, timeout=5) as cb:
        for body in (run(1, container(cpu=400), job=job), run(2, container(cpu=500), job=job)):
            assert ca.post("/api/v1/runs", json=body).status_code == 201
        _wait(lambda: _feed_listening(a) and _feed_listening(b))
        before = cb.get(sizing_path(job))
        assert before.status_code == 200
        limit_before = before.json()["containers"][0]["cpu"]["limit"]
        assert limit_before != "3"
        assert cb.get(sizing_path(job)).json() == before.json()  # b now serves it from its cache
        hits = value(samples(cb.get("/metrics").text), "ci_sizer_sizing_cache_lookups_total", result="hit")
        assert hits >= 1

        r = ca.put(f"/api/v1/sizing/overrides/{job['org']}/{job['repo']}", json={"cpu_limit": "3"})
        assert r.status_code == 201, r.text
        written = time.monotonic()
        while True:
            answer = cb.get(sizing_path(job)).json()
            took = time.monotonic() - written
            if answer["containers"][0]["cpu"]["limit"] == "3":
                break
            assert took < 1.0, f"replica b still served the old answer {took:.2f} s after the write"
            time.sleep(0.01)
        assert answer["meta"]["override_scope"] == "repo"
        assert took < 1.0
