"""A TCP or Unix-socket proxy in front of PostgreSQL that can make the database hang or vanish,
for the soak's outage phases (the shared server itself is never stopped).

- ``forward``: bytes pass both ways;
- ``hang``: the connections it holds stop passing bytes, new ones are accepted and never answered
  (a database that accepts connections but never answers);
- ``down``: every connection is closed and the listener goes away; a Unix socket's file is
  removed, so connecting fails with "no such file" (the database is stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path


class Proxy:
    def __init__(self, upstream: tuple[str, int], *, unix_path: Path | None = None) -> None:
        self.upstream = upstream
        self.unix_path = unix_path
        self.mode = "forward"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> Proxy:
        if self.unix_path is not None:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.unix_path))
        else:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
            self.port = self._server.sockets[0].getsockname()[1]
        self.mode = "forward"
        return self

    async def set_mode(self, mode: str) -> None:
        if mode == "down":
            await self.stop()
        elif self._server is None:
            await self.start()
        self.mode = mode

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.close()
        self._writers.clear()
        if self.unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.unix_path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while self.mode == "hang":
                await asyncio.sleep(0.1)
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            self._writers.add(up_writer)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except OSError:
            pass
        finally:
            writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                while self.mode == "hang":  # hold the bytes: the peer waits for an answer
                    await asyncio.sleep(0.1)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()
