"""The ``ci-sizer`` command, and that the Dockerfile and compose file only call commands it has."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from service import __version__
from service.__main__ import build_parser, main
from service.auth import load_tokens


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_version() -> None:
    r = run_cli("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"ci-sizer {__version__}"


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["serve", "--port", "70000"], {}, "--port"),
        (["serve", "--port", "abc"], {}, "--port"),
        (["serve", "--cpu-sizing-mode", "sometimes"], {}, "--cpu-sizing-mode"),
        (["serve", "--memory-qos", "besteffort"], {}, "--memory-qos"),
        (["serve", "--max-memory", "1K"], {}, "--max-memory"),
        (["serve", "--max-memory", "0"], {}, "--max-memory"),
        (["serve", "--log-level", "loud"], {}, "--log-level"),
        (["serve", "--database-url", "mysql://x"], {}, "--database-url"),
        (["serve"], {"CI_SIZER_PORT": "0"}, "CI_SIZER_PORT"),
        (["serve", "--host", "0.0.0.0"], {}, "--allow-anonymous"),
        (["serve", "--no-such-flag"], {}, "unrecognized"),
    ],
)
def test_bad_values_exit_non_zero_with_one_clear_line(args: list[str], env: dict[str, str], needle: str) -> None:
    r = run_cli(*args, env=env)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ci-sizer: error:")
    assert needle in lines[0]
    assert "Traceback" not in r.stderr


def test_migrate_creates_the_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    r = run_cli("migrate", "--database-url", f"sqlite:///{db}")
    assert r.returncode == 0, r.stderr
    assert db.is_file()
    assert db.stat().st_size > 0


def test_migrate_unreachable_database_is_one_line(tmp_path: Path) -> None:
    r = run_cli("migrate", "--database-url", "postgresql://nobody:secret-pw@127.0.0.1:1/x")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("ci-sizer: error: migration failed")
    assert "secret-pw" not in r.stderr  # the password never reaches the output


@pytest.mark.parametrize("fmt", ["toml", "yaml"])
def test_token_create_prints_a_secret_and_a_working_entry(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "token",
                "create",
                "runner",
                "--role",
                "ingest",
                "--role",
                "read",
                "--org",
                "acme",
                "--format",
                fmt,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    secret = next(line for line in out.splitlines() if line.startswith("cis_"))
    entry = out.split(f"({fmt.upper()}):\n", 1)[1]
    path = tmp_path / f"tokens.{fmt}"
    path.write_text(entry)
    principal = load_tokens(path).authenticate(secret)
    assert principal is not None
    assert principal.name == "runner"
    assert principal.roles == {"ingest", "read"}
    assert principal.orgs == {"acme"}
    assert secret not in entry  # only the hash goes into the file


def _cli_commands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)  # type: ignore[arg-type]


def test_dockerfile_entry_command_exists_in_cli(repo_root: Path) -> None:
    text = (repo_root / "Dockerfile").read_text()
    entry = next(line for line in text.splitlines() if line.startswith("ENTRYPOINT"))
    cmd = next(line for line in text.splitlines() if line.startswith("CMD"))
    assert '"ci-sizer"' in entry
    subcommand = yaml.safe_load(cmd.removeprefix("CMD").strip())[0]
    assert subcommand in _cli_commands()


def test_compose_service_command_exists_in_cli(repo_root: Path) -> None:
    compose = yaml.safe_load((repo_root / "docker-compose.yml").read_text())
    service = compose["services"]["ci-sizer"]
    command = service["command"]
    assert command[0] in _cli_commands()
    # every flag given there is one the subcommand accepts
    r = run_cli(command[0], "--help")
    for flag in (c for c in command[1:] if c.startswith("--")):
        assert flag in r.stdout
    assert service["environment"]["CI_SIZER_DATABASE_URL"].startswith("postgresql://")
    assert "postgres" in compose["services"]


def test_compose_config_accepts_the_file(repo_root: Path) -> None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        cmd = ["docker", "compose", "config", "-q"]
    elif shutil.which("docker-compose"):
        cmd = ["docker-compose", "config", "-q"]
    else:
        pytest.skip("no docker compose CLI on this machine")
    r = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
