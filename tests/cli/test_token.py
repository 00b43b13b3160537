"""``ci-sizer token create``."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.auth import load_tokens
from service.cli import main


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


def test_a_role_outside_the_choices_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "x", "--role", "root"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ci-sizer: error: argument --role: invalid choice: 'root'")
    assert len(err.strip().splitlines()) == 1
