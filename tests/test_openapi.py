"""``openapi/openapi.json`` is generated from the app; this fails when it drifts."""

from __future__ import annotations

import json
from pathlib import Path

from service.main import create_app
from service.routers import app_routes
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


def test_the_apps_of_one_process_share_their_routes(tmp_path: Path) -> None:
    # service/routers.py: FastAPI builds an included router's routes on an app's first request, for each
    # app; create_app's apps include the same objects, so a process builds them once (the suite makes an
    # app per test), and each app still serves the same paths, in the same order, with its own state
    one = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'one.db'}"))
    two = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'two.db'}"))
    shared = [r for r in one.routes if any(r is s for s in two.routes)]
    assert len(shared) == 2  # the API and the operator's page, each included once per process
    assert {id(r) for r in shared} == {id(r) for r in app_routes()}
    assert [getattr(r, "path", None) for r in one.routes] == [getattr(r, "path", None) for r in two.routes]
    assert one.state.answers is not two.state.answers
