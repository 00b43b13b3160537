"""``ci-sizer collect`` posting a run: to a live sizer, spooled when the sizer is unreachable or hangs
(within ``--timeout`` in all), and sent later with ``--flush``."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.collector import outbox

from ..live import LiveServer, free_port
from .helpers import IDENTITY, check_accuracy, collect, run_workload, truth


def test_unreachable_sizer_spools_then_flush_sends(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    dead = f"http://127.0.0.1:{free_port()}"
    done, truth_dir = run_workload(
        tmp_path, "--url", dead, *IDENTITY, "--run-id", "7", "--interval", "0.2", "--retries", "1",
        "--backoff", "0.1", "--spool-dir", str(spool),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr  # the command's exit code, not the collector's trouble
    assert "spooled the run to" in done.stderr
    files = list(spool.glob("run-*.json"))
    assert len(files) == 1
    body = json.loads(files[0].read_text())
    assert (body["org"], body["job"], body["run_id"]) == ("acme", "build", "7")
    check_accuracy(body, truth_dir)

    with LiveServer(f"sqlite:///{tmp_path / 'sizer.db'}") as server:
        flushed = collect("--flush", str(spool), "--url", server.url)
        assert flushed.returncode == 0, flushed.stderr
        assert not list(spool.glob("run-*.json"))
        again = httpx.post(server.url + "/api/v1/runs", json=body)
        assert again.json()["result"] == "duplicate"  # the flushed run is the stored one
        observed = httpx.get(server.url + "/api/v1/sizing/acme/web/ci.yml/build").json()["containers"][0]
        assert observed["observed"]["memory_bytes"] == body["containers"][0]["memory_peak_bytes"]


def test_posts_to_a_live_sizer(tmp_path: Path) -> None:
    with LiveServer(f"sqlite:///{tmp_path / 'sizer.db'}") as server:
        done, truth_dir = run_workload(tmp_path, "--url", server.url, *IDENTITY, "--run-id", "8", "--interval", "0.2")
        assert done.returncode == 3, done.stderr
        assert "posted run 8" in done.stderr
        answer = httpx.get(server.url + "/api/v1/sizing/acme/web/ci.yml/build").json()
        assert answer["meta"]["clean_samples"] == 1
        _, peak = truth(truth_dir)
        assert answer["containers"][0]["observed"]["memory_bytes"] == pytest.approx(peak, rel=0.15)


def test_flush_keeps_what_it_cannot_send(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    outbox.spool(spool, {"org": "a"})
    done = collect("--flush", str(spool), "--url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert len(list(spool.glob("run-*.json"))) == 1


# --------------------------------------------------------------------------- --timeout


@pytest.fixture
def hanging_sizer() -> Iterator[str]:
    """A socket that accepts every connection and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


#: a command that gives readings (it lives a few samples), so that there is a run to post
SHORT = (sys.executable, "-c", "import time; time.sleep(0.3)")
#: what starting Python, the collector and the command take here, beyond the time spent posting
STARTUP = 3.0


def timed_collect(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = collect(*args, "--interval", "0.1", "--", *SHORT)
    return done, time.monotonic() - started


@pytest.mark.parametrize("timeout", [None, 1.5])
def test_timeout_bounds_what_a_hanging_sizer_adds(hanging_sizer: str, tmp_path: Path, timeout: float | None) -> None:
    # before --timeout: 4 attempts of 10 s each plus 7 s of backoff, 47 s added to every build
    spool = tmp_path / "spool"
    given = () if timeout is None else ("--timeout", str(timeout))
    done, took = timed_collect("--url", hanging_sizer, *IDENTITY, "--spool-dir", str(spool), *given)
    limit = 5.0 if timeout is None else timeout
    assert done.returncode == 0, done.stderr
    assert f"no answer in {limit:.1f}s" in done.stderr
    assert "the sizer is unreachable; spooled the run" in done.stderr
    assert len(list(spool.glob("run-*.json"))) == 1
    assert limit <= took < limit + STARTUP, took


def test_timeout_bounds_the_retries_on_a_refused_port(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    dead = f"http://127.0.0.1:{free_port()}"
    # 3 retries from 1 s would wait 1 + 2 + 4 s: the timeout cuts the waits short
    done, took = timed_collect("--url", dead, *IDENTITY, "--spool-dir", str(spool), "--timeout", "1.5")
    assert done.returncode == 0, done.stderr
    waits = [float(w) for w in re.findall(r"retrying in (\d+\.\d)s", done.stderr)]
    assert waits[0] == 1.0
    assert len(waits) >= 2
    assert all(w < 1.0 for w in waits[1:])  # not the doubled 2 s: what is left of the 1.5 s
    assert "the sizer is unreachable; spooled the run" in done.stderr
    assert len(list(spool.glob("run-*.json"))) == 1
    assert took < 1.5 + STARTUP, took
    bad = collect("--url", dead, *IDENTITY, "--timeout", "0", "--", "true")
    assert bad.returncode == 2
    assert "--timeout must be positive" in bad.stderr
