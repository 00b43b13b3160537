"""``GET /api/v1/growths/{org}/{repo}/{workflow}/{job}`` and the operator page's "kills avoided" (issue 40)
on SQLite and PostgreSQL: the runs that grew, the kills avoided (runs that grew and were not killed), the
runs killed too late, the events by result, the newest events; tokens and path segments as for sizing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import quote

import httpx

from service.wire import to_rfc3339, utcnow

from ..helpers import GIB, JOB, MIB, container, run

NOW = utcnow()


def recent(n: int, *containers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Run ``n``, finished ``n`` minutes ago minus a day (inside the 7-day window)."""
    body = run(n, *containers, **extra)
    body["finished_at"] = to_rfc3339(NOW - timedelta(days=1) + timedelta(minutes=n))
    return body


def ev(frm: int, to: int, result: str, minute: int = 0) -> dict[str, Any]:
    return {
        "at": to_rfc3339(NOW - timedelta(days=2, minutes=-minute)),
        "from_bytes": frm,
        "to_bytes": to,
        "result": result,
    }


def path(job: dict[str, str] = JOB) -> str:
    return "/api/v1/growths/" + "/".join(quote(job[k], safe="") for k in ("org", "repo", "workflow", "job"))


async def test_the_job_s_growths(client: httpx.AsyncClient) -> None:
    runs = [
        recent(1, container(mem=300 * MIB)),  # no growth
        recent(2, {**container(mem=900 * MIB, limit=GIB), "growths": [ev(512 * MIB, GIB, "grown")]}),  # avoided
        recent(  # grew twice, then a resize refused: still a kill avoided
            3,
            {
                **container(mem=1500 * MIB, limit=1536 * MIB),
                "growths": [
                    ev(512 * MIB, GIB, "grown", 1),
                    ev(GIB, 1536 * MIB, "grown", 2),
                    ev(1536 * MIB, 2 * GIB, "deferred", 3),
                ],
            },
            container("helper", mem=50 * MIB),
        ),
        recent(4, {**container(mem=512 * MIB, limit=512 * MIB), "growths": [ev(512 * MIB, GIB, "too_late")]}),
        recent(  # grew, then was killed past the maximum: not avoided
            5, {**container(mem=GIB, limit=GIB, oom_events=1), "growths": [ev(512 * MIB, GIB, "grown")]}
        ),
        recent(6, {**container(mem=500 * MIB, limit=512 * MIB), "growths": [ev(512 * MIB, GIB, "infeasible")]}),
        # grew at its threshold but peaked under the limit it started with: grown, no kill avoided
        recent(7, {**container(mem=1000 * MIB, limit=1280 * MIB), "growths": [ev(GIB, 1280 * MIB, "grown")]}),
    ]
    old = run(0, {**container(mem=900 * MIB, limit=GIB), "growths": [ev(512 * MIB, GIB, "grown")]})
    old["finished_at"] = to_rfc3339(NOW - timedelta(days=30))  # outside the window, still among the newest events
    for body in (old, *runs):
        r = await client.post("/api/v1/runs", json=body)
        assert r.status_code == 201, r.text
    r = await client.get(path())
    assert r.status_code == 200, r.text
    g = r.json()
    assert (g["window_days"], g["runs"], g["runs_grown"], g["kills_avoided"], g["runs_too_late"]) == (7, 7, 4, 2, 1)
    assert g["events"] == {"grown": 5, "deferred": 1, "infeasible": 1, "too_late": 1, "error": 0}
    newest = g["recent"][1:]  # run-7's first
    assert g["recent"][0]["run_id"] == "run-7"
    assert [(e["run_id"], e["result"]) for e in newest[:4]] == [
        ("run-6", "infeasible"),
        ("run-5", "grown"),
        ("run-4", "too_late"),
        ("run-3", "deferred"),
    ]
    assert newest[3] | {"at": None, "finished_at": None} == {
        "run_id": "run-3",
        "finished_at": None,
        "container": "build",
        "at": None,
        "from_bytes": 1536 * MIB,
        "to_bytes": 2 * GIB,
        "result": "deferred",
    }
    assert newest[-1]["run_id"] == "run-0"
    assert len(newest) == 8  # and run-7's: every event of the job

    # the operator's job page says it too
    params = {k: JOB[k] for k in ("org", "repo", "workflow", "job")}
    page = await client.get("/ui/fragments/job", params=params)
    assert page.status_code == 200
    assert 'data-testid="kills-avoided">2 <small>' in page.text
    assert "4 of 7 runs grew in place, 2 resizes refused, 1 killed too late" in page.text


async def test_a_job_never_seen_has_no_growths(client: httpx.AsyncClient) -> None:
    other = {**JOB, "job": "lint/with a slash"}
    r = await client.get(path(other))
    assert r.status_code == 200, r.text
    g = r.json()
    assert (g["job"], g["runs"], g["kills_avoided"], g["recent"]) == ("lint/with a slash", 0, 0, [])
    assert set(g["events"].values()) == {0}


async def test_tokens_are_checked(make_client: Any, tmp_path: Any) -> None:
    from service.auth import hash_secret

    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[[tokens]]\nname = "other"\nsha256 = "{hash_secret("s3cret")}"\nroles = ["read"]\norgs = ["globex"]\n'
    )
    async with make_client(tokens_file=tokens) as client:
        assert (await client.get(path())).status_code == 401
        r = await client.get(path(), headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 403
        assert r.headers["content-type"] == "application/problem+json"
