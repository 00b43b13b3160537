"""Find or start a PostgreSQL server for the tests.

Order: ``CI_SIZER_TEST_DATABASE_URL``; testcontainers when a Docker engine answers; a throwaway
cluster made with the local ``initdb``/``pg_ctl`` (on PATH or under ``/usr/lib/postgresql/*/bin``).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


def find_pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        return candidate
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ThrowawayCluster:
    """A PostgreSQL cluster in a temp dir, trust auth on 127.0.0.1, removed on ``stop``."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ci-sizer-pg-")))
    port: int = field(default_factory=free_port)
    user: str | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args,
            check=True,
            capture_output=True,
            text=True,
            user=self.user,
            timeout=120,
        )

    def start(self) -> ThrowawayCluster:
        initdb, pg_ctl = find_pg_bin("initdb"), find_pg_bin("pg_ctl")
        if not initdb or not pg_ctl:
            raise RuntimeError("initdb/pg_ctl not found on PATH or under /usr/lib/postgresql/*/bin")
        if os.geteuid() == 0:  # initdb refuses to run as root
            for candidate in ("postgres", "nobody"):
                try:
                    pwd.getpwnam(candidate)
                except KeyError:
                    continue
                self.user = candidate
                break
            shutil.chown(self.root, user=self.user)
        self._run(
            initdb,
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self.pg_start()
        return self

    def pg_start(self) -> None:
        pg_ctl = find_pg_bin("pg_ctl")
        assert pg_ctl
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run(
            pg_ctl,
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def pg_stop(self) -> None:
        pg_ctl = find_pg_bin("pg_ctl")
        assert pg_ctl
        self._run(pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop")

    def stop(self) -> None:
        try:
            self.pg_stop()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.root, ignore_errors=True)


def docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@dataclass
class PostgresServer:
    url: str
    cluster: ThrowawayCluster | None = None
    container: object | None = None
    origin: str = ""

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        if self.container is not None:
            self.container.stop()  # type: ignore[attr-defined]


def acquire() -> PostgresServer:
    """A PostgreSQL server URL (``postgresql+asyncpg://...``), or raise RuntimeError saying why not."""
    from service.settings import normalize_database_url

    url = os.environ.get("CI_SIZER_TEST_DATABASE_URL")
    if url:
        return PostgresServer(url=normalize_database_url(url), origin="CI_SIZER_TEST_DATABASE_URL")
    reasons = []
    if docker_answers():
        try:
            from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]

            container = PostgresContainer("postgres:16-alpine", driver="asyncpg").start()
            return PostgresServer(
                url=container.get_connection_url(),
                container=container,
                origin="testcontainers",
            )
        except Exception as exc:
            reasons.append(f"testcontainers: {type(exc).__name__}: {exc}")
    else:
        reasons.append("no Docker engine answers")
    try:
        cluster = ThrowawayCluster().start()
        time.sleep(0.2)
        return PostgresServer(url=cluster.url, cluster=cluster, origin="initdb/pg_ctl")
    except Exception as exc:
        detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else exc
        reasons.append(f"throwaway cluster: {type(exc).__name__}: {detail}")
    raise RuntimeError("; ".join(reasons))
