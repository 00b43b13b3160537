"""A real ``ci-sizer serve`` process for tests that need one (crash, outage, workers, fuzzing)."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM (a clean shutdown), then SIGKILL if it has not ended within ``timeout``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def healthy(port: int) -> bool:
    """``GET /healthz`` answers 200. A bare HTTP/1.1 request (no client library): the probe runs every
    20 ms while a server starts, and an ``httpx.get`` builds a TLS context with the system's CA bundle on
    each call, even for http:// (46 ms of CPU here, a second per server start at the old 0.1 s pace,
    taken from the server starting beside it on a loaded machine)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


class LiveServer:
    def __init__(
        self,
        database_url: str,
        *args: str,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], object] | None = None,
    ) -> None:
        self.database_url = database_url
        self.preexec_fn = preexec_fn  #: run in the child before it execs (limits: resource.setrlimit)
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "service",
            "serve",
            "--port",
            str(self.port),
            "--database-url",
            self.database_url,
            *self.args,
        ]

    def start(self, timeout: float = 60) -> LiveServer:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            self.command(),
            env={**os.environ, **self.env},
            stdout=out,
            stderr=out,
            preexec_fn=self.preexec_fn,
        )
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"server exited with {self.proc.returncode}"
            if healthy(self.port):
                return self
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush, as a crash."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
