"""Asking the sizer: ``GET /api/v1/sizing/{org}/{repo}/{workflow}/{job}`` over HTTP, the same route the
recipes call, so the webhook's answer is the route's answer (its cache, overrides, runner ceilings and
fail-open deadline included) and the webhook holds no database.

HTTP/1.1 with h11 (uvicorn's own HTTP library) over an asyncio connection, one connection per call:
the caller bounds the whole call with its deadline (``asyncio.timeout``), and a call cut there closes
its connection. The bearer token is sent and never logged.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import h11
import orjson

from service.keys import ScopeKey
from service.sizing.answer import Answer

MAX_ANSWER_BYTES = 1 << 20


class SizerError(Exception):
    """The sizer could not be reached, or did not answer 200 with an answer; the message says which."""


@dataclass(frozen=True)
class Sizer:
    url: str
    token: str | None = None
    #: None: the system's trust store (for an https:// sizer); plain http needs none
    ssl_context: ssl.SSLContext | None = None

    def path(self, key: ScopeKey) -> str:
        base = urlsplit(self.url).path.rstrip("/")
        segments = "/".join(quote(s, safe="") for s in (key.org, key.repo, key.workflow, key.job))  # rule O6
        return f"{base}/api/v1/sizing/{segments}"

    async def answer(self, key: ScopeKey) -> Answer:
        """The job's answer (JSON); a refused connection, a non-200 or a body that is not an answer
        raises ``SizerError``. Unbounded in time: the caller sets the deadline."""
        status, body = await self._get(self.path(key))
        if status != 200:
            raise SizerError(f"the sizer answered {status}")
        try:
            doc: Any = orjson.loads(body)
            return Answer.from_dict(doc)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SizerError(f"the sizer's answer could not be read: {type(exc).__name__}") from None

    async def _get(self, target: str) -> tuple[int, bytes]:
        parts = urlsplit(self.url)
        secure = parts.scheme == "https"
        host = parts.hostname or "localhost"
        port = parts.port or (443 if secure else 80)
        context = (self.ssl_context or ssl.create_default_context()) if secure else None
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=context)
        except OSError as exc:
            raise SizerError(f"cannot connect to the sizer: {exc.strerror or type(exc).__name__}") from None
        try:
            return await _exchange(reader, writer, target, parts.netloc.rpartition("@")[2], self.token)
        except (OSError, h11.ProtocolError) as exc:
            raise SizerError(f"the sizer's connection failed: {type(exc).__name__}") from None
        finally:
            writer.close()


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: str, host: str, token: str | None
) -> tuple[int, bytes]:
    conn = h11.Connection(our_role=h11.CLIENT, max_incomplete_event_size=64 * 1024)
    headers = [("Host", host), ("Accept", "application/json"), ("Connection", "close")]
    if token:
        headers.append(("Authorization", f"Bearer {token}"))
    writer.write(conn.send(h11.Request(method="GET", target=target, headers=headers)))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()
    status = 0
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            conn.receive_data(data)  # b"" is the end of the stream: h11 raises if it came too early
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_ANSWER_BYTES:
                raise SizerError(f"the sizer's answer is over {MAX_ANSWER_BYTES} bytes")
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return status, bytes(body)
