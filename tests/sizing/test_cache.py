"""The in-process cache of sizing answers: fresh until what they were computed from changes,
in this worker at once and in other workers (PostgreSQL) through the change feed."""

from __future__ import annotations

import asyncio
import gc
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson
import pytest
from sqlalchemy.engine import make_url

from service.cache import ENTRIES_PER_JOB, RENDERING_BYTES_KEPT, RENDERINGS_KEPT, AnswerCache, CacheKey, Entry
from service.changes import CHANNEL
from service.keys import ScopeKey
from service.sizing import formats
from service.sizing import service as sizing_service
from service.sizing.fit import TemplateCpu
from service.sizing.history import History

from ..helpers import JOB, MIB, container, post_runs, run, sizing, sizing_path

KEY = ScopeKey("o", "r", "w", "j")
P = CacheKey(5, 20, "p95")


def entry(body: bytes = b"{}", fresh_until: float = float("inf")) -> Entry:
    # an unseen job's answer (the unknown-phase defaults), as the sizing service computes it
    answer = sizing_service.compute(key=KEY, history=History(), pins={}, params=P, policy=sizing_service.Policy())
    return Entry(answer=answer, body=body, fresh_until=fresh_until)


def stored(cache: AnswerCache, key: ScopeKey = KEY, body: bytes = b"{}", **kw: Any) -> None:
    cache.put(key, P, cache.ticket(key), entry(body, **kw))


# --------------------------------------------------------------------------- the structure


def test_fresh_until_invalidated() -> None:
    cache = AnswerCache(10)
    stored(cache, body=b"a")
    hit = cache.fresh(KEY, P)
    assert hit is not None
    assert hit.body == b"a"
    assert cache.fresh(KEY, CacheKey(3, 20, "p95")) is None  # other parameters: not cached
    cache.invalidate(ScopeKey("o", "r", "w", "other"))
    assert cache.fresh(KEY, P) is not None  # another job's change leaves it alone
    cache.invalidate(KEY)
    assert cache.fresh(KEY, P) is None
    last = cache.last_served(KEY, P)
    assert last is not None
    assert last.body == b"a"  # still there for degraded answers
    stored(cache, body=b"b")
    assert cache.fresh(KEY, P) is not None
    cache.invalidate_all()
    assert cache.fresh(KEY, P) is None


def test_an_answer_computed_across_a_change_is_not_kept_fresh() -> None:
    # the computation read the database before the change committed: its answer may be stale
    cache = AnswerCache(10)
    ticket = cache.ticket(KEY)
    cache.invalidate(KEY)
    cache.put(KEY, P, ticket, entry(b"old"))
    assert cache.fresh(KEY, P) is None
    last = cache.last_served(KEY, P)
    assert last is not None
    assert last.body == b"old"
    ticket = cache.ticket(KEY)
    cache.invalidate_all()
    cache.put(KEY, P, ticket, entry(b"old"))
    assert cache.fresh(KEY, P) is None


def test_expiry_ttl_and_distrust() -> None:
    cache = AnswerCache(10)
    stored(cache, fresh_until=time.time() - 1)  # an applied override already expired
    assert cache.fresh(KEY, P) is None
    ttl = AnswerCache(10, ttl_seconds=0.05)
    stored(ttl)
    assert ttl.fresh(KEY, P) is not None
    time.sleep(0.08)
    assert ttl.fresh(KEY, P) is None
    stored(cache)
    cache.trusted = False  # the change feed is down: nothing is fresh
    assert cache.fresh(KEY, P) is None
    assert cache.last_served(KEY, P) is not None


