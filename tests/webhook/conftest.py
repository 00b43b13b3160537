"""A real sizer (``ci-sizer serve`` on SQLite, with tokens and runner ceilings) that has learned each
runner's job, a certificate made by ``ci-sizer webhook certs``, and real ``ci-sizer webhook serve``
processes over TLS: one asking that sizer (shared by the tests that only read from it), one whose sizer is
down (a refused port) and one whose sizer hangs (a socket that accepts and never answers)."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.auth import hash_secret

from ..helpers import container, run
from ..live import LiveServer, free_port, stop_process

GIB = 1 << 30
MIB = 1 << 20
SERVICE_NAME = "ci-sizer-webhook.ci-sizer.svc"  # what the API server checks the certificate against
READ_TOKEN = "cis_webhook-read-" + "r" * 32
INGEST_TOKEN = "cis_runner-ingest-" + "i" * 32
NAMESPACE = "ci"

#: the jobs the sizer has learned, as each runner's pod names them (tests/webhook/pods.py), and what
#: their runs recorded: (container, CPU millicores, memory bytes)
LEARNED: dict[str, tuple[dict[str, str], list[tuple[str, float, int]]]] = {
    "arc": (
        {"org": "acme", "repo": "web", "workflow": ".github/workflows/ci.yml", "job": "build"},
        [("build", 1500.0, 3 * GIB), ("postgres", 100.0, 300 * MIB)],
    ),
    "gitlab": (
        {"org": "acme", "repo": "web", "workflow": ".gitlab-ci.yml", "job": "build"},
        [("build", 800.0, 10 * GIB)],  # above the runner ceiling for acme (6Gi): clamped
    ),
    "buildkite": ({"org": "acme", "repo": "web", "workflow": "pipeline.yml", "job": "build"}, [("build", 900.0, GIB)]),
    "jenkins": ({"org": "acme", "repo": "web", "workflow": "Jenkinsfile", "job": "main"}, [("build", 2500.0, 2 * GIB)]),
    "tekton": (
        {"org": NAMESPACE, "repo": "web-ci", "workflow": "tekton", "job": "build"},
        [("build", 1200.0, 2 * GIB), ("postgres", 200.0, 512 * MIB)],
    ),
    "argo": ({"org": NAMESPACE, "repo": "web", "workflow": "argo", "job": "build"}, [("build", 600.0, GIB)]),
}
CEILINGS = '[[ceilings]]\norg = "acme"\nmemory_request = "6Gi"\nmemory_limit = "6Gi"\n'


def ca_context(ca_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file))


@dataclass
class Webhook:
    url: str
    ca_file: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def client(self, timeout: float = 10) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=ca_context(self.ca_file), timeout=timeout)

    def post(self, client: httpx.Client, review: Any) -> httpx.Response:
        # the API server connects to the Service's IP and checks the name <service>.<namespace>.svc
        return client.post("/mutate", json=review, extensions={"sni_hostname": SERVICE_NAME})

    def metrics(self, client: httpx.Client) -> str:
        return client.get("/metrics", extensions={"sni_hostname": SERVICE_NAME}).text


def make_certs(directory: Path) -> Path:
    out = subprocess.run(
        [sys.executable, "-m", "service", "webhook", "certs", "--output-dir", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return directory


def start_webhook(sizer_url: str, certs: Path, log: Path, *extra: str, token_file: Path | None = None) -> Webhook:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "service",
        "webhook",
        "serve",
        "--sizer-url",
        sizer_url,
        "--port",
        str(port),
        "--tls-cert-file",
        str(certs / "tls.crt"),
        "--tls-key-file",
        str(certs / "tls.key"),
        "--namespace",
        "ci-sizer",
        *extra,
    ]
    if token_file is not None:
        cmd += ["--token-file", str(token_file)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CI_SIZER_WEBHOOK_")}
    with open(log, "ab") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env)
    return Webhook(f"https://127.0.0.1:{port}", certs / "ca.crt", proc, log)


def wait_until_serving(hook: Webhook, timeout: float = 60) -> Webhook:
    deadline = time.monotonic() + timeout
    with hook.client(timeout=1) as client:
        while True:
            assert hook.proc.poll() is None, f"the webhook exited: {hook.log.read_text()[-2000:]}"
            try:
                if client.get("/healthz", extensions={"sni_hostname": SERVICE_NAME}).status_code == 200:
                    return hook
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the webhook did not start"
            time.sleep(0.1)


def stop(hook: Webhook) -> None:
    stop_process(hook.proc)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def sizer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A sizer that requires tokens and clamps acme's answers, having learned every runner's job."""
    d = tmp_path_factory.mktemp("sizer")
    tokens = d / "tokens.toml"
    tokens.write_text(
        f'[[tokens]]\nname = "webhook"\nsha256 = "{hash_secret(READ_TOKEN)}"\nroles = ["read"]\n\n'
        f'[[tokens]]\nname = "runners"\nsha256 = "{hash_secret(INGEST_TOKEN)}"\nroles = ["ingest"]\n'
    )
    (d / "ceilings.toml").write_text(CEILINGS)
    server = LiveServer(
        f"sqlite:///{d / 'sizer.db'}",
        "--tokens-file",
        str(tokens),
        "--runner-ceilings-file",
        str(d / "ceilings.toml"),
        log=d / "sizer.log",
    )
    server.start()
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {INGEST_TOKEN}"}) as client:
            for job, recorded in LEARNED.values():
                for n in range(1, 4):
                    body = run(n, *(container(name, cpu=cpu, mem=mem) for name, cpu, mem in recorded), job=job)
                    assert client.post("/api/v1/runs", json=body).status_code == 201
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def webhooks(sizer: LiveServer, certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Webhook]]:
    """``up`` (the sizer above), ``down`` (nothing listens) and ``hanging`` (accepts, never answers),
    started together; the last two with a 300 ms deadline."""
    d = tmp_path_factory.mktemp("webhooks")
    token = d / "token"
    token.write_text(READ_TOKEN + "\n")
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)  # the kernel completes connections into the backlog; nobody reads them
    hooks = {
        "up": start_webhook(sizer.url, certs, d / "up.log", token_file=token),
        "down": start_webhook(f"http://127.0.0.1:{free_port()}", certs, d / "down.log", "--deadline-ms", "300"),
        "hanging": start_webhook(
            f"http://127.0.0.1:{hang.getsockname()[1]}", certs, d / "hanging.log", "--deadline-ms", "300"
        ),
    }
    try:
        for hook in hooks.values():
            wait_until_serving(hook)
        yield hooks
    finally:
        for hook in hooks.values():
            stop(hook)
        hang.close()
