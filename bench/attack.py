"""Connection-level attacks on a real ``ci-sizer serve``, as the README starts it (SQLite), under
``ulimit -n 1024``: what the server holds and what a build's sizing call costs meanwhile.

For each attack, and for a baseline without one, a fresh server is started and probed for
``--seconds``: a sizing GET every 50 ms and ``/healthz`` every 500 ms, each on a new connection as
curl makes them. Printed, the median of ``--rounds`` runs:

- **held**: the most client connections the server process held at once (its socket descriptors on
  the port), **RSS**: its most resident memory;
- **sizing p50 / p99 / max**, and how many of the sizing calls and probes were answered (within 5 s).

The attacks (issue 33): ``idle`` 1,100 sockets that send nothing; ``slow-head`` 1,000 sockets sending
a request head a byte a second; ``slow-body`` 1,000 POSTs sending their body a byte a second; ``big-header``
4 clients each streaming a 256 MB header line; ``invalid-bodies`` 4 clients posting invalid 10 MB runs in a
loop. A socket the server closes is opened again, as an attacker would.

    python bench/attack.py                       # this checkout
    python bench/attack.py --checkout /work/main # another one, for a before/after (same interpreter)
    python bench/attack.py --overhead            # the bounds' own cost per request, on the bare app
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/http.py would shadow the standard library's http package: the repository instead
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import contextlib
import json
import os
import resource
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

import httpx

from bench._util import ROOT, quantile
from tests.live import free_port, healthy

JOB = "/api/v1/sizing/acme/web/ci/build"


class Server:
    def __init__(self, checkout: Path, nofile: int, directory: Path) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        limit = (nofile, nofile)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--port", str(self.port), "--log-level", "error",
             "--database-url", f"sqlite:///{directory}/attack.db"],
            cwd=directory, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit),
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while not healthy(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.02)
        for n in range(3):
            run = {
                "org": "acme", "repo": "web", "workflow": "ci", "job": "build", "run_id": f"r{n}",
                "finished_at": f"2026-11-20T10:0{n}:00Z",
                "containers": [{"name": "build", "memory_peak_bytes": 1 << 29,
                                "cpu_stats_millicores": dict.fromkeys(("peak", "p99", "p95", "p75", "p50", "avg"), 500)}],
            }  # fmt: skip
            httpx.post(f"{self.url}/api/v1/runs", json=run, timeout=10).raise_for_status()

    def held(self) -> int:
        """Client connections this process holds: its socket descriptors on the port, listener aside."""
        inodes = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError):
                for line in Path(table).read_text().splitlines()[1:]:
                    fields = line.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) == self.port and fields[3] != "0A":  # not LISTEN
                        inodes.add(fields[9])
        count = 0
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{self.proc.pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        count += 1
        return count

    def rss_mb(self) -> float:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def request(port: int, path: str, timeout: float = 5.0) -> tuple[int, float]:
    """(status, seconds) of one GET on a new connection; status 0 when it failed or timed out."""
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        status = int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else 0
    except OSError:
        status = 0
    return status, time.perf_counter() - started


class Probe(threading.Thread):
    """Sizing calls every 50 ms and health probes every 500 ms, each on a new connection."""

    def __init__(self, server: Server, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.server, self.stop = server, stop
        self.sizing: list[tuple[int, float]] = []
        self.health: list[int] = []

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            self.sizing.append(request(self.server.port, JOB))
            if n % 10 == 0:
                self.health.append(request(self.server.port, "/healthz")[0])
            n += 1
            self.stop.wait(0.05)


# --------------------------------------------------------------------------- attacks


def _sockets(port: int, count: int, stop: threading.Event, first: bytes, drip: bytes) -> None:
    """``count`` sockets, each sending ``first`` then one byte of ``drip`` a second; reopened when closed."""
    socks: list[socket.socket | None] = [None] * count
    sent = [0] * count
    while not stop.is_set():
        for i in range(count):
            if stop.is_set():
                break
            try:
                if socks[i] is None:
                    s = socket.create_connection(("127.0.0.1", port), timeout=2)
                    s.setblocking(False)
                    if first:
                        s.send(first)
                    socks[i], sent[i] = s, 0
                elif drip:
                    socks[i].send(drip[sent[i] % len(drip) : sent[i] % len(drip) + 1])  # type: ignore[union-attr]
                    sent[i] += 1
                else:  # idle: only notice a close
                    if socks[i].recv(1, socket.MSG_PEEK) == b"":  # type: ignore[union-attr]
                        raise ConnectionResetError
            except BlockingIOError:
                pass
            except OSError:
                if socks[i] is not None:
                    socks[i].close()  # type: ignore[union-attr]
                socks[i] = None
        stop.wait(1.0)
    for s in socks:
        if s is not None:
            s.close()


def idle(port: int, stop: threading.Event) -> None:
    _sockets(port, 1100, stop, b"", b"")


def slow_head(port: int, stop: threading.Event) -> None:
    _sockets(port, 1000, stop, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"X-Slow: " + b"a" * 10_000)


def slow_body(port: int, stop: threading.Event) -> None:
    head = b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    _sockets(port, 1000, stop, head, b'{"org": "' + b"a" * 99_990)


def _stream_header(port: int, stop: threading.Event) -> None:
    chunk = b"a" * (1 << 20)
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
                for _ in range(256):
                    if stop.is_set():
                        return
                    s.sendall(chunk)
        except OSError:
            stop.wait(0.05)


def big_header(port: int, stop: threading.Event) -> None:
    _threads(4, lambda: _stream_header(port, stop))


def _post_invalid(port: int, stop: threading.Event) -> None:
    samples = ",".join(["1.25"] * 1_990_000)  # 10 MB, under the 10 MiB bound; invalid (too many samples)
    body = (
        '{"org": "acme", "repo": "web", "workflow": "ci", "job": "build", "run_id": "bad", '
        '"finished_at": "2026-11-20T10:00:00Z", "containers": [{"name": "build", "memory_peak_bytes": -1, '
        f'"cpu_samples_millicores": [{samples}]}}]}}'
    ).encode()
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                client.post(
                    f"http://127.0.0.1:{port}/api/v1/runs", content=body, headers={"content-type": "application/json"}
                )


def invalid_bodies(port: int, stop: threading.Event) -> None:
    _threads(4, lambda: _post_invalid(port, stop))


def _threads(count: int, target: Callable[[], None]) -> None:
    threads = [threading.Thread(target=target, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


ATTACKS: dict[str, Callable[[int, threading.Event], None] | None] = {
    "baseline": None,
    "idle": idle,
    "slow-head": slow_head,
    "slow-body": slow_body,
    "big-header": big_header,
    "invalid-bodies": invalid_bodies,
}


def measure(checkout: Path, nofile: int, name: str, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ci-sizer-attack-") as tmp:
        server = Server(checkout, nofile, Path(tmp))
        try:
            stop = threading.Event()
            attack = ATTACKS[name]
            attacker = threading.Thread(target=attack, args=(server.port, stop), daemon=True) if attack else None
            if attacker is not None:
                attacker.start()
                time.sleep(1.0)  # the attack in place before the probes start
            probe = Probe(server, stop)
            probe.start()
            held, rss = 0, 0.0
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                held, rss = max(held, server.held()), max(rss, server.rss_mb())
                time.sleep(0.25)
            stop.set()
            probe.join(timeout=10)
            if attacker is not None:
                attacker.join(timeout=30)
        finally:
            server.stop()
    ok = [t for status, t in probe.sizing if status == 200]
    return {
        "held": held,
        "rss_mb": rss,
        "p50_ms": quantile(ok, 0.5) * 1000,
        "p99_ms": quantile(ok, 0.99) * 1000,
        "max_ms": max(ok, default=float("nan")) * 1000,
        "sizing_ok": len(ok) / max(1, len(probe.sizing)),
        "health_ok": sum(s == 200 for s in probe.health) / max(1, len(probe.health)),
    }


# --------------------------------------------------------------------------- the bounds' own cost

_BARE = """
import sys
sys.path[0] = sys.argv[3]
import uvicorn
from bench.bare_app import app
from service.connections import BoundedHttpToolsProtocol
http = BoundedHttpToolsProtocol if sys.argv[2] == "bounded" else "httptools"
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False, loop="uvloop",
            http=http)
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def protocol_cost(kind: str, seconds: float) -> tuple[float, float]:
    """(requests per second, server CPU microseconds per request) of the bare app under ``kind``."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _BARE, str(port), kind, str(ROOT)])
    try:
        deadline = time.monotonic() + 30
        while request(port, "/healthz", timeout=1)[0] != 200:
            if time.monotonic() > deadline:
                raise SystemExit("the bare app did not start")
            time.sleep(0.1)
        before = _cpu_seconds(proc.pid)
        out = subprocess.run(
            ["wrk", "-t1", "-c32", f"-d{seconds:g}s", f"http://127.0.0.1:{port}/healthz"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        used = _cpu_seconds(proc.pid) - before
    finally:
        proc.terminate()
        proc.wait()
    count = int(out.split(" requests in ")[0].split()[-1])
    return count / seconds, used / count * 1e6


def overhead(rounds: int, seconds: float) -> None:
    """The bounded protocol's cost per request: the bare app of bench/mixed.py (bench/bare_app.py) under
    uvicorn's httptools protocol and under the bounded one, in alternating rounds; the server's CPU per
    request is steadier than requests per second on a shared machine."""
    figures: dict[str, list[tuple[float, float]]] = {"httptools": [], "bounded": []}
    for _ in range(rounds):
        for kind in figures:
            figures[kind].append(protocol_cost(kind, seconds))
    print(f"GET /healthz of the bare app, wrk -t1 -c32 keep-alive, {seconds:g} s a round, median of {rounds}")
    for kind, runs in figures.items():
        rps = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        print(f"{kind:<10} {rps:>8.0f} req/s  {cpu:>6.1f} us of server CPU per request  (rounds: "
              f"{', '.join(f'{r[1]:.0f}' for r in runs)} us)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", type=Path, default=ROOT, help="the ci-sizer checkout to serve (default: this one)")
    p.add_argument("--nofile", type=int, default=1024, help="the server's open-file limit (soft and hard)")
    p.add_argument("--seconds", type=float, default=8.0, help="how long each attack is probed")
    p.add_argument("--rounds", type=int, default=3, help="runs of each attack (the median is printed)")
    p.add_argument("--only", nargs="*", choices=list(ATTACKS), help="these attacks only (and the baseline)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--overhead", action="store_true", help="instead: the bounded protocol's cost per request")
    args = p.parse_args()
    if args.overhead:
        overhead(max(args.rounds, 6), args.seconds)
        return
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process opens a few thousand sockets
    names = ["baseline", *(n for n in ATTACKS if n != "baseline" and (not args.only or n in args.only))]
    print(f"checkout {args.checkout}, server RLIMIT_NOFILE {args.nofile}, {args.seconds:g} s per attack, "
          f"median of {args.rounds}")  # fmt: skip
    results: dict[str, dict[str, float]] = {}
    header = f"{'attack':<15} {'held':>6} {'RSS MB':>7} {'sizing p50':>11} {'p99':>8} {'max':>8} {'sizing ok':>10} {'healthz ok':>11}"
    print(header)
    for name in names:
        runs = [measure(args.checkout, args.nofile, name, args.seconds) for _ in range(args.rounds)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        results[name] = med
        print(
            f"{name:<15} {med['held']:>6.0f} {med['rss_mb']:>7.0f} {med['p50_ms']:>9.1f}ms {med['p99_ms']:>6.0f}ms "
            f"{med['max_ms']:>6.0f}ms {med['sizing_ok']:>9.0%} {med['health_ok']:>10.0%}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
