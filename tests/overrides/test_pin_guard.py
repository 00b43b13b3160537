"""Guard rails on pins (issue 34): ``PUT ...?dry_run=true`` names every container a pin would put
below what it uses and writes nothing; memory pins below the floors are refused with the reason; on
both databases."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ..helpers import GIB, MIB
from ..jobs.test_jobs_api import job, post, recent_run

WEB = "/api/v1/sizing/overrides/acme/web"


def _run(
    n: int, name: str, *, mem: int, cpu: float = 500.0, repo: str = "web", sidecar: int | None = None
) -> dict[str, Any]:
    body = recent_run(n, job(name, repo=repo), mem=mem, limit=16 * GIB)
    body["containers"][0]["cpu_stats_millicores"] = dict.fromkeys(("peak", "p99", "p95", "p75", "p50", "avg"), cpu)
    if sidecar is not None:
        side = {**body["containers"][0], "name": "dind", "memory_peak_bytes": sidecar}
        body["containers"].append(side)
    return body


async def _fleet(client: httpx.AsyncClient) -> None:
    await post(
        client,
        *(_run(n, "link", mem=int(6.6 * GIB) - n * MIB, cpu=1800) for n in range(1, 5)),
        *(_run(n, "lint", mem=300 * MIB) for n in range(1, 4)),
        *(_run(n, "image", mem=1 * GIB, sidecar=3 * GIB) for n in range(1, 3)),
        *(_run(n, "build", mem=5 * GIB, repo="api") for n in range(1, 3)),  # another repo: not covered
    )


async def test_a_dry_run_names_what_the_pin_puts_below_use_and_writes_nothing(client: httpx.AsyncClient) -> None:
    await _fleet(client)
    r = await client.put(f"{WEB}?dry_run=true", json={"memory_limit": "2Gi", "cpu_limit": "1"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["dry_run"] is True
    assert body["scope"] == "repo"
    assert body["jobs"] == 3  # link, lint, image; not api/build
    below = [(b["job"], b["container"], b["field"]) for b in body["below_use"]]
    # worst first (use over the pin): the linker's 6.6 GiB under 2Gi (3.3x), its CPU p95 of 1800m under 1
    # (1.8x), the sidecar's 3 GiB under 2Gi (1.5x); lint's 300 MiB fits
    assert below == [
        ("link", "build", "memory_limit"),
        ("link", "build", "cpu_limit"),
        ("image", "dind", "memory_limit"),
    ]
    link = body["below_use"][0]
    assert link["pinned"] == "2Gi"
    assert link["pinned_value"] == 2 * GIB
    assert link["used_value"] == int(6.6 * GIB) - MIB  # the highest peak of its runs
    assert link["used"] == f"{-(-int(link['used_value']) // MIB)}Mi"  # a canonical quantity, rounded up
    assert link["runs"] == 4
    assert body["below_use"][1]["used"] == "1800m"
    assert (await client.get(WEB)).status_code == 404  # nothing written
    # the write itself is the same body without dry_run
    assert (await client.put(WEB, json={"memory_limit": "2Gi", "cpu_limit": "1"})).status_code == 201


async def test_a_more_specific_pin_keeps_the_new_one_from_applying(client: httpx.AsyncClient) -> None:
    # rules O2-O3 as the answer resolves them
    await _fleet(client)
    path = "/api/v1/sizing/overrides/acme/web/ci.yml/link"
    assert (await client.put(path, json={"memory_limit": "8Gi"})).status_code == 201
    body = (await client.put(f"{WEB}?dry_run=true", json={"memory_limit": "2Gi"})).json()
    assert [(b["job"], b["container"]) for b in body["below_use"]] == [("image", "dind")]
    # a more specific request above the new limit lifts it (O3): not below use either
    assert (await client.put(path, json={"memory_request": "7Gi"})).status_code == 200
    body = (await client.put(f"{WEB}?dry_run=true", json={"memory_limit": "2Gi"})).json()
    assert [(b["job"], b["container"]) for b in body["below_use"]] == [("image", "dind")]
    # replacing the job's own pin is checked against the job alone
    body = (await client.put(f"{path}?dry_run=true", json={"memory_limit": "6Gi"})).json()
    assert (body["jobs"], [b["job"] for b in body["below_use"]]) == (1, ["link"])
    assert (await client.get(path)).json()["memory_request"] == "7Gi"  # the dry run changed nothing


async def test_a_dry_run_checks_the_body_like_a_write(client: httpx.AsyncClient) -> None:
    r = await client.put(f"{WEB}?dry_run=true", json={"memory_limit": "12XB"})
    assert r.status_code == 422
    (error,) = r.json()["errors"]
    assert error["field"] == "body/memory_limit"
    assert "'12XB' is not a Kubernetes quantity" in error["message"]
    assert error["message"] in r.json()["detail"]  # the reason is in the detail too, not only the field
    # a scope with no job yet: nothing below use
    r = await client.put("/api/v1/sizing/overrides/nobody?dry_run=true", json={"memory_limit": "2Gi"})
    assert r.json() == {"dry_run": True, "scope": "org", "jobs": 0, "below_use": []}


@pytest.mark.parametrize(
    ("field", "value", "floor", "hint"),
    [
        ("memory_limit", "500", "128Mi", "did you mean 500Mi?"),
        ("memory_limit", "100Mi", "128Mi", None),
        ("memory_request", "1000", "32Mi", "did you mean 1000Mi?"),
        ("memory_request", "31Mi", "32Mi", None),
    ],
)
async def test_a_memory_pin_below_the_floor_is_refused_with_the_reason(
    client: httpx.AsyncClient, field: str, value: str, floor: str, hint: str | None
) -> None:
    for path in (WEB, f"{WEB}?dry_run=true"):
        r = await client.put(path, json={field: value})
        assert r.status_code == 422, r.text
        (error,) = r.json()["errors"]
        assert error["field"] == f"body/{field}"
        assert f"below {floor}" in error["message"]
        assert (hint in error["message"]) if hint else ("did you mean" not in error["message"])
    assert (await client.get(WEB)).status_code == 404
    # at the floor itself it is accepted
    assert (await client.put(WEB, json={field: floor})).status_code == 201


async def test_a_dry_run_needs_the_admin_role(make_client: Any, tmp_path: Any) -> None:
    from ..test_auth import SECRETS, write_tokens

    async with make_client(tokens_file=write_tokens(tmp_path / "tokens.toml")) as secured:
        for role, status in (("read", 403), ("other-org", 403), ("admin", 200)):
            r = await secured.put(
                f"{WEB}?dry_run=true",
                json={"memory_limit": "2Gi"},
                headers={"authorization": f"Bearer {SECRETS[role]}"},
            )
            assert r.status_code == status, (role, r.text)
