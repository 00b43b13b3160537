"""``python -m service CMD`` and the installed ``ci-sizer CMD`` behave the same, for every command: the
same exit code and the same stdout, for ``--help`` and for one real invocation each.

The real invocations run ``python -m service`` end to end in a new process, so a mistake at module level
fails here: the ``if __name__ == "__main__"`` guard once sat above the stage, simulate and backtest
functions, and ``python -m service stage|simulate|backtest`` died with a NameError while the tests, which
called ``main()`` in process, passed."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from service.auth import load_tokens

from ..helpers import container, post_runs, run, sqlite_with
from ..live import LiveServer, free_port
from .entry import PYTHON_M, SCRIPT, console_script, python_m

#: the CI tier (README): every command runs end to end in new processes, twice
pytestmark = pytest.mark.ci

COMMANDS = [
    ["serve"],
    ["migrate"],
    ["token", "create"],
    ["collect"],
    ["stage"],
    ["simulate"],
    ["backtest"],
    ["openapi"],
    ["webhook", "serve"],
    ["webhook", "certs"],
]

CP = subprocess.CompletedProcess[str]


def both(*args: str, cwd: Path | None = None) -> tuple[CP, CP]:
    return python_m(*args, cwd=cwd), console_script(*args, cwd=cwd)


def assert_same(a: CP, b: CP) -> None:
    assert (a.returncode, a.stdout) == (b.returncode, b.stdout), (a.stderr, b.stderr)


def test_the_script_is_the_one_pyproject_declares(repo_root: Path) -> None:
    scripts = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"ci-sizer": "service.cli:main"}
    assert SCRIPT.is_file(), f"{SCRIPT} is not installed: pip install -e ."
    assert "from service.cli import main" in SCRIPT.read_text()


def test_every_command_is_checked_here() -> None:
    from service.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert {c[0] for c in COMMANDS} == set(sub.choices)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_is_the_same(command: list[str]) -> None:
    a, b = both(*command, "--help")
    assert a.returncode == 0, a.stderr
    assert a.stdout.startswith(f"usage: ci-sizer {' '.join(command)} ")
    assert_same(a, b)


@pytest.mark.parametrize("args", [[], ["--version"], ["token"], ["stage"], ["no-such-command"]], ids=repr)
def test_no_command_version_and_usage_errors_are_the_same(args: list[str]) -> None:
    a, b = both(*args)
    assert_same(a, b)
    assert a.stderr == b.stderr


class ScriptServer(LiveServer):
    """The same server, started with the installed script."""

    def command(self) -> list[str]:
        cmd = super().command()
        assert tuple(cmd[: len(PYTHON_M)]) == PYTHON_M
        return [str(SCRIPT), *cmd[len(PYTHON_M) :]]


def test_serve_is_the_same(tmp_path: Path) -> None:
    answers, codes = [], []
    for kind in (LiveServer, ScriptServer):
        db = tmp_path / f"{kind.__name__}.db"
        server = kind(f"sqlite:///{db}")
        with server:
            answers.append(
                [
                    httpx.get(f"{server.url}{path}", timeout=10).json()
                    for path in ("/healthz", "/readyz", "/openapi.json")
                ]
            )
        assert server.proc is not None
        codes.append(server.proc.returncode)
        assert db.stat().st_size > 0  # migrated before serving
    assert answers[0] == answers[1]
    assert answers[0][:2] == [{"status": "ok"}, {"status": "ready"}]
    # stopped with SIGTERM: uvicorn shuts down, then re-raises the signal it caught (both the same way)
    assert codes[0] == codes[1] == -signal.SIGTERM


def _schema(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name").fetchall()
        version = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    return [*rows, *(("alembic_version", v) for (v,) in version)]


def test_migrate_is_the_same(tmp_path: Path) -> None:
    a = python_m("migrate", "--database-url", f"sqlite:///{tmp_path / 'a.db'}")
    b = console_script("migrate", "--database-url", f"sqlite:///{tmp_path / 'b.db'}")
    assert a.returncode == 0, a.stderr
    assert_same(a, b)
    schema = _schema(tmp_path / "a.db")
    assert any(name == "alembic_version" for name, _ in schema)
    assert schema == _schema(tmp_path / "b.db")


@pytest.mark.parametrize("fmt", ["toml", "yaml"])
def test_token_create_is_the_same_shape(fmt: str, tmp_path: Path) -> None:
    args = ("token", "create", "runner", "--role", "ingest", "--org", "acme", "--format", fmt)
    a, b = both(*args)
    assert a.returncode == 0, a.stderr

    def shape(out: str) -> str:
        return re.sub(r"[0-9a-f]{64}", "<sha256>", re.sub(r"cis_\S+", "<secret>", out))

    assert (a.returncode, shape(a.stdout)) == (b.returncode, shape(b.stdout))
    assert a.stdout != b.stdout  # a new secret each time
    for i, done in enumerate((a, b)):
        secret = next(line for line in done.stdout.splitlines() if line.startswith("cis_"))
        path = tmp_path / f"tokens{i}.{fmt}"
        path.write_text(done.stdout.split(f"({fmt.upper()}):\n", 1)[1])
        principal = load_tokens(path).authenticate(secret)
        assert principal is not None
        assert principal.name == "runner"


def test_collect_is_the_same(tmp_path: Path) -> None:
    identity = ("--org", "acme", "--repo", "web", "--workflow", "ci", "--job", "build", "--run-id", "r1")
    sizer = f"http://127.0.0.1:{free_port()}"  # nothing listens: the run is spooled
    done = []
    for name, invoke in (("a", python_m), ("b", console_script)):
        done.append(
            invoke(
                "collect",
                *identity,
                "--url",
                sizer,
                "--retries",
                "0",
                "--interval",
                "0.1",
                "--spool-dir",
                str(tmp_path / name),
                "--",
                sys.executable,
                "-c",
                "print('built'); raise SystemExit(3)",
            )
        )
    a, b = done
    assert a.returncode == 3, a.stderr  # the command's exit code, not the sizer's trouble
    assert a.stdout == "built\n"
    assert_same(a, b)
    spooled = [[json.loads(p.read_text()) for p in (tmp_path / name).glob("run-*.json")] for name in "ab"]
    assert [len(s) for s in spooled] == [1, 1]
    keys = ("org", "repo", "workflow", "job", "run_id")
    assert [{k: s[0][k] for k in keys} for s in spooled] == [dict(zip(keys, identity[1::2], strict=True))] * 2
    # and an error is the same line
    a, b = both("collect", "--flush", str(tmp_path / "nope"), "--url", sizer)
    assert a.returncode == 2
    assert_same(a, b)
    assert a.stderr == b.stderr == f"ci-sizer: error: --flush {tmp_path / 'nope'}: no such directory\n"


STAGE = (
    "stage:\n"
    "  - {name: db, background: true, cpu: 3, memory: 900Mi}\n"
    "  - name: tests\n"
    "    parallel: [{name: unit}, {name: lint}]\n"
    "  - name: package\n"
)


@pytest.mark.parametrize("output", [[], ["--json"]], ids=["table", "json"])
def test_stage_is_the_same(output: list[str], tmp_path: Path) -> None:
    stage = tmp_path / "stage.yaml"
    stage.write_text(STAGE)
    a, b = both("stage", str(stage), *output)
    assert a.returncode == 0, a.stderr
    assert_same(a, b)
    if output:
        assert json.loads(a.stdout)["total_with_background"]["cpu"] == "3900m"  # V6
    else:
        assert "stage with background: 3900m CPU, 2000Mi memory" in a.stdout


def test_simulate_is_the_same(tmp_path: Path) -> None:
    a, b = both("simulate", "--days", "0.02", "--builds-per-day", "3000", "--json", cwd=tmp_path)
    assert a.returncode == 0, a.stderr
    assert_same(a, b)
    assert json.loads(a.stdout)["trace"]["synthetic"]["days"] == 0.02


def test_backtest_is_the_same(tmp_path: Path) -> None:
    async def seed(client: httpx.AsyncClient) -> None:
        await post_runs(client, *(run(n, container(cpu=100.0 * n)) for n in range(1, 7)))

    url, _ = sqlite_with(tmp_path / "bt.db", seed)
    a, b = both("backtest", "--database-url", url, "--json")
    assert a.returncode == 0, a.stderr
    assert_same(a, b)
    assert json.loads(a.stdout)["policies"]


def test_openapi_is_the_same(repo_root: Path, tmp_path: Path) -> None:
    a, b = both("openapi")
    assert a.returncode == 0, a.stderr
    assert_same(a, b)
    assert a.stdout == (repo_root / "openapi" / "openapi.json").read_text()
    c = console_script("openapi", "--output", str(tmp_path / "o.json"))
    assert (c.returncode, c.stdout) == (0, "")
    assert (tmp_path / "o.json").read_text() == a.stdout
