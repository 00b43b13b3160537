"""docs/overrides.md's operator's session is replayed against the service (issue 34): it posts the
README's example run, and every answer it shows is what the service answers now."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from service.auth import hash_secret

SECRETS = {"$ADMIN": "cis_docs-admin", "$RUNNER": "cis_docs-runner"}
#: what differs from one run to the next: times of writes and the ETag over them
VOLATILE = {"created_at", "updated_at", "etag"}


def _tokens(path: Path) -> Path:
    path.write_text(
        f'[[tokens]]\nname = "ops"\nsha256 = "{hash_secret(SECRETS["$ADMIN"])}"\nroles = ["admin"]\n\n'
        f'[[tokens]]\nname = "runner"\nsha256 = "{hash_secret(SECRETS["$RUNNER"])}"\n'
        'roles = ["ingest", "read"]\norgs = ["acme"]\n'
    )
    return path


def _session(repo_root: Path) -> list[tuple[str, list[str]]]:
    """The session's commands, each with the lines it printed."""
    text = (repo_root / "docs" / "overrides.md").read_text()
    block = text[text.index("## An operator's session") :]
    block = block[block.index("```\n") + 4 :]
    block = block[: block.index("```")]
    entries: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            entries.append((line[2:], []))
        elif entries and line.strip():
            entries[-1][1].append(line)
    return entries


def _readme_run(repo_root: Path) -> dict[str, Any]:
    """The body of the README's example POST."""
    text = (repo_root / "README.md").read_text()
    found = re.search(r"curl -s -XPOST localhost:8080/api/v1/runs .*?-d '(\{.*?\})'", text, re.S)
    assert found is not None
    body: dict[str, Any] = json.loads(found.group(1))
    return body


def _jq(value: Any, path: str) -> Any:
    for part in re.findall(r"\.(\w+)|\[(\d+)\]", path):
        value = value[part[0]] if part[0] else value[int(part[1])]
    return value


def _values(lines: list[str]) -> list[Any]:
    """The JSON texts jq printed, one after the other."""
    text, out, decoder = "\n".join(lines), [], json.JSONDecoder()
    at = 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        value, at = decoder.raw_decode(text, at)
        out.append(value)
    return out


def _strip(value: Any) -> Any:
    return {k: v for k, v in value.items() if k not in VOLATILE} if isinstance(value, dict) else value


async def test_the_operators_session_is_what_the_service_answers(
    make_client: Any, tmp_path: Path, repo_root: Path
) -> None:
    session = [(c, out) for c, out in _session(repo_root) if c.startswith("curl ")]
    assert session, "no curl command in the session"
    first = shlex.split(session[0][0])
    assert "-XPOST" in first
    assert json.loads(first[first.index("-d") + 1]) == _readme_run(repo_root)  # the README's example data
    async with make_client(tokens_file=_tokens(tmp_path / "tokens.toml")) as client:
        for command, printed in session:
            curl, _, jq = command.partition(" | jq ")
            argv = shlex.split(curl.split("   #")[0])
            method = next((a[2:] for a in argv if a.startswith("-X")), "GET")
            url = next(a for a in argv if a.startswith("localhost:8080"))[len("localhost:8080") :]
            token = next(s for var, s in SECRETS.items() if f"Bearer {var}" in curl)
            body = json.loads(argv[argv.index("-d") + 1]) if "-d" in argv else None
            r = await client.request(method, url, json=body, headers={"Authorization": f"Bearer {token}"})
            if jq:
                paths = [p.strip() for p in shlex.split(jq)[-1].split(",")]
                assert _values(printed) == [_jq(r.json(), p) for p in paths], command
            elif "%{http_code}" in curl:
                assert printed == [str(r.status_code)], command
            else:
                assert printed[-1] == f"(HTTP {r.status_code})", command
                assert _strip(json.loads(printed[0])) == _strip(r.json()), command
