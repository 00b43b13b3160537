"""Connection bounds of a real ``ci-sizer serve`` (issue 33, major item; service/connections.py,
docs/reliability.md "Connections are bounded"), with real sockets: idle sockets, a head or a body a
byte at a time, an answer never taken, oversized heads, more connections than the bound, and more
than the file-descriptor limit allows."""

from __future__ import annotations

import json
import resource
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .helpers import run
from .live import LiveServer

HEAD_TIMEOUT = 1.0
BODY_TIMEOUT = 1.5


def connect(server: LiveServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def until_closed(sock: socket.socket, seconds: float = 10) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    started = time.monotonic()
    sock.settimeout(seconds)
    chunks = []
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {seconds:g} s")
    return b"".join(chunks), time.monotonic() - started


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:80]
    return int(answer[9:12])


def problem_of(answer: bytes) -> dict[str, object]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in head.lower()
    problem: dict[str, object] = json.loads(body)
    return problem


def rss_kib(server: LiveServer) -> int:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def open_fds(server: LiveServer) -> int:
    assert server.proc is not None
    return len(list(Path(f"/proc/{server.proc.pid}/fd").iterdir()))


def healthz(server: LiveServer) -> int:
    return httpx.get(f"{server.url}/healthz", timeout=5).status_code


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """``ci-sizer serve`` as the README starts it (SQLite), with short time bounds."""
    directory = tmp_path_factory.mktemp("bounded")
    with LiveServer(
        f"sqlite:///{directory}/bounded.db",
        "--header-timeout-seconds",
        str(HEAD_TIMEOUT),
        "--body-timeout-seconds",
        str(BODY_TIMEOUT),
        "--log-level",
        "warning",
        log=directory / "serve.log",
    ) as server:
        yield server


# --------------------------------------------------------------------------- time


def test_an_idle_connection_is_closed_at_the_head_timeout(bounded: LiveServer) -> None:
    socks = [connect(bounded) for _ in range(20)]
    for sock in socks:
        answer, elapsed = until_closed(sock)
        assert answer == b""  # nothing was asked: closed without an answer
        assert elapsed < HEAD_TIMEOUT + 2
    assert healthz(bounded) == 200


def test_a_head_sent_a_byte_at_a_time_is_answered_408(bounded: LiveServer) -> None:
    sock = connect(bounded)
    started = time.monotonic()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    try:
        for byte in b"X-Slow: " + b"a" * 100:
            sock.sendall(bytes([byte]))
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed by the server, as it should
    answer, _ = until_closed(sock)
    assert time.monotonic() - started < HEAD_TIMEOUT + 2
    assert status_of(answer) == 408
    assert problem_of(answer)["status"] == 408


