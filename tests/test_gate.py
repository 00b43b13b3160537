"""The front's gate (service/gate.py) driven as the server drives it, a message at a time: a body that
does not arrive in time, and large bodies held at once (issue 33)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from service.gate import Gate

SIZE = 512 * 1024


async def echo(scope: Any, receive: Any, send: Any) -> None:
    """An app that reads the body and answers 200 with its length."""
    body = (await receive())["body"]
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


def scope(length: int) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/stages:compute",
        "raw_path": b"/api/v1/stages:compute",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(length).encode())],
    }


class Client:
    """One request whose body arrives in two halves, the second when ``release`` is set."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.release = asyncio.Event()
        self.parts = 0
        self.answer: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.parts += 1
        if self.parts == 1:
            return {"type": "http.request", "body": b"x" * (self.length // 2), "more_body": True}
        await self.release.wait()
        return {"type": "http.request", "body": b"x" * (self.length - self.length // 2), "more_body": False}

    async def send(self, message: dict[str, Any]) -> None:
        self.answer.append(message)

    @property
    def status(self) -> int:
        return int(self.answer[0]["status"])


async def test_large_bodies_held_at_once_are_bounded() -> None:
    gate = Gate(echo, 10 << 20, max_in_flight=SIZE + SIZE // 2)
    first, second, third = Client(SIZE), Client(SIZE), Client(SIZE // 4)
    one = asyncio.create_task(gate(scope(SIZE), first.receive, first.send))
    await asyncio.sleep(0.05)  # the first body is being read
    assert gate.in_flight == SIZE
    await gate(scope(SIZE), second.receive, second.send)
    assert second.status == 503  # refused before its body was read
    assert second.parts == 1
    problem = orjson.loads(second.answer[1]["body"])
    assert "bytes of request bodies" in problem["detail"]
    assert (b"retry-after", b"2") in second.answer[0]["headers"]
    # a body that fits beside the first is taken
    third.release.set()
    await gate(scope(SIZE // 4), third.receive, third.send)
    assert third.status == 200
    first.release.set()
    await one
    assert first.status == 200
    assert gate.in_flight == 0
    # a body alone is always taken, even past the bound
    alone = Client(2 * SIZE)
    alone.release.set()
    await gate(scope(2 * SIZE), alone.receive, alone.send)
    assert alone.status == 200


async def test_a_body_that_does_not_arrive_in_time_is_408() -> None:
    gate = Gate(echo, 10 << 20, body_timeout=0.2)
    slow = Client(SIZE)  # its second half never comes
    await asyncio.wait_for(gate(scope(SIZE), slow.receive, slow.send), 5)
    assert slow.status == 408
    assert orjson.loads(slow.answer[1]["body"])["status"] == 408
    assert gate.in_flight == 0