def test_bounded_by_jobs_least_recently_served_first() -> None:
    cache = AnswerCache(2)
    keys = [ScopeKey("o", "r", "w", str(n)) for n in range(3)]
    stored(cache, keys[0])
    stored(cache, keys[1])
    assert cache.fresh(keys[0], P) is not None  # 0 served: 1 is now the oldest
    stored(cache, keys[2])
    assert len(cache) == 2
    assert cache.last_served(keys[1], P) is None
    assert cache.fresh(keys[0], P) is not None
    assert cache.fresh(keys[2], P) is not None
    assert len(AnswerCache(0)) == 0
    off = AnswerCache(0)
    stored(off)
    assert off.fresh(KEY, P) is None
    assert off.last_served(KEY, P) is None


# --------------------------------------------------------------------------- through the API


def hits(client: Any) -> tuple[float, float]:
    from prometheus_client import REGISTRY

    def value(result: str) -> float:
        return REGISTRY.get_sample_value("ci_sizer_sizing_cache_lookups_total", {"result": result}) or 0.0

    return value("hit"), value("miss")


async def test_served_from_cache_until_a_run_is_stored(make_client: Any) -> None:
    async with make_client() as client:
        await post_runs(client, run(1, container(cpu=400, mem=300 * MIB)))
        first = await sizing(client)
        h0, m0 = hits(client)
        again = await sizing(client)
        h1, m1 = hits(client)
        assert again == first  # the same bytes, generated_at included: it was not recomputed
        assert (h1 - h0, m1 - m0) == (1, 0)
        await post_runs(client, run(2, container(cpu=800, mem=600 * MIB)))
        after = await sizing(client)
        assert after["meta"]["clean_samples"] == 2
        assert after["containers"][0]["observed"]["memory_bytes"] == 600 * MIB
        # a duplicate post changes nothing and keeps the cache
        dup = await client.post("/api/v1/runs", json=run(2, container(cpu=800, mem=600 * MIB)))
        assert dup.json()["result"] == "duplicate"
        h2, _ = hits(client)
        assert await sizing(client) == after
        assert hits(client)[0] - h2 == 1


