"""The top-level parser: --version, no command, and that the Dockerfile and compose file only call
commands (and flags) it has."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from service import __version__
from service.cli import build_parser

from .entry import python_m


def test_version() -> None:
    r = python_m("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"ci-sizer {__version__}"


@pytest.mark.parametrize("args", [[], ["token"]], ids=["no-command", "token-without-create"])
def test_no_command_prints_the_help_and_exits_2(args: list[str]) -> None:
    r = python_m(*args)
    assert r.returncode == 2
    assert r.stdout.startswith("usage: ci-sizer ")
    assert "{serve,migrate,token,collect,stage,simulate,backtest,openapi,webhook}" in r.stdout


def _cli_commands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)  # type: ignore[arg-type]


def test_the_commands() -> None:
    assert _cli_commands() == {
        "serve",
        "migrate",
        "token",
        "collect",
        "stage",
        "simulate",
        "backtest",
        "openapi",
        "webhook",
    }


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
    r = python_m(command[0], "--help")
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
