"""``openapi/openapi.json`` is generated from the app; this fails when it drifts."""

from __future__ import annotations

import json
from pathlib import Path

from service.main import create_app
from service.settings import Settings


def test_openapi_document_matches_the_app(repo_root: Path) -> None:
    committed = json.loads((repo_root / "openapi" / "openapi.json").read_text())
    live = create_app(Settings()).openapi()
    assert committed == json.loads(json.dumps(live)), "regenerate with: ci-sizer openapi --output openapi/openapi.json"


def test_every_error_is_problem_json() -> None:
    doc = create_app(Settings()).openapi()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, resp in op.get("responses", {}).items():
                if status.startswith(("4", "5")) and status != "422":
                    assert "application/problem+json" in resp.get("content", {}), (
                        method,
                        path,
                        status,
                    )