async def test_override_writes_and_expiry_invalidate(make_client: Any) -> None:
    async with make_client() as client:
        await post_runs(client, *(run(n, container(cpu=400, mem=300 * MIB)) for n in range(3)))
        before = await sizing(client)
        assert before["containers"][0]["cpu"]["source"]["limit"] == "algorithm"
        expires = (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat()
        r = await client.put(f"/api/v1/sizing/overrides/{JOB['org']}", json={"cpu_limit": "3", "expires_at": expires})
        assert r.status_code == 201, r.text
        pinned = await sizing(client)
        assert pinned["containers"][0]["cpu"]["limit"] == "3"
        assert (await sizing(client)) == pinned  # cached...
        await asyncio.sleep(1.7)
        expired = await sizing(client)  # ...but only until the override expires, with no write
        assert expired["containers"][0]["cpu"]["source"]["limit"] == "algorithm"
        r = await client.put(f"/api/v1/sizing/overrides/{JOB['org']}", json={"memory_limit": "1Gi"})
        assert r.status_code == 200, r.text
        assert (await sizing(client))["containers"][0]["memory"]["limit"] == "1Gi"
        assert (await client.delete(f"/api/v1/sizing/overrides/{JOB['org']}")).status_code == 204
        assert (await sizing(client))["containers"][0]["memory"]["source"]["limit"] == "algorithm"


async def test_pruning_invalidates(make_client: Any) -> None:
    async with make_client(retention_runs=2, retention_interval_seconds=0.05) as client:
        await post_runs(client, *(run(n, container(mem=(n + 1) * 100 * MIB)) for n in range(3)))
        deadline = time.monotonic() + 20
        while (await sizing(client))["meta"]["clean_samples"] != 2:
            assert time.monotonic() < deadline, "the pruned run still counts in a cached answer"
            await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- across workers (PostgreSQL)


def pg_only(db_url: str) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("the change feed is PostgreSQL's LISTEN/NOTIFY; SQLite workers use a TTL")


async def eventually(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "not seen in time"
        await asyncio.sleep(0.02)


async def test_other_workers_hear_of_changes(make_client: Any, db_url: str) -> None:
    pg_only(db_url)
    async with make_client() as a, make_client() as b:
        for c in (a, b):
            await asyncio.wait_for(c.app.state.change_feed.listening.wait(), 10)
        await post_runs(b, run(1, container(mem=300 * MIB)))
        assert (await sizing(a))["meta"]["clean_samples"] == 1

        async def a_serves_from_cache() -> bool:
            # b's notification reaches a within milliseconds and may drop what a cached just
            # before it arrived; once it has, a's answer stays cached
            h0, _ = hits(a)
            await sizing(a)
            return hits(a)[0] - h0 == 1

        await eventually(a_serves_from_cache)
        await post_runs(b, run(2, container(mem=300 * MIB)))  # written through the other worker

        async def a_sees_two() -> bool:
            return bool((await sizing(a))["meta"]["clean_samples"] == 2)

        await eventually(a_sees_two)
        r = await b.put(f"/api/v1/sizing/overrides/{JOB['org']}/{JOB['repo']}", json={"memory_limit": "2Gi"})
        assert r.status_code == 201, r.text

        async def a_sees_pin() -> bool:
            return bool((await sizing(a))["containers"][0]["memory"]["limit"] == "2Gi")

        await eventually(a_sees_pin)


async def test_a_lost_feed_distrusts_the_cache_until_it_is_back(make_client: Any, db_url: str) -> None:
    pg_only(db_url)
    async with make_client() as client:
        feed = client.app.state.change_feed
        feed.retry_seconds = 0.2
        await asyncio.wait_for(feed.listening.wait(), 10)
        await post_runs(client, run(1, container(mem=300 * MIB)))
        await sizing(client)
        u = make_url(db_url)
        admin = await asyncpg.connect(host=u.host, port=u.port, user=u.username, database=u.database)
        try:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND query ILIKE $2",
                u.database,
                f"%LISTEN%{CHANNEL}%",
            )
            assert killed == 1
            await eventually(lambda: _is(not client.app.state.answers.trusted))
            # while distrusted, every request reads the database
            _, m0 = hits(client)
            await sizing(client)
            assert hits(client)[1] - m0 == 1
            # a change nobody was told about (written straight to the database) is seen after reconnecting:
            # an override (runs written by hand bypass the jobs' build-path state: sizing/state.py)
            await admin.execute(
                "INSERT INTO overrides (scope, org, repo, workflow, job, memory_limit_bytes, created_at, updated_at, "
                "updated_by, version) VALUES ('org', $1, '', '', '', $2, now(), now(), 'ops', 1)",
                JOB["org"],
                3 * 1024 * MIB,
            )
            await eventually(lambda: _is(client.app.state.answers.trusted))
            assert (await sizing(client))["containers"][0]["memory"]["limit"] == "3Gi"
        finally:
            await admin.close()


async def _is(value: bool) -> bool:
    return value


def test_job_key_matches_helpers() -> None:
    # the payload of a notification is the job key; the helpers' job must round-trip through it
    from service import changes

    cache = AnswerCache(10)
    key = ScopeKey(JOB["org"], JOB["repo"], JOB["workflow"], JOB["job"])
    stored(cache, key)
    changed = [key.org, key.repo, key.workflow, key.job]
    changes.apply(cache, orjson.dumps({"origin": cache.origin, "changed": changed}).decode())
    assert cache.fresh(key, P) is not None  # its own write: invalidated already, after the commit
    changes.apply(cache, orjson.dumps({"origin": "another worker", "changed": changed}).decode())
    assert cache.fresh(key, P) is None
    stored(cache, key)
    changes.apply(cache, "not json")
    assert cache.fresh(key, P) is None  # what it cannot read, it treats as "everything changed"
    assert sizing_path().startswith("/api/v1/sizing/")


# --------------------------------------------------------------------------- served before routing


def requests_on_sizing_route() -> float:
    from prometheus_client import REGISTRY

    labels = {"route": "/api/v1/sizing/{org}/{repo}/{workflow}/{job}", "method": "GET", "status_class": "2xx"}
    return REGISTRY.get_sample_value("ci_sizer_http_requests_total", labels) or 0.0


def same_response(a: Any, b: Any) -> None:
    def headers(r: Any) -> list[tuple[str, str]]:
        return [(k, v) for k, v in r.headers.multi_items() if k != "x-request-id"]

    assert (a.status_code, headers(a), a.content) == (b.status_code, headers(b), b.content)


async def test_a_hit_is_the_routes_answer_byte_for_byte(make_client: Any) -> None:
    async with make_client() as client:
        await post_runs(client, run(1, container(cpu=400, mem=300 * MIB)))
        for query in ("", "?runs=3&cpu_percentile=p99", "?buffer=0"):
            computed = await client.get(sizing_path() + query)  # a miss: the route computes
            h0, m0 = hits(client)
            seen0 = requests_on_sizing_route()
            cached = await client.get(sizing_path() + query)  # a hit, before routing
            assert hits(client) == (h0 + 1, m0)
            same_response(computed, cached)
            assert requests_on_sizing_route() == seen0 + 1  # still counted under the route template
            assert cached.headers["x-request-id"]


def test_an_entry_keeps_the_answer_as_bytes_not_as_objects() -> None:
    # a full collection of the heap walks every object the collector tracks while every request waits
    # (17-21 ms per 1,000 cached answers here when each kept its answer's tree: docs/performance.md,
    # section 7): an entry holds its JSON and a few plain values, and reads the answer back from them
    answer = sizing_service.compute(key=KEY, history=History(), pins={}, params=P, policy=sizing_service.Policy())
    e = Entry(answer=answer, body=orjson.dumps(answer.as_dict()), fresh_until=float("inf"))
    assert [o for o in gc.get_referents(e) if gc.is_tracked(o) and o is not Entry] == []  # (its class aside)
    assert e.answer == answer
    assert (e.phase, e.override_scope) == (answer.meta.phase, answer.meta.override_scope)
    # a rendering is kept (its dict is all the entry adds), and at most RENDERINGS_KEPT of them
    first = e.rendered("k8s", None, None)
    assert first == formats.render("k8s", answer, None, None)
    assert e.rendered("k8s", None, None) is first
    for n in range(RENDERINGS_KEPT + 3):
        limits = TemplateCpu(every=1000 + n)
        assert e.rendered("k8s", None, limits) == formats.render("k8s", answer, None, limits)
    assert len(e._renderings or {}) == RENDERINGS_KEPT
    # and at most RENDERING_BYTES_KEPT of them: a mapping of 64 pod names (about 18 KB rendered) is
    # rendered for the request and not kept
    big = formats.parse_containers(",".join(f"a-pod-container-named-at-length-{n}=build" for n in range(64)), "k8s")
    other = Entry(answer=answer, body=e.body, fresh_until=float("inf"))
    rendered = other.rendered("k8s", big, None)
    assert len(rendered[1]) > RENDERING_BYTES_KEPT
    assert rendered == formats.render("k8s", answer, big, None)
    assert other._renderings is None
    assert other.rendered("k8s", None, None) == first  # a small one is still kept
    assert other._renderings is not None
    assert len(other._renderings) == 1


def test_a_job_keeps_its_latest_parameter_sets() -> None:
    # each (runs, buffer, cpu_percentile) is an entry of its own: a client cycling through them must not
    # fill memory; the least recently stored goes first
    cache = AnswerCache(10)
    sets = [CacheKey(n, 20, "p95") for n in range(1, ENTRIES_PER_JOB + 3)]
    for params in sets:
        cache.put(KEY, params, cache.ticket(KEY), entry(str(params.runs).encode()))
    assert [cache.fresh(KEY, params) is not None for params in sets] == [False] * 2 + [True] * ENTRIES_PER_JOB
    cache.put(KEY, sets[2], cache.ticket(KEY), entry(b"again"))  # stored again: now the latest
    cache.put(KEY, sets[0], cache.ticket(KEY), entry(b"back"))
    assert cache.fresh(KEY, sets[2]) is not None
    assert cache.fresh(KEY, sets[3]) is None  # the oldest then


@pytest.mark.parametrize("fmt", ["k8s", "gitlab", "buildkite"])
async def test_a_format_is_rendered_once_per_cached_answer(
    make_client: Any, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    # a YAML format took 0.3-1 ms to render: a hit serves the rendering the miss made, byte for byte
    calls: list[str] = []
    real = formats.render

    def counted(output: str, *args: Any) -> tuple[str, bytes]:
        calls.append(output)
        return real(output, *args)

    monkeypatch.setattr(formats, "render", counted)
    async with make_client() as client:
        await post_runs(client, run(1, container(cpu=400, mem=300 * MIB)))
        first = await client.get(sizing_path(), params={"format": fmt})
        assert first.status_code == 200
        assert calls == [fmt]
        h0, m0 = hits(client)
        again = await client.get(sizing_path(), params={"format": fmt})
        assert hits(client) == (h0 + 1, m0)
        assert calls == [fmt]  # not rendered again
        same_response(first, again)
        # other parameters of the format are a rendering of their own, from the same cached answer
        other = await client.get(sizing_path(), params={"format": fmt, "containers": "main=build"})
        assert other.status_code == 200
        assert hits(client) == (h0 + 2, m0)
        assert calls == [fmt, fmt]
        assert other.content != first.content


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("?runs=05", 200),  # not canonical: the route reads it (as 5) and answers
        ("?runs=0", 422),
        ("?runs=101", 422),
        ("?runs=5&runs=6", 200),
        ("?cpu_percentile=p42", 422),
        ("?buffer=-1", 422),
        ("?unknown=1", 200),
    ],
)
async def test_what_it_is_not_sure_of_goes_to_the_route(make_client: Any, query: str, status: int) -> None:
    async with make_client() as client:
        await post_runs(client, run(1, container(cpu=400, mem=300 * MIB)))
        await sizing(client)
        await sizing(client, runs=6)
        r = await client.get(sizing_path() + query)
        assert r.status_code == status, r.text
        if status == 422:
            assert r.headers["content-type"] == "application/problem+json"