def test_a_body_sent_a_byte_a_second_is_answered_408(bounded: LiveServer) -> None:
    sock = connect(bounded)
    body = json.dumps(run(1)).encode()
    sock.sendall(
        b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    started = time.monotonic()
    try:
        for byte in body:
            sock.sendall(bytes([byte]))
            time.sleep(0.5)
            if time.monotonic() - started > BODY_TIMEOUT + 3:
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer, _ = until_closed(sock)
    assert time.monotonic() - started < BODY_TIMEOUT + 3
    assert status_of(answer) == 408
    # nothing half-received was stored
    assert httpx.get(f"{bounded.url}/api/v1/jobs", timeout=5).json()["items"] == []


def test_an_answer_the_client_never_takes_is_dropped(bounded: LiveServer) -> None:
    # a client that asks and never reads: once the socket buffers are full, the answer waits on the
    # client; past the body timeout the connection is dropped (its buffered answer with it)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", bounded.port))
    request = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
    size = len(httpx.get(f"{bounded.url}/openapi.json", timeout=5).content)
    count = 16 * 1024 * 1024 // size + 1  # far more than every socket buffer holds
    sock.sendall(request * count)
    time.sleep(BODY_TIMEOUT + 2)
    answer, elapsed = until_closed(sock)
    assert len(answer) < count * size  # not all answered: dropped
    assert elapsed < 5
    assert healthz(bounded) == 200


# --------------------------------------------------------------------------- head size


def test_a_head_over_the_limit_is_answered_431(bounded: LiveServer) -> None:
    for size, expected in ((12_000, 200), (20_000, 431)):
        sock = connect(bounded)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: " + b"a" * size + b"\r\n\r\n")
        answer, _ = until_closed(sock)
        assert status_of(answer) == expected, size
        if expected == 431:
            assert problem_of(answer)["status"] == 431


def test_a_huge_header_costs_neither_memory_nor_time(bounded: LiveServer) -> None:
    before = rss_kib(bounded)
    sock = connect(bounded)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
    chunk = b"a" * (1 << 20)
    sent = 0
    try:
        while sent < 256 << 20:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer, _ = until_closed(sock)
    assert sent < 64 << 20  # refused long before the client could send it all
    if answer:  # the 431 may be lost to the reset of a connection closed with unread bytes
        assert status_of(answer) == 431
    assert rss_kib(bounded) - before < 16 * 1024
    assert healthz(bounded) == 200


# --------------------------------------------------------------------------- how many


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    """At most four connections; writes may wait on SQLite's lock for up to 30 s (the test holds it for
    as long as it needs, then lets them through)."""
    directory = tmp_path_factory.mktemp("small")
    with LiveServer(
        f"sqlite:///{directory}/small.db",
        "--max-connections",
        "4",
        "--header-timeout-seconds",
        "3",
        "--write-timeout-seconds",
        "30",
        "--log-level",
        "warning",
        env={"CI_SIZER_DATABASE_CONNECT_TIMEOUT_SECONDS": "30"},
        log=directory / "serve.log",
    ) as server:
        yield server, directory / "small.db"


def request(server: LiveServer, path: str) -> bytes:
    sock = connect(server)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    return until_closed(sock)[0]


def test_past_the_limit_the_longest_waiting_connection_makes_room(small: tuple[LiveServer, Path]) -> None:
    server, _ = small
    idle = [connect(server) for _ in range(10)]
    # every new connection found the others waiting on their clients: the oldest made room
    answer = request(server, "/api/v1/info")
    assert status_of(answer) == 200
    evicted = [until_closed(sock, 5)[0] for sock in idle[:6]]
    for answer in evicted:
        assert status_of(answer) == 503
        assert b"retry-after: 1" in answer.lower()
    for sock in idle:
        sock.close()


def test_when_every_connection_is_busy_a_clear_503_and_probes_still_answer(small: tuple[LiveServer, Path]) -> None:
    server, database = small
    lock = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
    lock.execute("BEGIN IMMEDIATE")  # every write now waits inside the app
    results: list[int] = []

    def ingest(n: int) -> None:
        # a writer that arrives while a probe holds the fourth connection inside the app is refused (503,
        # the bound at work, nothing stored): it tries again, as a client told Retry-After does
        deadline = time.monotonic() + 30
        while True:
            status = httpx.post(f"{server.url}/api/v1/runs", json=run(n), timeout=30).status_code
            if status != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        results.append(status)

    writers = [threading.Thread(target=ingest, args=(n,)) for n in range(4)]
    try:
        for w in writers:
            w.start()
        # a wait, not a timing: the four threads' POSTs reach the app within seconds, later on a loaded machine
        deadline = time.monotonic() + 30
        while True:  # wait until the four connections are inside the app
            answer = request(server, "/api/v1/info")
            if status_of(answer) == 503:
                break
            assert time.monotonic() < deadline, "the writers never filled the connections"
            time.sleep(0.05)
        assert b"retry-after" in answer.lower()
        assert problem_of(answer)["status"] == 503
        # a probe is still answered on a connection past the bound
        assert status_of(request(server, "/healthz")) == 200
        # and past the few connections read for probes, 503 without reading anything
        held = [connect(server) for _ in range(16)]
        refused = connect(server)
        answer, elapsed = until_closed(refused, 5)
        assert status_of(answer) == 503
        assert elapsed < 2  # refused at once, not read until the 3 s header deadline
        for sock in held:
            sock.close()
    finally:
        lock.execute("ROLLBACK")
        lock.close()
        for w in writers:
            w.join(timeout=30)
    assert sorted(results) == [201, 201, 201, 201]


# --------------------------------------------------------------------------- file descriptors


@pytest.fixture
def many_fds() -> Iterator[None]:
    """This test process may open a few thousand sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        if hard != resource.RLIM_INFINITY and hard < 2400:
            pytest.skip(f"the hard open-file limit {hard} is too low for this test's own sockets")
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def nofile(soft: int, hard: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_more_idle_sockets_than_descriptors_leave_probes_and_sizing_answering(tmp_path: Path, many_fds: None) -> None:
    # the audit's repro: `ulimit -n 1024`, 1,100 idle sockets, /healthz must still answer
    with LiveServer(
        f"sqlite:///{tmp_path}/fd.db", "--log-level", "warning", preexec_fn=lambda: nofile(1024, 1024)
    ) as server:
        socks = [connect(server) for _ in range(1100)]
        try:
            assert healthz(server) == 200
            sizing = httpx.get(f"{server.url}/api/v1/sizing/acme/web/ci/build", timeout=5)
            assert sizing.status_code == 200
            assert open_fds(server) < 1024
        finally:
            for sock in socks:
                sock.close()


def test_a_descriptor_limit_below_the_bounds_is_refused_at_start(tmp_path: Path) -> None:
    server = LiveServer(
        f"sqlite:///{tmp_path}/fd.db", "--max-connections", "2000", preexec_fn=lambda: nofile(1024, 1024)
    )
    server.log = tmp_path / "serve.log"
    with pytest.raises(AssertionError, match="server exited with 2"):
        server.start(timeout=30)
    log = (tmp_path / "serve.log").read_text()
    assert "RLIMIT_NOFILE" in log
    assert "--max-connections 2000" in log


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the hard open-file limit {hard} is below 4096")
    with LiveServer(f"sqlite:///{tmp_path}/fd.db", preexec_fn=lambda: nofile(256, 4096)) as server:
        assert server.proc is not None
        limits = Path(f"/proc/{server.proc.pid}/limits").read_text()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        assert line.split()[3:5] == ["4096", "4096"]
