"""``POST /api/v1/runs`` and ``:batch`` on SQLite and PostgreSQL (rules I1-I5a, S1-S2)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from ..helpers import GIB, JOB, MIB, container, run, sizing


async def count_runs(client: httpx.AsyncClient) -> int:
    body = await sizing(client)
    return int(body["meta"]["clean_samples"])


async def test_new_run_is_created_and_reduced(client: httpx.AsyncClient) -> None:
    # rule I2: samples reduced to the six stats; rule I4: a new run answers 201
    r = await client.post("/api/v1/runs", json=run(1, container(cpu=[4.0, 1.0, 5.5, 3.0, 2.0])))
    assert r.status_code == 201
    body = r.json()
    assert body["result"] == "created"
    assert body["clean"] is True
    stats = body["containers"][0]["cpu_stats_millicores"]
    assert stats["peak"] == 5.5
    assert stats["p50"] == 3.0
    assert stats["p95"] == pytest.approx(5.2)
    assert stats["avg"] == pytest.approx(3.1)


async def test_same_run_again_is_200_and_stores_nothing(
    client: httpx.AsyncClient,
) -> None:
    # rule I4
    body = run(1)
    assert (await client.post("/api/v1/runs", json=body)).status_code == 201
    again = await client.post("/api/v1/runs", json=body)
    assert again.status_code == 200
    assert again.json()["result"] == "duplicate"
    assert await count_runs(client) == 1


async def test_same_run_other_content_is_409_and_changes_nothing(
    client: httpx.AsyncClient,
) -> None:
    # rule I4
    assert (await client.post("/api/v1/runs", json=run(1, container(mem=100 * MIB)))).status_code == 201
    r = await client.post("/api/v1/runs", json=run(1, container(mem=200 * MIB)))
    assert r.status_code == 409
    assert r.headers["content-type"] == "application/problem+json"
    answer = await sizing(client)
    assert answer["containers"][0]["observed"]["memory_bytes"] == 100 * MIB


async def test_concurrent_posts_of_one_run_store_it_once(
    client: httpx.AsyncClient,
) -> None:
    # rule I4 under concurrency: exactly one 201, the rest 200
    body = run(1)
    answers = await asyncio.gather(*(client.post("/api/v1/runs", json=body) for _ in range(8)))
    codes = sorted(a.status_code for a in answers)
    assert codes.count(201) == 1, codes
    assert codes.count(200) == 7, codes
    assert await count_runs(client) == 1


@pytest.mark.parametrize(
    ("containers", "why"),
    [
        ([container(oom_killed=True)], "oom_killed"),
        ([container(oom_events=2)], "oom_kill_events"),
        (
            [container(mem=95 * MIB, limit=100 * MIB)],
            "peak at exactly 95% of the limit",
        ),
    ],
)
async def test_oom_suspect_runs_are_reported(
    client: httpx.AsyncClient, containers: list[dict[str, Any]], why: str
) -> None:
    # rules S1, S2
    r = await client.post("/api/v1/runs", json=run(1, container("helper"), *containers))
    assert r.status_code == 201, why
    body = r.json()
    assert body["clean"] is False
    assert body["oom_suspect_containers"] == ["build"]


async def test_peak_just_under_95_percent_is_clean(client: httpx.AsyncClient) -> None:
    # rule S1: 94.9% of the limit is not suspect
    r = await client.post("/api/v1/runs", json=run(1, container(mem=949 * MIB, limit=1000 * MIB)))
    assert r.json()["clean"] is True


def _bad_bodies() -> list[tuple[str, dict[str, Any], str]]:
    both = container()
    both["cpu_samples_millicores"] = [1.0]
    neither = container()
    del neither["cpu_stats_millicores"]
    unordered = container(cpu={"peak": 10, "p99": 20, "p95": 5, "p75": 4, "p50": 3, "avg": 2})
    avg_high = container(cpu={"peak": 10, "p99": 9, "p95": 8, "p75": 7, "p50": 6, "avg": 11})
    negative = container(cpu=[-1.0])
    too_many_samples = container(cpu=[1.0] * 100_001)
    return [
        ("both cpu sources", run(1, both), "containers/0"),
        ("no cpu source", run(1, neither), "containers/0"),
        ("unordered stats", run(1, unordered), "cpu_stats_millicores"),
        ("avg above peak", run(1, avg_high), "cpu_stats_millicores"),
        ("negative sample", run(1, negative), "cpu_samples_millicores/0"),
        ("too many samples", run(1, too_many_samples), "cpu_samples_millicores"),
        ("empty samples", run(1, container(cpu=[])), "cpu_samples_millicores"),
        ("no containers", {**run(1), "containers": []}, "containers"),
        (
            "65 containers",
            run(1, *(container(f"c{i}") for i in range(65))),
            "containers",
        ),
        ("duplicate names", run(1, container("a"), container("a")), "body"),
        ("empty org", {**run(1), "org": ""}, "org"),
        ("201-char job", {**run(1), "job": "j" * 201}, "job"),
        ("control char", {**run(1), "repo": "we\nb"}, "repo"),
        (
            "missing finished_at",
            {k: v for k, v in run(1).items() if k != "finished_at"},
            "finished_at",
        ),
        ("unknown field", {**run(1), "colour": "blue"}, "colour"),
        (
            "string number",
            run(1, {**container(), "memory_peak_bytes": "5"}),
            "memory_peak_bytes",
        ),
        (
            "started after finished",
            {**run(1), "started_at": "2030-01-01T00:00:00Z"},
            "body",
        ),
    ]


@pytest.mark.parametrize(("why", "body", "field"), _bad_bodies(), ids=[b[0] for b in _bad_bodies()])
async def test_bad_input_is_422_and_stores_nothing(
    client: httpx.AsyncClient, why: str, body: dict[str, Any], field: str
) -> None:
    # rules I1, I3, I5
    r = await client.post("/api/v1/runs", json=body)
    assert r.status_code == 422, why
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["status"] == 422
    assert any(field in e["field"] for e in problem["errors"]), problem
    assert await count_runs(client) == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
async def test_nan_and_infinity_are_rejected(client: httpx.AsyncClient, literal: str) -> None:
    # rule I1: finite values only
    raw = (
        '{"org":"a","repo":"b","workflow":"c","job":"d","run_id":"1","finished_at":"2026-11-20T10:00:00Z",'
        f'"containers":[{{"name":"x","cpu_samples_millicores":[1, {literal}],"memory_peak_bytes":1}}]}}'
    )
    r = await client.post("/api/v1/runs", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert await count_runs(client) == 0


async def test_body_over_10_mib_is_413(client: httpx.AsyncClient) -> None:
    # issue: a body over 10 MiB answers 413 (problem+json), nothing stored
    samples = ",".join(["1234.5678"] * 1_200_000)
    raw = (
        '{"org":"acme","repo":"web","workflow":".github/workflows/ci.yml","job":"build (ubuntu-latest, 3.12)",'
        '"run_id":"big","finished_at":"2026-11-20T10:00:00Z",'
        f'"containers":[{{"name":"build","cpu_samples_millicores":[{samples}],"memory_peak_bytes":1}}]}}'
    )
    assert len(raw) > 10 * 1024 * 1024
    r = await client.post("/api/v1/runs", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.headers["content-type"] == "application/problem+json"
    assert await count_runs(client) == 0


async def test_malformed_json_is_a_problem(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/api/v1/runs",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"


async def test_batch_answers_each_run_by_index(client: httpx.AsyncClient) -> None:
    bad = run(2)
    del bad["finished_at"]
    conflicting = run(1, container(mem=GIB))
    r = await client.post("/api/v1/runs:batch", json={"runs": [run(1), bad, run(3), run(1), conflicting]})
    assert r.status_code == 200
    body = r.json()
    assert [x["status"] for x in body["results"]] == [201, 422, 201, 200, 409]
    assert [x["index"] for x in body["results"]] == [0, 1, 2, 3, 4]
    assert (
        body["created"],
        body["duplicates"],
        body["conflicts"],
        body["rejected"],
    ) == (2, 1, 1, 1)
    assert "runs/1/finished_at" in body["results"][1]["problem"]["errors"][0]["field"]
    assert await count_runs(client) == 2


async def test_batch_limit_is_500(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/v1/runs:batch", json={"runs": [run(1)] * 501})
    assert r.status_code == 422
    assert await count_runs(client) == 0


async def test_names_with_slashes_and_spaces_round_trip(
    client: httpx.AsyncClient,
) -> None:
    # rules I3, O6: any character but control characters, "/" included
    job = {
        "org": "a/b",
        "repo": "r%2Fx",
        "workflow": ".github/workflows/ci.yml",
        "job": "build (ubuntu-latest, 3.12)",
    }
    r = await client.post("/api/v1/runs", json=run(1, job=job))
    assert r.status_code == 201
    answer = await sizing(client, job)
    assert {k: answer[k] for k in job} == job
    assert answer["meta"]["clean_samples"] == 1
    assert JOB["workflow"] == job["workflow"]


# --------------------------------------------------------------------------- large bodies (issue 18, item 8)


def _core_reductions() -> float:
    """Sample reductions (rule I2) done in this process so far."""
    from service.observability.metrics import CORE_DURATION

    return sum(
        s.value
        for s in CORE_DURATION.collect()[0].samples
        if s.name.endswith("_count") and s.labels["operation"] == "six_stats"
    )


def _large_run(n: int) -> dict[str, Any]:
    """A run of about 4 MB: four containers of 100,000 samples each."""
    import random

    rng = random.Random(n)
    containers = [
        container(f"c{i}", cpu=[round(rng.uniform(0, 4000), 3) for _ in range(100_000)], mem=(i + 1) * 100 * MIB)
        for i in range(4)
    ]
    return run(n, *containers)


async def test_a_large_run_is_reduced_off_the_event_loop(client: httpx.AsyncClient) -> None:
    # a 9 MB ingest blocked the event loop for 420 ms (parse, validate, reduce: each one call that
    # holds the interpreter lock); a large body is reduced in a worker process, with the same answer
    from array import array

    from service import core

    body = _large_run(1)
    before = _core_reductions()
    r = await client.post("/api/v1/runs", json=body)
    assert r.status_code == 201, r.text
    assert _core_reductions() == before  # no sample was reduced in this process
    stats = {c["name"]: c["cpu_stats_millicores"] for c in r.json()["containers"]}
    for c in body["containers"]:
        expected = core.six_stats(array("d", c["cpu_samples_millicores"]))
        assert tuple(stats[c["name"]][k] for k in ("peak", "p99", "p95", "p75", "p50", "avg")) == expected
    # the same run again is a duplicate: its content hash is the one the samples give
    again = await client.post("/api/v1/runs", json=body)
    assert again.status_code == 200
    assert again.json()["result"] == "duplicate"
    # and a small run still takes the usual path, in process
    assert (await client.post("/api/v1/runs", json=run(2, container(cpu=[1.0, 2.0])))).status_code == 201
    assert _core_reductions() == before + 1


async def test_large_bodies_answer_errors_as_before(client: httpx.AsyncClient) -> None:
    bad = _large_run(1)
    bad["containers"][2]["cpu_samples_millicores"][7] = -1.0
    r = await client.post("/api/v1/runs", json=bad)
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    assert "body/containers/2/cpu_samples_millicores/7" in [e["field"] for e in r.json()["errors"]]
    # in a batch, per index: the valid large run is stored, the bad one named
    r = await client.post("/api/v1/runs:batch", json={"runs": [_large_run(2), bad]})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["status"] for x in results] == [201, 422]
    assert "body/runs/1/containers/2/cpu_samples_millicores/7" in [e["field"] for e in results[1]["problem"]["errors"]]
    assert (await sizing(client))["meta"]["clean_samples"] == 1