async def test_a_cached_answer_needs_the_same_access_as_the_route(make_client: Any, tmp_path: Any) -> None:
    from ..test_auth import headers_for, write_tokens

    async with make_client(tokens_file=write_tokens(tmp_path / "tokens.toml")) as client:
        r = await client.post("/api/v1/runs", json=run(1), headers=headers_for("ingest"))
        assert r.status_code == 201
        ok = await client.get(sizing_path(), headers=headers_for("read"))
        assert ok.status_code == 200  # now cached
        for caller, status in (("none", 401), ("wrong", 401), ("ingest", 403), ("other-org", 403)):
            r = await client.get(sizing_path(), headers=headers_for(caller))
            assert r.status_code == status, caller
            assert r.headers["content-type"] == "application/problem+json"
        again = await client.get(sizing_path(), headers=headers_for("admin"))
        same_response(ok, again)


async def test_overrides_paths_are_never_taken_for_a_job(make_client: Any) -> None:
    # /api/v1/sizing/overrides/{org}/{repo}/{workflow} has the sizing route's shape
    async with make_client() as client:
        path = "/api/v1/sizing/overrides/acme/web/ci"
        await client.get(path)
        r = await client.get(path)
        assert r.status_code == 404  # the workflow-scope override, absent: not a sizing answer
        assert r.headers["content-type"] == "application/problem+json"
