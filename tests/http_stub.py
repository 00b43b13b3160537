"""A small HTTP server on a free loopback port, for tests that stand in for someone else's API."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Respond = Callable[[str, str, bytes], tuple[int, dict[str, Any]]]


class StubServer:
    """Hands each request to ``respond(method, path, body)``, which gives the status and a JSON body,
    and keeps ``(method, path, body)`` of every request in ``requests``."""

    def __init__(self, respond: Respond) -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                stub.requests.append((self.command, self.path, body))
                status, answer = respond(self.command, self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
