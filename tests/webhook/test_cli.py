"""``ci-sizer webhook`` as a user runs it (``python -m service`` and the installed script): ``certs``
writes what the self-signed overlay reads, and ``serve`` refuses, in one line, to start without what it
needs (a sizer URL, its certificate, a real token, a valid identity file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli import main

from ..cli.entry import console_script, python_m
from .conftest import make_certs


def test_certs_from_both_entry_points(tmp_path: Path) -> None:
    a = python_m("webhook", "certs", "--output-dir", str(tmp_path / "a"), "--namespace", "ci-tools")
    b = console_script("webhook", "certs", "--output-dir", str(tmp_path / "b"), "--namespace", "ci-tools")
    assert (a.returncode, b.returncode) == (0, 0), (a.stderr, b.stderr)
    assert a.stdout.replace(str(tmp_path / "a"), "D") == b.stdout.replace(str(tmp_path / "b"), "D")
    assert "ci-sizer-webhook.ci-tools.svc" in a.stdout
    for d in ("a", "b"):
        assert sorted(p.name for p in (tmp_path / d).iterdir()) == ["ca-bundle.yaml", "ca.crt", "tls.crt", "tls.key"]
    assert (tmp_path / "a" / "ca.crt").read_bytes() != (tmp_path / "b" / "ca.crt").read_bytes()  # a new CA each time


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.mark.parametrize(
    ("args", "token", "identity", "message"),
    [
        ([], None, None, "--sizer-url"),
        (["--sizer-url", "ci-sizer:8080"], None, None, "--sizer-url"),
        (["--sizer-url", "http://ci-sizer:8080", "--tls-cert-file", "/nonexistent"], None, None, "--tls-cert-file"),
        (
            ["--sizer-url", "http://ci-sizer:8080"],
            "REPLACE-ME: the secret printed by ci-sizer token create",
            None,
            "no ci-sizer token",
        ),
        (["--sizer-url", "http://ci-sizer:8080", "--deadline-ms", "30000"], None, None, "--deadline-ms"),
        (["--sizer-url", "http://ci-sizer:8080"], None, "identities: [{name: x}]", "identity file"),
    ],
)
def test_serve_refuses_to_start_without_what_it_needs(
    certs: Path,
    tmp_path: Path,
    args: list[str],
    token: str | None,
    identity: str | None,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    extra = list(args)
    if "--tls-cert-file" not in extra:
        extra += ["--tls-cert-file", str(certs / "tls.crt")]
    extra += ["--tls-key-file", str(certs / "tls.key")]
    if token is not None:
        (tmp_path / "token").write_text(token)
        extra += ["--token-file", str(tmp_path / "token")]
    if identity is not None:
        (tmp_path / "identity.yaml").write_text(identity)
        extra += ["--identity-file", str(tmp_path / "identity.yaml")]
    monkeypatch.delenv("CI_SIZER_WEBHOOK_SIZER_URL", raising=False)
    assert main(["webhook", "serve", *extra]) == 2  # each refusal comes before anything is served
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("ci-sizer: error: ")
    assert message in line


def test_a_placeholder_token_stops_the_process(certs: Path, tmp_path: Path) -> None:
    # as the Deployment runs it with the Secret as shipped
    (tmp_path / "token").write_text("REPLACE-ME: the secret printed by ci-sizer token create")
    env = {
        "CI_SIZER_WEBHOOK_SIZER_URL": "http://ci-sizer:8080",
        "CI_SIZER_WEBHOOK_TOKEN_FILE": str(tmp_path / "token"),
        "CI_SIZER_WEBHOOK_TLS_CERT_FILE": str(certs / "tls.crt"),
        "CI_SIZER_WEBHOOK_TLS_KEY_FILE": str(certs / "tls.key"),
    }
    out = python_m("webhook", "serve", env=env)
    assert out.returncode == 2
    assert "holds no ci-sizer token" in out.stderr
