"""Conditional override writes under real concurrency (rule O5, ETags), on both databases.

Many clients share one app, so the writes run at once over separate pooled connections: on
PostgreSQL each request holds its own connection and transaction; on SQLite each waits for the
write lock. A conditional write must be atomic: of any number of writers carrying the same
``If-Match``, exactly one succeeds and every other one gets 412; a PUT racing a DELETE is never a 500.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..live import LiveServer

WRITERS = 16
ROUNDS = 5
ORG = "/api/v1/sizing/overrides/acme"
JOB_PATH = ORG + "/web/.github%2Fworkflows%2Fci.yml/build"


@asynccontextmanager
async def clients(app: Any, n: int) -> AsyncIterator[list[httpx.AsyncClient]]:
    """``n`` independent clients of the same app (one event loop, one connection pool)."""
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver", timeout=60)
            )
            for _ in range(n)
        ]


def _codes(answers: list[httpx.Response]) -> list[int]:
    for a in answers:
        assert a.status_code < 500, a.text
    return [a.status_code for a in answers]


async def test_concurrent_if_match_puts_exactly_one_wins(make_client: Any) -> None:
    # rule O5 (ETags): 16 writers read the same ETag and PUT at once, round after round
    async with make_client() as client, clients(client.app, WRITERS) as writers:
        for path in (ORG, JOB_PATH):
            created = await client.put(path, json={"memory_limit": "1Gi"})
            assert created.status_code == 201
            etag = created.headers["ETag"]
            for round_ in range(ROUNDS):
                answers = await asyncio.gather(
                    *(
                        w.put(
                            path,
                            json={"memory_limit": f"{i + 2}Gi", "reason": f"r{round_}"},
                            headers={"If-Match": etag},
                        )
                        for i, w in enumerate(writers)
                    )
                )
                codes = _codes(answers)
                assert codes.count(200) == 1, (path, round_, codes)
                assert codes.count(412) == WRITERS - 1, (path, round_, codes)
                winner = answers[codes.index(200)]
                stored = await client.get(path)
                # the acknowledged write is the one stored: nothing was silently overwritten
                assert stored.headers["ETag"] == winner.headers["ETag"]
                assert stored.json()["memory_limit"] == winner.json()["memory_limit"]
                etag = winner.headers["ETag"]


async def test_concurrent_if_none_match_creates_exactly_one(make_client: Any) -> None:
    # rule O5: If-None-Match: * makes a PUT create-only; of 16 concurrent creators one gets 201
    async with make_client() as client, clients(client.app, WRITERS) as writers:
        for round_ in range(ROUNDS):
            path = f"{ORG}/repo-{round_}"
            answers = await asyncio.gather(
                *(
                    w.put(path, json={"cpu_limit": f"{i + 1}"}, headers={"If-None-Match": "*"})
                    for i, w in enumerate(writers)
                )
            )
            codes = _codes(answers)
            assert codes.count(201) == 1, (round_, codes)
            assert codes.count(412) == WRITERS - 1, (round_, codes)
            winner = answers[codes.index(201)]
            assert (await client.get(path)).headers["ETag"] == winner.headers["ETag"]


async def test_conditional_put_racing_delete(make_client: Any) -> None:
    # PUTs and DELETEs carrying the same ETag race: exactly one of them wins, never a 500
    async with make_client() as client, clients(client.app, WRITERS) as writers:
        for round_ in range(ROUNDS):
            created = await client.put(ORG, json={"memory_limit": "1Gi"})
            assert created.status_code in (200, 201)
            headers = {"If-Match": created.headers["ETag"]}
            calls = [
                w.delete(ORG, headers=headers)
                if i % 2 == round_ % 2
                else w.put(ORG, json={"memory_limit": f"{i + 2}Gi"}, headers=headers)
                for i, w in enumerate(writers)
            ]
            answers = await asyncio.gather(*calls)
            codes = _codes(answers)
            won = [a for a in answers if a.status_code in (200, 204)]
            assert len(won) == 1, (round_, codes)
            assert codes.count(412) == WRITERS - 1, (round_, codes)
            after = await client.get(ORG)
            if won[0].status_code == 204:
                assert after.status_code == 404
            else:
                assert after.headers["ETag"] == won[0].headers["ETag"]


async def test_unconditional_put_racing_delete_never_500(make_client: Any) -> None:
    # a PUT racing a DELETE of the same row: each is answered as if it ran alone, never a 500
    async with make_client() as client, clients(client.app, WRITERS) as writers:
        for round_ in range(ROUNDS):
            assert (await client.put(ORG, json={"cpu_limit": "1"})).status_code in (200, 201)
            calls = [
                w.delete(ORG) if i % 2 == round_ % 2 else w.put(ORG, json={"cpu_limit": f"{i + 1}"})
                for i, w in enumerate(writers)
            ]
            answers = await asyncio.gather(*calls)
            codes = _codes(answers)
            puts = [c for i, c in enumerate(codes) if i % 2 != round_ % 2]
            deletes = [c for i, c in enumerate(codes) if i % 2 == round_ % 2]
            assert set(puts) <= {200, 201}, codes
            assert set(deletes) <= {204, 404}, codes
            assert 204 in deletes, codes  # the row existed when the race began
            listed = (await client.get("/api/v1/sizing/overrides")).json()["items"]
            assert len(listed) <= 1


@pytest.mark.ci  # the CI tier (README): a live server with two workers
def test_live_server_with_two_workers(db_url: str, tmp_path: Path) -> None:
    # the same guarantee over real HTTP connections to two worker processes: 16 threads, each its
    # own connection, PUT and DELETE with the same If-Match at once, round after round
    with (
        LiveServer(db_url, "--workers", "2", "--log-level", "warning", log=tmp_path / "serve.log") as server,
        httpx.Client(base_url=server.url, timeout=60) as c,
        concurrent.futures.ThreadPoolExecutor(max_workers=WRITERS) as pool,
    ):
        for round_ in range(ROUNDS):
            created = c.put(ORG, json={"memory_limit": "1Gi"})
            assert created.status_code in (200, 201), created.text
            headers = {"If-Match": created.headers["ETag"]}

            def write(i: int, headers: dict[str, str] = headers) -> httpx.Response:
                with httpx.Client(base_url=server.url, timeout=60) as own:
                    if i % 4 == 0:
                        return own.delete(ORG, headers=headers)
                    return own.put(ORG, json={"memory_limit": f"{i + 2}Gi"}, headers=headers)

            answers = list(pool.map(write, range(WRITERS)))
            codes = _codes(answers)
            won = [a for a in answers if a.status_code in (200, 204)]
            assert len(won) == 1, (round_, codes)
            assert codes.count(412) == WRITERS - 1, (round_, codes)
            after = c.get(ORG)
            if won[0].status_code == 204:
                assert after.status_code == 404
            else:
                assert after.headers["ETag"] == won[0].headers["ETag"]
