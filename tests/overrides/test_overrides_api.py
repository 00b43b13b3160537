"""Overrides (rules O1-O6): CRUD, ETags, listing, and resolution in the sizing answer."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from ..helpers import GIB, JOB, MIB, container, post_runs, run, sizing

ORG = "/api/v1/sizing/overrides/acme"
REPO = ORG + "/web"
WORKFLOW = REPO + "/.github%2Fworkflows%2Fci.yml"
JOB_PATH = WORKFLOW + "/build%20(ubuntu-latest,%203.12)"
PATHS = {"org": ORG, "repo": REPO, "workflow": WORKFLOW, "job": JOB_PATH}


async def test_create_replace_get_delete(client: httpx.AsyncClient) -> None:
    # rule O5
    r = await client.put(JOB_PATH, json={"memory_limit": "8Gi", "reason": "known heavy"})
    assert r.status_code == 201
    created = r.json()
    assert created["scope"] == "job"
    assert (created["org"], created["workflow"], created["job"]) == (
        "acme",
        JOB["workflow"],
        JOB["job"],
    )
    assert (created["memory_limit"], created["memory_limit_bytes"]) == ("8Gi", 8 * GIB)
    assert created["cpu_request"] is None
    assert created["updated_by"] == "anonymous"
    assert r.headers["ETag"] == created["etag"]
    r = await client.put(JOB_PATH, json={"cpu_request": "1500m"})
    assert r.status_code == 200
    replaced = r.json()
    assert (replaced["cpu_request"], replaced["memory_limit"]) == (
        "1500m",
        None,
    )  # a PUT replaces wholly
    assert replaced["etag"] != created["etag"]
    assert replaced["created_at"] == created["created_at"]
    got = await client.get(JOB_PATH)
    assert got.status_code == 200
    assert got.json() == replaced
    assert (await client.delete(JOB_PATH)).status_code == 204
    assert (await client.delete(JOB_PATH)).status_code == 404
    missing = await client.get(JOB_PATH)
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "body"),
        ({"reason": "nothing pinned"}, "body"),
        ({"cpu_request": None, "memory_limit": None}, "body"),
        ({"cpu_request": "-1"}, "cpu_request"),
        ({"memory_limit": "0"}, "memory_limit"),
        ({"memory_request": "2Gi", "memory_limit": "1Gi"}, "memory_request"),
        ({"cpu_request": "2", "cpu_limit": "1500m"}, "cpu_request"),
        ({"memory_limit": "1K"}, "memory_limit"),
        ({"cpu_limit": "NaN"}, "cpu_limit"),
        ({"memory_limit": 1024}, "memory_limit"),
        ({"memory_limit": "1Gi", "colour": "red"}, "colour"),
        ({"memory_limit": "1Gi", "expires_at": 0}, "expires_at"),
    ],
)
async def test_invalid_override_is_422_and_stores_nothing(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    # rule O1
    r = await client.put(ORG, json=body)
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    assert any(field in e["field"] for e in r.json()["errors"]), r.json()
    assert (await client.get(ORG)).status_code == 404


async def test_etags(client: httpx.AsyncClient) -> None:
    r = await client.put(ORG, json={"memory_limit": "8Gi"}, headers={"If-None-Match": "*"})
    assert r.status_code == 201
    etag = r.headers["ETag"]
    assert etag.startswith('"')  # strong
    # If-None-Match: * makes a PUT create-only
    r = await client.put(ORG, json={"memory_limit": "4Gi"}, headers={"If-None-Match": "*"})
    assert r.status_code == 412
    # If-Match with the current ETag replaces; the old ETag is stale afterwards
    r = await client.put(ORG, json={"memory_limit": "4Gi"}, headers={"If-Match": etag})
    assert r.status_code == 200
    r = await client.put(ORG, json={"memory_limit": "2Gi"}, headers={"If-Match": etag})
    assert r.status_code == 412
    assert (await client.get(ORG)).json()["memory_limit"] == "4Gi"
    r = await client.delete(ORG, headers={"If-Match": etag})
    assert r.status_code == 412
    current = (await client.get(ORG)).headers["ETag"]
    assert (await client.delete(ORG, headers={"If-Match": current})).status_code == 204
    # If-Match on nothing fails
    assert (await client.put(ORG, json={"memory_limit": "1Gi"}, headers={"If-Match": current})).status_code == 412


async def test_list_filters_pagination_and_link(client: httpx.AsyncClient) -> None:
    # rule O5: list, filterable, paginated with a stable order and a Link header
    for org in ("a", "b", "c"):
        for repo in ("r1", "r2"):
            assert (
                await client.put(f"/api/v1/sizing/overrides/{org}/{repo}", json={"cpu_limit": "1"})
            ).status_code == 201
    assert (await client.put("/api/v1/sizing/overrides/a", json={"cpu_limit": "2"})).status_code == 201
    seen: list[tuple[str, str | None]] = []
    url: str | None = "/api/v1/sizing/overrides?limit=2"
    pages = 0
    while url:
        r = await client.get(url)
        assert r.status_code == 200
        body = r.json()
        seen += [(o["org"], o["repo"]) for o in body["items"]]
        pages += 1
        link = r.headers.get("Link")
        if body["next_cursor"]:
            assert link is not None
            assert link.endswith('; rel="next"')
            url = link[1 : link.index(">")]
            assert "limit=2" in url
        else:
            assert link is None
            url = None
    assert pages == 4
    assert len(seen) == 7
    assert len(set(seen)) == 7
    r = await client.get("/api/v1/sizing/overrides", params={"org": "a"})
    assert sorted((o["org"], o["repo"] or "") for o in r.json()["items"]) == [
        ("a", ""),
        ("a", "r1"),
        ("a", "r2"),
    ]
    r = await client.get("/api/v1/sizing/overrides", params={"scope": "org"})
    assert [o["org"] for o in r.json()["items"]] == ["a"]
    r = await client.get("/api/v1/sizing/overrides", params={"org": "b", "repo": "r2"})
    assert [(o["org"], o["repo"]) for o in r.json()["items"]] == [("b", "r2")]
    bad = await client.get("/api/v1/sizing/overrides", params={"cursor": "garbage!"})
    assert bad.status_code == 422
    assert (await client.get("/api/v1/sizing/overrides", params={"limit": 501})).status_code == 422


async def test_expired_override_is_listed_but_not_applied(
    client: httpx.AsyncClient,
) -> None:
    soon = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert (await client.put(ORG, json={"memory_limit": "8Gi", "expires_at": soon})).status_code == 201
    assert (await client.put(REPO, json={"cpu_limit": "3", "expires_at": future})).status_code == 201
    # time passes: the org override's expiry is now behind us (a PUT may not set one in the past)
    async with client.app.state.write_engine.begin() as conn:  # type: ignore[attr-defined]
        await conn.execute(
            text("UPDATE overrides SET expires_at = :t WHERE repo = ''"),
            {"t": datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=1)},
        )
    client.app.state.answers.invalidate_all()  # type: ignore[attr-defined]
    listed = {o["scope"]: o for o in (await client.get("/api/v1/sizing/overrides")).json()["items"]}
    assert listed["org"]["expired"] is True
    assert listed["repo"]["expired"] is False
    c = (await sizing(client))["containers"][0]
    assert c["memory"]["source"]["limit"] == "algorithm"
    assert c["memory"]["limit"] == "4Gi"
    assert (c["cpu"]["limit"], c["cpu"]["source"]["limit"]) == ("3", "repo")


# --------------------------------------------------------------------------- resolution (O2-O4)

FIELD_BODY = {
    "cpu_request": ("cpu", "request", "250m"),
    "cpu_limit": ("cpu", "limit", "3"),
    "memory_request": ("memory", "request", "100Mi"),
    "memory_limit": ("memory", "limit", "8Gi"),
}


@pytest.mark.parametrize("scope", ["org", "repo", "workflow", "job"])
@pytest.mark.parametrize("field", list(FIELD_BODY))
async def test_each_field_pinned_at_each_scope(make_client: Any, scope: str, field: str) -> None:
    # rules O2, O4, S17: the pinned field comes from its scope, as is; the others stay computed
    async with make_client(memory_qos="burstable") as client:
        await post_runs(client, *(run(n, container(cpu=400, mem=700 * MIB)) for n in (1, 2, 3)))
        before = (await sizing(client))["containers"][0]
        kind, part, value = FIELD_BODY[field]
        assert (await client.put(PATHS[scope], json={field: value})).status_code == 201
        answer = await sizing(client)
        c = answer["containers"][0]
        assert c[kind][part] == value
        assert c[kind]["source"][part] == scope
        assert answer["meta"]["override_scope"] == scope
        assert c["cpu"]["enforced"] is (kind == "cpu")
        other_part = "limit" if part == "request" else "request"
        assert c[kind]["source"][other_part] == "algorithm"
        other = "memory" if kind == "cpu" else "cpu"
        for key in ("request", "limit", "source"):
            assert c[other][key] == before[other][key]


async def test_gaps_filled_from_parents_most_specific_wins(
    client: httpx.AsyncClient,
) -> None:
    # rule O2: field by field; job beats org for the same field, org fills what job leaves
    await post_runs(client, *(run(n, container(cpu=400, mem=700 * MIB)) for n in (1, 2, 3)))
    assert (await client.put(ORG, json={"memory_limit": "8Gi", "cpu_limit": "4"})).status_code == 201
    assert (await client.put(JOB_PATH, json={"cpu_limit": "2"})).status_code == 201
    answer = await sizing(client)
    c = answer["containers"][0]
    assert (c["cpu"]["limit"], c["cpu"]["source"]["limit"]) == ("2", "job")
    assert (c["memory"]["limit"], c["memory"]["source"]["limit"]) == ("8Gi", "org")
    # rule O3 (guaranteed): the unpinned memory request follows the final limit, source algorithm
    assert (c["memory"]["request"], c["memory"]["source"]["request"]) == (
        "8Gi",
        "algorithm",
    )
    assert c["cpu"]["source"]["request"] == "algorithm"
    assert answer["meta"]["override_scope"] == "job"


async def test_override_scope_is_the_most_specific_that_supplied(
    client: httpx.AsyncClient,
) -> None:
    # rule O4: the job override pins only what the repo also pins -> job supplies; repo supplies nothing
    assert (await client.put(REPO, json={"cpu_limit": "4"})).status_code == 201
    assert (await client.put(WORKFLOW, json={"memory_limit": "2Gi"})).status_code == 201
    assert (await sizing(client))["meta"]["override_scope"] == "workflow"


async def test_conflict_more_specific_request_raises_limit(
    client: httpx.AsyncClient,
) -> None:
    # rule O3: job pins cpu_request 2 above the org's cpu_limit 1 -> limit raised to 2 (source job)
    assert (await client.put(ORG, json={"cpu_limit": "1"})).status_code == 201
    assert (await client.put(JOB_PATH, json={"cpu_request": "2"})).status_code == 201
    c = (await sizing(client))["containers"][0]
    assert (c["cpu"]["request"], c["cpu"]["limit"]) == ("2", "2")
    assert c["cpu"]["source"] == {"request": "job", "limit": "job"}


async def test_conflict_more_specific_limit_lowers_request(
    client: httpx.AsyncClient,
) -> None:
    # rule O3: org pins cpu_request 3, repo pins cpu_limit 1 -> repo is more specific: request 1
    assert (await client.put(ORG, json={"cpu_request": "3"})).status_code == 201
    assert (await client.put(REPO, json={"cpu_limit": "1"})).status_code == 201
    c = (await sizing(client))["containers"][0]
    assert (c["cpu"]["request"], c["cpu"]["limit"]) == ("1", "1")
    assert c["cpu"]["source"] == {"request": "repo", "limit": "repo"}


async def test_conflict_pin_beats_algorithm(client: httpx.AsyncClient) -> None:
    # rule O3: the algorithm is the least specific source. Computed CPU 720m/1; org limit 500m
    await post_runs(client, *(run(n, container(cpu=600, mem=700 * MIB)) for n in (1, 2, 3)))
    assert (await client.put(ORG, json={"cpu_limit": "500m"})).status_code == 201
    c = (await sizing(client))["containers"][0]
    assert (c["cpu"]["request"], c["cpu"]["limit"]) == ("500m", "500m")
    assert c["cpu"]["source"] == {"request": "org", "limit": "org"}


async def test_burstable_pinned_limit_below_computed_request(make_client: Any) -> None:
    # rules O3, S16: computed request 1080Mi, repo pins memory_limit 1Gi -> request pulled to 1Gi
    async with make_client(memory_qos="burstable") as client:
        await post_runs(client, *(run(n, container(mem=900 * MIB)) for n in (1, 2, 3)))
        assert (await client.put(REPO, json={"memory_limit": "1Gi"})).status_code == 201
        c = (await sizing(client))["containers"][0]
        assert (c["memory"]["request"], c["memory"]["limit"]) == ("1Gi", "1Gi")
        assert c["memory"]["source"] == {"request": "repo", "limit": "repo"}


async def test_guaranteed_pinned_request_kept_as_is(client: httpx.AsyncClient) -> None:
    # rule O2: a pinned memory request is used as is, even under guaranteed
    await post_runs(client, *(run(n, container(mem=900 * MIB)) for n in (1, 2, 3)))
    assert (await client.put(ORG, json={"memory_request": "1Gi"})).status_code == 201
    c = (await sizing(client))["containers"][0]
    assert (c["memory"]["request"], c["memory"]["limit"]) == ("1Gi", "2Gi")
    assert c["memory"]["source"] == {"request": "org", "limit": "algorithm"}


async def test_pins_apply_to_every_container_and_skip_backoff(
    client: httpx.AsyncClient,
) -> None:
    # rule O2: every container, no rounding, no backoff
    await post_runs(
        client,
        run(1, container(), container("helper")),
        run(2, container(oom_killed=True), container("helper")),
    )
    assert (await client.put(ORG, json={"memory_limit": "1000Mi"})).status_code == 201
    got = {c["name"]: c for c in (await sizing(client))["containers"]}
    assert {n: c["memory"]["limit"] for n, c in got.items()} == {
        "build": "1000Mi",
        "helper": "1000Mi",
    }
    assert got["build"]["oom"]["consecutive"] == 1


async def test_other_jobs_are_not_affected(client: httpx.AsyncClient) -> None:
    assert (await client.put(JOB_PATH, json={"cpu_limit": "3"})).status_code == 201
    other = {**JOB, "job": "test"}
    answer = await sizing(client, other)
    assert answer["meta"]["override_scope"] == "global"
    assert answer["containers"][0]["cpu"]["source"]["limit"] == "algorithm"


async def test_concurrent_puts_leave_one_row(client: httpx.AsyncClient) -> None:
    answers = await asyncio.gather(*(client.put(JOB_PATH, json={"cpu_limit": f"{n + 1}"}) for n in range(10)))
    codes = sorted(a.status_code for a in answers)
    assert codes.count(201) == 1, codes
    assert codes.count(200) == 9, codes
    listed = (await client.get("/api/v1/sizing/overrides")).json()["items"]
    assert len(listed) == 1


async def test_unsupported_method_lists_every_allowed_one(client: httpx.AsyncClient) -> None:
    r = await client.patch(ORG, json={})
    assert r.status_code == 405
    assert r.headers["Allow"] == "DELETE, GET, PUT"
    assert r.headers["content-type"] == "application/problem+json"


async def test_empty_precondition_headers_are_ignored(client: httpx.AsyncClient) -> None:
    r = await client.put(ORG, json={"memory_limit": "1Gi"}, headers={"If-Match": "", "If-None-Match": " "})
    assert r.status_code == 201
