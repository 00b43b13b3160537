"""Input at the edges, on SQLite and PostgreSQL: timestamps at the end of the range and far from
the server's clock, names with bidirectional controls or bytes that are not UTF-8, batch items
that are not objects, list cursors past 64 bits, expiries in the past. Each is a 422 naming the
field (rule I5), and nothing is stored."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.auth import TokensFileError, load_tokens
from service.cli import main

from ..helpers import JOB, container, run, sizing, sizing_path

RUNS = "/api/v1/runs"
BATCH = "/api/v1/runs:batch"
OVERRIDES = "/api/v1/sizing/overrides"
PAST_THE_END = "9999-12-31T23:59:59-01:00"  # 10000-01-01T00:59:59Z
BEFORE_THE_START = "0001-01-01T00:00:00+01:00"  # 0000-12-31T23:00:00Z


def _stamp(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _fields(r: httpx.Response) -> list[str]:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    return [e["field"] for e in r.json()["errors"]]


async def _stored_runs(client: httpx.AsyncClient, job: dict[str, str] | None = None) -> int:
    meta = (await sizing(client, job))["meta"]
    return int(meta["clean_samples"])


# --------------------------------------------------------------------------- timestamps


@pytest.mark.parametrize("value", [PAST_THE_END, BEFORE_THE_START])
@pytest.mark.parametrize("field", ["finished_at", "started_at"])
async def test_timestamp_outside_the_utc_range_is_422(client: httpx.AsyncClient, field: str, value: str) -> None:
    # rule I5: it used to overflow converting to UTC (a 500)
    body = run(1)
    body[field] = value
    if field == "started_at" and value == PAST_THE_END:
        body["finished_at"] = PAST_THE_END
    r = await client.post(RUNS, json=body)
    assert f"body/{field}" in _fields(r)
    assert await _stored_runs(client) == 0


async def test_batch_with_an_out_of_range_timestamp_answers_it_by_index(client: httpx.AsyncClient) -> None:
    # the item used to fail the whole batch with a 500 after the items before it were committed
    bad = {**run(2), "finished_at": PAST_THE_END}
    r = await client.post(BATCH, json={"runs": [run(1), bad, run(3)]})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["status"] for x in results] == [201, 422, 201]
    assert results[1]["problem"]["errors"][0]["field"] == "body/runs/1/finished_at"
    assert await _stored_runs(client) == 2


async def test_override_expiry_outside_the_utc_range_is_422(client: httpx.AsyncClient) -> None:
    r = await client.put(f"{OVERRIDES}/acme", json={"memory_limit": "1Gi", "expires_at": PAST_THE_END})
    assert "body/expires_at" in _fields(r)
    assert (await client.get(f"{OVERRIDES}/acme")).status_code == 404


async def test_finished_at_far_ahead_of_the_clock_is_422(client: httpx.AsyncClient) -> None:
    # a run stamped in the future stays the newest for good: pinned sizing, never pruned
    now = datetime.now(UTC)
    for ahead in (timedelta(days=2), timedelta(days=365 * 7000)):
        r = await client.post(RUNS, json={**run(1), "finished_at": _stamp(now + ahead)})
        assert _fields(r) == ["body/finished_at"]
    assert await _stored_runs(client) == 0
    # a clock a little ahead of the server's is fine
    r = await client.post(RUNS, json={**run(2), "finished_at": _stamp(now + timedelta(hours=1))})
    assert r.status_code == 201, r.text
    # and in a batch, the one too far ahead is rejected by index
    r = await client.post(BATCH, json={"runs": [{**run(3), "finished_at": _stamp(now + timedelta(days=3))}, run(4)]})
    assert [x["status"] for x in r.json()["results"]] == [422, 201]
    assert r.json()["results"][0]["problem"]["errors"][0]["field"] == "body/runs/0/finished_at"
    assert await _stored_runs(client) == 2


async def test_the_window_is_configurable(make_client: Any) -> None:
    now = datetime.now(UTC)
    async with make_client(finished_at_max_ahead_seconds=3600, finished_at_max_age_days=30) as client:
        assert _fields(await client.post(RUNS, json={**run(1), "finished_at": _stamp(now + timedelta(hours=2))})) == [
            "body/finished_at"
        ]
        old = {**run(2), "finished_at": _stamp(now - timedelta(days=31))}
        assert _fields(await client.post(RUNS, json=old)) == ["body/finished_at"]
        started_long_ago = {**run(3), "started_at": _stamp(now - timedelta(days=40)), "finished_at": _stamp(now)}
        assert _fields(await client.post(RUNS, json=started_long_ago)) == ["body/started_at"]
        ok = {**run(4), "finished_at": _stamp(now - timedelta(days=29))}
        assert (await client.post(RUNS, json=ok)).status_code == 201
        assert await _stored_runs(client) == 1


async def test_finished_at_decades_ago_is_422_by_default(client: httpx.AsyncClient) -> None:
    # the past bound is generous (ten years): a collector that sent the epoch is refused
    r = await client.post(RUNS, json={**run(1), "finished_at": "1970-01-01T00:00:00Z"})
    assert _fields(r) == ["body/finished_at"]
    five_years = datetime.now(UTC) - timedelta(days=5 * 365)
    assert (await client.post(RUNS, json={**run(2), "finished_at": _stamp(five_years)})).status_code == 201


# --------------------------------------------------------------------------- overrides


async def test_override_expiring_in_the_past_is_422(client: httpx.AsyncClient) -> None:
    past = _stamp(datetime.now(UTC) - timedelta(seconds=1))
    r = await client.put(f"{OVERRIDES}/acme", json={"memory_limit": "1Gi", "expires_at": past})
    assert _fields(r) == ["body/expires_at"]
    assert (await client.get(f"{OVERRIDES}/acme")).status_code == 404
    future = _stamp(datetime.now(UTC) + timedelta(minutes=5))
    assert (
        await client.put(f"{OVERRIDES}/acme", json={"memory_limit": "1Gi", "expires_at": future})
    ).status_code == 201


def _cursor(value: int | str) -> str:
    return base64.urlsafe_b64encode(f"o:{value}".encode()).decode().rstrip("=")


@pytest.mark.parametrize("value", [2**63, 2**64, 10**30, -1, "1_0"])
async def test_list_cursor_out_of_range_is_422(client: httpx.AsyncClient, value: int | str) -> None:
    # 2**63 and more used to be a 500 on SQLite (integer overflow) and a false 503 on PostgreSQL
    assert (await client.put(f"{OVERRIDES}/acme", json={"cpu_limit": "1"})).status_code == 201
    r = await client.get(OVERRIDES, params={"cursor": _cursor(value)})
    assert _fields(r) == ["query/cursor"]


async def test_largest_list_cursor_is_the_end(client: httpx.AsyncClient) -> None:
    assert (await client.put(f"{OVERRIDES}/acme", json={"cpu_limit": "1"})).status_code == 201
    r = await client.get(OVERRIDES, params={"cursor": _cursor(2**63 - 1)})
    assert r.status_code == 200
    assert r.json() == {"items": [], "next_cursor": None}


# --------------------------------------------------------------------------- names

BIDI = ["\u202e", "\u2066", "\u200f", "\u061c"]  # RLO, LRI, RLM, ALM


@pytest.mark.parametrize("char", BIDI)
@pytest.mark.parametrize("field", ["org", "repo", "workflow", "job", "run_id"])
async def test_bidi_controls_in_run_names_are_422(client: httpx.AsyncClient, field: str, char: str) -> None:
    # rule I3: "acme" and "ac<RLO>em" would look the same in a listing
    body = {**run(1), field: f"ac{char}em"}
    assert _fields(await client.post(RUNS, json=body)) == [f"body/{field}"]
    assert await _stored_runs(client) == 0


async def test_bidi_control_in_a_container_name_is_422(client: httpx.AsyncClient) -> None:
    r = await client.post(RUNS, json=run(1, container("bu\u202eild")))
    assert _fields(r) == ["body/containers/0/name"]


async def test_lone_surrogate_in_a_name_is_422(client: httpx.AsyncClient) -> None:
    # a JSON "\udc80" escape is no character at all: it cannot be stored as UTF-8
    raw = httpx.Request("POST", "/", json={**run(1), "org": "PLACEHOLDER"}).content
    r = await client.post(
        RUNS, content=raw.replace(b"PLACEHOLDER", b"a\\udc80b"), headers={"content-type": "application/json"}
    )
    assert _fields(r) == ["body/org"]


SEGMENTS = ["org", "repo", "workflow", "job"]


def _path(prefix: str, bad_at: int, bad: str) -> str:
    parts = ["acme", "web", "ci.yml", "build"]
    parts[bad_at] = bad
    return prefix + "/".join(parts)


@pytest.mark.parametrize("bad", ["ac%FFme", "ac%C3me", "%E2%80%AEacme"], ids=["ff", "truncated", "rlo"])
@pytest.mark.parametrize("at", range(4), ids=SEGMENTS)
async def test_bad_path_segments_are_422(client: httpx.AsyncClient, at: int, bad: str) -> None:
    # invalid UTF-8 used to be stored as U+FFFD; bidi controls were accepted
    field = f"path/{SEGMENTS[at]}"
    assert _fields(await client.get(_path("/api/v1/sizing/", at, bad))) == [field]
    override = _path(OVERRIDES + "/", at, bad)
    assert _fields(await client.put(override, json={"cpu_limit": "1"})) == [field]
    assert _fields(await client.get(override)) == [field]
    assert _fields(await client.delete(override)) == [field]
    assert (await client.get(OVERRIDES)).json()["items"] == []


async def test_unicode_names_still_round_trip(client: httpx.AsyncClient) -> None:
    # what stays allowed: any other character, percent-encoded UTF-8 in paths, joiners in emoji
    job = {**JOB, "repo": "web-é", "job": "build 👩\u200d💻 (x)"}
    assert (await client.post(RUNS, json=run(1, job=job))).status_code == 201
    answer = await sizing(client, job)
    assert (answer["repo"], answer["job"], answer["meta"]["clean_samples"]) == (job["repo"], job["job"], 1)
    assert (await client.get(sizing_path(job))).status_code == 200


# --------------------------------------------------------------------------- batches


async def test_batch_items_that_are_not_objects_are_answered_by_index(client: httpx.AsyncClient) -> None:
    # one such item used to reject the whole batch
    r = await client.post(BATCH, json={"runs": [run(1), 5, "run", None, [], run(2)]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["status"] for x in body["results"]] == [201, 422, 422, 422, 422, 201]
    assert body["results"][1]["problem"]["errors"][0]["field"] == "body/runs/1"
    assert (body["created"], body["rejected"]) == (2, 4)
    assert await _stored_runs(client) == 2


# --------------------------------------------------------------------------- tokens file


@pytest.mark.parametrize("content", ["", "tokens = []\n", "# no tokens yet\n"])
def test_tokens_file_without_entries_refuses_to_start(
    tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # it used to mean open access: every caller an anonymous admin
    path = tmp_path / "tokens.toml"
    path.write_text(content)
    with pytest.raises(TokensFileError, match="has no tokens"):
        load_tokens(path)
    code = main(["serve", "--tokens-file", str(path), "--database-url", f"sqlite:///{tmp_path / 'db.sqlite'}"])
    assert code != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "has no tokens" in err
    assert not (tmp_path / "db.sqlite").exists()  # refused before migrating anything
