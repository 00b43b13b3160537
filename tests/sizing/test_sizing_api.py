"""``GET /api/v1/sizing/...`` rule by rule, on SQLite and PostgreSQL. Expected values are worked
out by hand in the comments (MiB = 2^20 bytes)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ..helpers import GIB, JOB, MIB, container, post_runs, run, sizing, sizing_path


def by_name(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in answer["containers"]}


async def test_unseen_job_is_unknown_with_star(client: httpx.AsyncClient) -> None:
    # rules S4, S6, S7: never seen -> 200, unknown phase, one entry "*", 500m / 4Gi
    answer = await sizing(client)
    assert answer["meta"]["phase"] == "unknown"
    assert answer["meta"]["clean_samples"] == 0
    assert answer["meta"]["runs_analyzed"] == 0
    [c] = answer["containers"]
    assert c["name"] == "*"
    assert (c["cpu"]["request"], c["cpu"]["limit"]) == ("500m", "500m")
    assert (c["memory"]["request"], c["memory"]["limit"]) == ("4Gi", "4Gi")
    assert (c["memory"]["request_bytes"], c["memory"]["limit_bytes"]) == (
        4 * GIB,
        4 * GIB,
    )
    assert c["observed"] == {"cpu_millicores": None, "memory_bytes": None}
    assert c["cpu"]["enforced"] is False
    assert answer["meta"]["override_scope"] == "global"
    assert {k: answer[k] for k in JOB} == JOB


async def test_oom_runs_do_not_advance_the_phase(client: httpx.AsyncClient) -> None:
    # rule S4: 2 clean + 5 OOM-suspect runs is still "learning"
    await post_runs(
        client,
        run(1),
        run(2),
        *(run(n, container(oom_killed=True)) for n in range(3, 8)),
    )
    answer = await sizing(client)
    assert answer["meta"]["phase"] == "learning"
    assert answer["meta"]["clean_samples"] == 2


async def test_unknown_phase_names_and_backoff(client: httpx.AsyncClient) -> None:
    # rules S6, S7, S13, S14: only OOM runs -> unknown; names from the stored runs;
    # streak of 2, oldest run reported 1 GiB (< 4 GiB default) -> 4 GiB x 2^2 = 16 GiB
    await post_runs(
        client,
        run(1, container(mem=GIB, limit=GIB), container("helper", mem=10 * MIB)),
        run(2, container(oom_killed=True)),
    )
    answer = await sizing(client)
    assert answer["meta"]["phase"] == "unknown"
    c = by_name(answer)
    assert list(c) == ["build", "helper"]
    assert c["build"]["oom"] == {"consecutive": 2, "backoff_factor": 4, "capped": False}
    assert c["build"]["memory"]["limit"] == "16Gi"
    assert c["helper"]["oom"]["consecutive"] == 0
    assert c["helper"]["memory"]["limit"] == "4Gi"


async def test_learning_phase(client: httpx.AsyncClient) -> None:
    # rule S8: one clean run, peak 300m / 100 MiB -> CPU 900m (limit 1), memory 300Mi -> limit 512Mi;
    # rule S16 guaranteed: request = limit; the buffer parameter does not apply
    await post_runs(
        client,
        run(
            1,
            container(
                cpu={
                    "peak": 300,
                    "p99": 200,
                    "p95": 100,
                    "p75": 90,
                    "p50": 80,
                    "avg": 50,
                },
                mem=100 * MIB,
            ),
        ),
    )
    answer = await sizing(client, buffer=500)
    assert answer["meta"]["phase"] == "learning"
    c = answer["containers"][0]
    assert (c["cpu"]["request"], c["cpu"]["limit"]) == ("900m", "1")
    assert (c["memory"]["request"], c["memory"]["limit"]) == ("512Mi", "512Mi")
    assert c["observed"] == {"cpu_millicores": 300.0, "memory_bytes": 100 * MIB}


async def test_learning_phase_burstable(make_client: Any) -> None:
    # rule S16 burstable: memory request stays the computed 300Mi under a 512Mi limit
    async with make_client(memory_qos="burstable") as client:
        await post_runs(client, run(1, container(cpu=300, mem=100 * MIB)))
        c = (await sizing(client))["containers"][0]
        assert (c["memory"]["request"], c["memory"]["limit"]) == ("300Mi", "512Mi")
        assert (await sizing(client))["meta"]["memory_qos"] == "burstable"


async def test_confident_phase(client: httpx.AsyncClient) -> None:
    # rule S9: p95 400/600/500 -> observed 600 -> x1.2 = 720m (limit 1);
    # memory 700/800/900 MiB -> observed 900 MiB (< 1 GiB, +20%) = 1080Mi -> limit 2048Mi
    await post_runs(
        client,
        run(1, container(cpu=400, mem=700 * MIB)),
        run(2, container(cpu=600, mem=800 * MIB)),
        run(3, container(cpu=500, mem=900 * MIB)),
    )
    answer = await sizing(client)
    assert answer["meta"]["phase"] == "confident"
    c = answer["containers"][0]
    assert (c["cpu"]["request"], c["cpu"]["limit"]) == ("720m", "1")
    assert (c["cpu"]["request_millicores"], c["cpu"]["limit_millicores"]) == (720, 1000)
    assert (c["memory"]["request"], c["memory"]["limit"]) == ("2Gi", "2Gi")
    assert c["observed"] == {"cpu_millicores": 600.0, "memory_bytes": 900 * MIB}
    assert answer["meta"]["runs_analyzed"] == 3


async def test_cpu_percentile_and_buffer_parameters(client: httpx.AsyncClient) -> None:
    # rule S5/S9: cpu_percentile picks the stat; buffer=50 -> p50 300 x 1.5 = 450m
    stats = {"peak": 1000, "p99": 900, "p95": 800, "p75": 500, "p50": 300, "avg": 250}
    await post_runs(client, *(run(n, container(cpu=stats)) for n in (1, 2, 3)))
    c = (await sizing(client, cpu_percentile="p50", buffer=50))["containers"][0]
    assert c["cpu"]["request"] == "450m"
    c = (await sizing(client, cpu_percentile="peak", buffer=0))["containers"][0]
    assert c["cpu"]["request"] == "1"
    # rule S12: 800m x 1.2 = 960m exactly
    c = (await sizing(client))["containers"][0]
    assert c["cpu"]["request"] == "960m"


async def test_runs_window_and_more_runs_than_history(
    client: httpx.AsyncClient,
) -> None:
    # rule S5: runs=1 analyses only the newest clean run; runs=100 with 4 clean runs analyses 4
    await post_runs(client, *(run(n, container(mem=(100 * n) * MIB)) for n in (1, 2, 3, 4)))
    one = await sizing(client, runs=1)
    assert one["meta"]["runs_analyzed"] == 1
    assert one["containers"][0]["observed"]["memory_bytes"] == 400 * MIB
    many = await sizing(client, runs=100)
    assert (many["meta"]["runs_analyzed"], many["meta"]["runs"]) == (4, 100)


async def test_history_is_ordered_by_finished_at_then_ingest(
    client: httpx.AsyncClient,
) -> None:
    # rule S3: the newest by finished_at wins, whatever the ingest order; ties go to the later-ingested
    await post_runs(client, run(5, container(mem=500 * MIB)), run(1, container(mem=100 * MIB)))
    assert (await sizing(client, runs=1))["containers"][0]["observed"]["memory_bytes"] == 500 * MIB
    tie = run(5, container(mem=300 * MIB))
    tie["run_id"] = "run-5b"
    await post_runs(client, tie)
    assert (await sizing(client, runs=1))["containers"][0]["observed"]["memory_bytes"] == 300 * MIB


async def test_container_in_only_some_runs(client: httpx.AsyncClient) -> None:
    # rule S6: "db" appears in one analysed run only and counts that run alone:
    # 100 MiB -> 120Mi request -> 128Mi limit; cpu 50 x 1.2 = 60m
    await post_runs(
        client,
        run(1, container(cpu=400, mem=200 * MIB)),
        run(2, container(cpu=400, mem=200 * MIB), container("db", cpu=50, mem=100 * MIB)),
        run(3, container(cpu=400, mem=200 * MIB)),
    )
    c = by_name(await sizing(client, runs=5))
    assert list(c) == ["build", "db"]
    assert c["db"]["cpu"]["request"] == "60m"
    assert c["db"]["memory"]["limit"] == "128Mi"
    assert c["db"]["observed"]["memory_bytes"] == 100 * MIB
    # with runs=1 the newest run has no "db": it leaves the answer
    assert [x["name"] for x in (await sizing(client, runs=1))["containers"]] == ["build"]


async def test_floors(client: httpx.AsyncClient) -> None:
    # rule S10: an idle container still gets 10m / 32Mi requests, 500m / 128Mi limits
    await post_runs(client, *(run(n, container(cpu=0, mem=0)) for n in (1, 2, 3)))
    c = (await sizing(client))["containers"][0]
    assert (c["cpu"]["request"], c["cpu"]["limit"]) == ("10m", "500m")
    assert c["memory"]["limit"] == "128Mi"


async def test_pod_ceiling(make_client: Any) -> None:
    # rule S11: build peaks at 2 GiB but the pod peaked at 1.5 GiB:
    # request = min(2 GiB x 1.1, 1.5 GiB x 1.1) = 1689.6 MiB -> 1690Mi
    async with make_client(memory_qos="burstable") as client:
        await post_runs(
            client,
            *(
                run(
                    n,
                    container(mem=2 * GIB),
                    container("helper", mem=10 * MIB),
                    pod_memory_peak_bytes=3 * GIB // 2,
                )
                for n in (1, 2, 3)
            ),
        )
        c = by_name(await sizing(client))
        assert c["build"]["memory"]["request"] == "1690Mi"
        assert c["build"]["memory"]["limit"] == "2Gi"


@pytest.mark.parametrize("peak_mib", [1024, 4096])
async def test_exact_gib_peaks(client: httpx.AsyncClient, peak_mib: int) -> None:
    # rule S9: exactly 1 GiB and 4 GiB take the 10% step: 1126.4 -> 1127Mi (limit 2Gi); 4505.6 -> 4506Mi (8Gi)
    await post_runs(client, *(run(n, container(mem=peak_mib * MIB)) for n in (1, 2, 3)))
    c = (await sizing(client))["containers"][0]
    assert c["memory"]["limit"] == {1024: "2Gi", 4096: "8Gi"}[peak_mib]


def _oom_history() -> list[dict[str, Any]]:
    # clean 1-3 (300 MiB -> 360Mi -> limit 512Mi), OOM 4, clean 5, OOM 6 (limit 600 MiB), OOM 7 (limit 1200 MiB)
    return [
        run(1, container(mem=300 * MIB)),
        run(2, container(mem=300 * MIB)),
        run(3, container(mem=300 * MIB)),
        run(4, container(oom_killed=True, mem=300 * MIB, limit=512 * MIB)),
        run(5, container(mem=300 * MIB)),
        run(6, container(mem=600 * MIB, limit=600 * MIB)),
        run(7, container(mem=1200 * MIB, limit=1200 * MIB), node_memory_bytes=2 * GIB),
    ]


async def test_oom_streak_broken_by_clean_run_uses_oldest_limit(
    client: httpx.AsyncClient,
) -> None:
    # rule S13: streak = runs 7, 6 (run 5 is clean and breaks it; run 4 does not count) -> k = 2
    # rule S14: base = max(512Mi computed, 600 MiB from run 6, the streak's oldest) -> 600 x 4 = 2400Mi
    # rule S15: node 2 GiB -> ceiling 90% = 1843.2 MiB -> 1843Mi, clips the backoff
    await post_runs(client, *_oom_history())
    answer = await sizing(client)
    assert answer["meta"]["phase"] == "confident"
    assert answer["meta"]["clean_samples"] == 4
    c = answer["containers"][0]
    assert c["oom"] == {"consecutive": 2, "backoff_factor": 4, "capped": True}
    assert answer["meta"]["node_ceiling_bytes"] == 1843 * MIB
    assert c["memory"]["limit_bytes"] == 1843 * MIB
    assert c["memory"]["request_bytes"] == 1843 * MIB


async def test_oom_backoff_without_ceiling(client: httpx.AsyncClient) -> None:
    # rules S13/S14 without a node ceiling: 2400Mi, not capped
    history = _oom_history()
    del history[-1]["node_memory_bytes"]
    await post_runs(client, *history)
    c = (await sizing(client))["containers"][0]
    assert c["memory"]["limit"] == "2400Mi"
    assert c["oom"]["capped"] is False
    assert (await sizing(client))["meta"]["node_ceiling_bytes"] is None


async def test_max_memory_setting_wins_over_node_memory(make_client: Any) -> None:
    # rule S15: --max-memory 2Gi is the ceiling even when runs report node memory
    async with make_client(max_memory="2Gi") as client:
        await post_runs(client, *_oom_history())
        answer = await sizing(client)
        assert answer["meta"]["node_ceiling_bytes"] == 2 * GIB
        c = answer["containers"][0]
        assert c["memory"]["limit"] == "2Gi"
        assert c["oom"]["capped"] is True


async def test_enforce_mode(make_client: Any) -> None:
    # rule S17
    async with make_client(cpu_sizing_mode="enforce") as client:
        answer = await sizing(client)
        assert answer["containers"][0]["cpu"]["enforced"] is True
        assert answer["meta"]["cpu_sizing_mode"] == "enforce"


@pytest.mark.parametrize(
    "params",
    [
        {"runs": 0},
        {"runs": 101},
        {"buffer": -1},
        {"buffer": 1001},
        {"cpu_percentile": "p90"},
        {"runs": "x"},
    ],
)
async def test_bad_parameters_are_422(client: httpx.AsyncClient, params: dict[str, Any]) -> None:
    # rule S5
    r = await client.get(sizing_path(), params=params)
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["errors"][0]["field"].startswith("query/")


async def test_percent_encoded_segments(client: httpx.AsyncClient) -> None:
    # rule O6: %2F is a "/" inside a segment; a literal "%2F" in a name is %252F
    job = {
        "org": "acme",
        "repo": "web",
        "workflow": ".github/workflows/ci.yml",
        "job": "a%2Fb",
    }
    await post_runs(client, run(1, job=job))
    r = await client.get("/api/v1/sizing/acme/web/.github%2Fworkflows%2Fci.yml/a%252Fb")
    assert r.status_code == 200
    assert r.json()["job"] == "a%2Fb"
    assert r.json()["meta"]["clean_samples"] == 1
    # and a plain (unencoded) request for another job is not confused with it
    r = await client.get("/api/v1/sizing/acme/web/.github%2Fworkflows%2Fci.yml/a%2Fb")
    assert r.json()["job"] == "a/b"
    assert r.json()["meta"]["clean_samples"] == 0
