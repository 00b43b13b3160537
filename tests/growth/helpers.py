"""What the growth tests share: a build that allocates and touches memory step by step, the JSON answer's
grow block in a file, and real cgroup v1 memory cgroups to run builds in.

Tests that need a writable cgroup memory controller skip, loudly, where there is none; with
``CI_SIZER_REQUIRE_CGROUP=1`` (CI sets it: it runs as root with the cgroup v1 memory controller mounted
read-write at /sys/fs/cgroup/memory) they fail instead."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.collector.mounts import own_cgroups
from service.growth.cgroups import remove

MIB = 1 << 20

# A build: maps and touches (MAP_POPULATE: the kernel faults every page in) CHUNK MiB at a time up to
# TOTAL MiB at RATE MiB/s (0: as fast as the kernel can), prints the rate it got, holds it all for HOLD
# seconds, and writes its own peak resident set (VmHWM) to REPORT when given. Exit status 0 when it got
# there. (bench/grow.py runs it too.)
ALLOCATE = r"""
import mmap, sys, time
total, rate, chunk, hold = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
blocks, done, t0 = [], 0, time.monotonic()
while done < total:
    n = min(chunk, total - done)
    blocks.append(mmap.mmap(-1, n << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE))
    done += n
    if rate > 0:
        time.sleep(max(0.0, t0 + done / rate - time.monotonic()))
print(done / (time.monotonic() - t0), flush=True)
time.sleep(hold)
if len(sys.argv) > 5:
    hwm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    open(sys.argv[5], "w").write(str(hwm))
"""


def allocate(tmp_path: Path, total: int, *, rate: float, chunk: int = 8, hold: float = 0.3) -> tuple[list[str], Path]:
    """The build's command line, and where it reports its peak."""
    script = tmp_path / "allocate.py"
    script.write_text(ALLOCATE)
    report = tmp_path / f"peak-{total}-{rate}"
    import sys

    return [sys.executable, str(script), str(total), str(rate), str(chunk), str(hold), str(report)], report


def answer_file(path: Path, *, limit: int, max_bytes: int, threshold: int, step: int, container: str = "build") -> Path:
    """A JSON answer as GET /api/v1/sizing gives it, with the contract's grow block for one container."""
    path.write_text(
        json.dumps({
            "org": "acme", "repo": "web", "workflow": "ci.yml", "job": "build",
            "containers": [{
                "name": container,
                "cpu": {"request": "1", "limit": None, "request_millicores": 1000, "limit_millicores": None},
                "memory": {"request": f"{limit // MIB}Mi", "limit": f"{limit // MIB}Mi",
                           "request_bytes": limit, "limit_bytes": limit},
                "oom": {"consecutive": 0, "backoff_factor": 1.0, "capped": False},
                "grow": {"max": f"{max_bytes // MIB}Mi", "max_bytes": max_bytes, "threshold_percent": threshold,
                         "step": f"{step // MIB}Mi", "step_bytes": step},
            }],
            "meta": {"phase": "confident", "degraded": False},
        })
    )  # fmt: skip
    return path


# ------------------------------------------------------------------ real cgroups


def _writable_v1_memory() -> Path | None:
    with contextlib.suppress(OSError, KeyError, ValueError):
        memory = own_cgroups()["memory"]
        probe = memory / f"ci-sizer-probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
        return memory
    return None


def cgroup_parent() -> Path:
    """This process's cgroup v1 memory directory, where the tests make cgroups; skips (or, with
    CI_SIZER_REQUIRE_CGROUP=1, fails) where there is none writable."""
    found = _writable_v1_memory()
    if found is None:
        why = (
            "NO WRITABLE CGROUP V1 MEMORY CONTROLLER: the kernel OOM-kill and growth tests did not run "
            "(they need root and /sys/fs/cgroup/memory mounted read-write; CI_SIZER_REQUIRE_CGROUP=1 makes this a failure)"
        )
        if os.environ.get("CI_SIZER_REQUIRE_CGROUP") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return found


@contextlib.contextmanager
def limited(name: str, limit: int) -> Iterator[Path]:
    """A new memory cgroup (v1) of ``limit`` bytes below this process's own, removed afterwards."""
    cg = cgroup_parent() / f"ci-sizer-test-{name}-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(limit))
        yield cg
    finally:
        remove(cg, wait=5.0)  # the processes it held may still be exiting


def enter(cg: Path) -> list[str]:
    """A prefix that moves the command into the cgroup, then runs it (as a container's process starts in its cgroup)."""
    return ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh"]


def oom_kills(cg: Path) -> int:
    line = next(x for x in (cg / "memory.oom_control").read_text().splitlines() if x.startswith("oom_kill "))
    return int(line.split()[1])


def stored_container(database: Path, run_id: str) -> dict[str, Any]:
    """The run's container as the live server stored it (its SQLite database, read directly)."""
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.row_factory = sqlite3.Row
        row = db.execute(
            "SELECT c.* FROM run_containers c JOIN runs r ON r.id = c.run_pk WHERE r.run_id = ?", (run_id,)
        ).fetchone()
    assert row is not None, f"run {run_id} was not stored"
    return dict(row)


class Recorder:
    """An HTTP hop in front of a live sizer that keeps every run body posted through it (the run as it went
    on the wire) and hands each on unchanged, with the sizer's answer; GETs pass through."""

    def __init__(self, upstream: str) -> None:
        import threading
        import urllib.error
        import urllib.request
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.posted: list[dict[str, Any]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                recorder.posted.append(json.loads(data))
                self._forward(data)

            def _forward(self, data: bytes | None) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
                method = "GET" if data is None else "POST"
                request = urllib.request.Request(upstream + self.path, data=data, headers=headers, method=method)
                try:
                    with urllib.request.urlopen(request, timeout=30) as r:
                        status, body = r.status, r.read()
                except urllib.error.HTTPError as exc:
                    status, body = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def last_container(self) -> dict[str, Any]:
        assert self.posted, "nothing was posted"
        container: dict[str, Any] = self.posted[0]["containers"][0]
        return container


def identity(job: str) -> list[str]:
    """The collector's identity flags for a job of its own (each test reads back only its own job)."""
    return ["--org", "acme", "--repo", "web", "--workflow", "ci.yml", "--job", job, "--run-id", f"{job}-1"]


def job_growths(url: str, job: str) -> dict[str, Any]:
    """What the live sizer stored of the job's growth events (GET /api/v1/growths/...)."""
    import httpx

    r = httpx.get(f"{url}/api/v1/growths/acme/web/ci.yml/{job}", timeout=30)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def stored_events(url: str, job: str) -> list[tuple[int, int, str]]:
    """The job's stored events, oldest first, as (from_bytes, to_bytes, result)."""
    return [(e["from_bytes"], e["to_bytes"], e["result"]) for e in reversed(job_growths(url, job)["recent"])]
