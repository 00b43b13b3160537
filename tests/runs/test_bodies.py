"""Large ingest bodies (service/runs/bodies.py; issue 33, minor 3): an invalid one is judged in the
worker process, never parsed again on the event loop, with the answer a small body gets; the worker
is started again when it dies; and a caller without a valid token is refused before the body is read."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from service.auth import hash_secret
from service.main import create_app
from service.runs import bodies
from service.settings import Settings

from ..helpers import container, run

PAD = b" " * bodies.MIN_BYTES  # trailing whitespace: the same JSON, but a large body


def _bad_sample() -> bytes:
    body = run(1, container(cpu=[1.0, 2.0, -3.0]))
    return orjson.dumps(body)


#: bodies that are not valid runs, each as the route sees it
INVALID = {
    "bad-sample": _bad_sample(),
    "unknown-field": orjson.dumps({**run(1), "colour": "blue"}),
    "not-an-object": b"[1, 2, 3]",
    "malformed": b'{"org": "acme",, "repo": "web"}',
    "nan": json.dumps({**run(1), "node_memory_bytes": float("nan")}).encode(),
    "huge-integer": orjson.dumps(run(1)).replace(
        b'"containers"', b'"node_memory_bytes": 1' + b"0" * 30 + b', "containers"'
    ),
}


@pytest.mark.parametrize("raw", list(INVALID.values()), ids=list(INVALID))
def test_the_worker_judges_an_invalid_run_itself(raw: bytes) -> None:
    # the worker used to answer None for these, and the route parsed the whole body again on the loop
    judged = bodies.reduce_run(raw + PAD)
    assert isinstance(judged, bodies.Invalid)
    assert judged.errors


@pytest.mark.parametrize("raw", list(INVALID.values()), ids=list(INVALID))
async def test_a_large_invalid_run_is_answered_as_a_small_one(client: httpx.AsyncClient, raw: bytes) -> None:
    headers = {"content-type": "application/json"}
    small = await client.post("/api/v1/runs", content=raw, headers=headers)
    large = await client.post("/api/v1/runs", content=raw + PAD, headers=headers)
    assert small.status_code == large.status_code == 422
    assert large.json()["errors"] == small.json()["errors"]
    assert large.json()["detail"] == small.json()["detail"]


async def test_a_large_batch_answers_its_bad_runs_by_index_from_the_worker(client: httpx.AsyncClient) -> None:
    items = [run(1), {**run(2), "colour": "blue"}, 5, run(3, container(cpu=[1.0, -1.0]))]
    raw = orjson.dumps({"runs": items})
    judged = bodies.reduce_batch(raw + PAD)
    assert [type(x).__name__ for x in judged["runs"]] == ["dict", "Invalid", "Invalid", "Invalid"]
    headers = {"content-type": "application/json"}
    small = (await client.post("/api/v1/runs:batch", content=raw, headers=headers)).json()
    assert [x["status"] for x in small["results"]] == [201, 422, 422, 422]
    # the same batch again, large: the valid run is a duplicate now, the bad ones answered the same
    large = (await client.post("/api/v1/runs:batch", content=raw + PAD, headers=headers)).json()
    assert [x["status"] for x in large["results"]] == [200, 422, 422, 422]
    assert [x["problem"] for x in large["results"][1:]] == [x["problem"] for x in small["results"][1:]]


async def test_the_body_worker_is_started_again_after_it_dies(client: httpx.AsyncClient) -> None:
    reducer = client.app.state.bodies  # type: ignore[attr-defined]
    large = orjson.dumps(run(1)) + PAD
    headers = {"content-type": "application/json"}
    assert (await client.post("/api/v1/runs", content=large, headers=headers)).status_code == 201
    first = await reducer.pid()
    os.kill(first, signal.SIGKILL)
    # the next large body finds the worker dead: a new one parses it (and the ones after it)
    large = orjson.dumps(run(2)) + PAD
    assert (await client.post("/api/v1/runs", content=large, headers=headers)).status_code == 201
    second = await reducer.pid()
    assert second != first
    os.kill(second, 0)  # alive
    assert (await client.post("/api/v1/runs", content=orjson.dumps(run(3)) + PAD, headers=headers)).status_code == 201
    assert await reducer.pid() == second


SECRET = "cis_bodies-test"


@pytest.fixture
async def guarded(db_url: str, tmp_path: Path) -> Any:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[[tokens]]\nname = "ci"\nsha256 = "{hash_secret(SECRET)}"\nroles = ["ingest"]\n'
        f'[[tokens]]\nname = "reader"\nsha256 = "{hash_secret(SECRET + "-r")}"\nroles = ["read"]\n'
    )
    app = create_app(Settings(database_url=db_url, tokens_file=tokens, write_timeout_seconds=30))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            yield app, client


async def test_a_large_body_without_a_valid_token_is_refused_before_it_is_read(guarded: Any) -> None:
    # an unauthenticated 10 MB run got its 401 after about a second of parsing
    app, client = guarded
    large = orjson.dumps(run(1, container(cpu=[1.0] * 100_000))) + b" " * (8 << 20)
    for headers, status in (
        ({}, 401),
        ({"authorization": "Bearer cis_wrong"}, 401),
        ({"authorization": f"Bearer {SECRET}-r"}, 403),  # a token without the ingest role
    ):
        for path in ("/api/v1/runs", "/api/v1/runs:batch"):
            r = await client.post(path, content=large, headers={"content-type": "application/json", **headers})
            assert r.status_code == status, r.text
            assert r.headers["content-type"] == "application/problem+json"
    assert not app.state.bodies.running  # no worker was ever asked to parse anything
    r = await client.post(
        "/api/v1/runs", content=large, headers={"content-type": "application/json", "authorization": f"Bearer {SECRET}"}
    )
    assert r.status_code == 201, r.text
    assert app.state.bodies.running
