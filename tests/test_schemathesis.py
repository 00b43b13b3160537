"""Schemathesis against the app's own OpenAPI document, on a live server: a bounded number of
examples per operation with a fixed seed (derandomized); no 5xx, and responses conform to the
schema (status codes, content types, bodies, headers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from service.auth import hash_secret
from service.main import create_app
from service.settings import Settings

from .live import LiveServer

#: the CI tier (README): schemathesis generates requests against the whole API for half a minute
pytestmark = pytest.mark.ci

DOCUMENT = create_app(Settings()).openapi()
#: schemathesis 4.32's negative-data generator for this body errors out before any request is sent, on
#: some seeds only ("Cannot generate an array with 1 demanded elements": schemathesis/generation/jsonschema/
#: strategy.py turns a Hypothesis InvalidArgument into InvalidSchema), and which seeds changes with unrelated
#: code. It gets schema-valid data here; its invalid bodies are tests/stages' (each rejected with its field)
POSITIVE_ONLY = {"path": "/api/v1/stages:compute", "method": "POST"}
schema = schemathesis.openapi.from_dict(DOCUMENT).exclude(**POSITIVE_ONLY)
positive = schemathesis.openapi.from_dict(DOCUMENT).include(**POSITIVE_ONLY)
positive.config.generation.update(modes=[GenerationMode.POSITIVE])
for document in (schema, positive):
    # a request line and headers past --max-header-bytes are refused by the connection with a 431, before
    # any route (service/connections.py; every operation declares it)
    rejection = document.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "431"]


SECRET = "cis_fuzz-secret"


@schema.auth()
@positive.auth()
class Bearer:
    """The token for every call, through the document's bearer scheme (so schemathesis knows the
    calls are authenticated, and still checks that calls without it are refused)."""

    def get(self, case: schemathesis.Case, ctx: schemathesis.AuthContext) -> str:
        return SECRET

    def set(self, case: schemathesis.Case, data: str, ctx: schemathesis.AuthContext) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # with a tokens file, as deployed: the document's bearer scheme is then checked too (a request
    # without the header, or with a wrong one, must be a 401 whatever else is wrong with it)
    directory: Path = tmp_path_factory.mktemp("fuzz")
    tokens = directory / "tokens.toml"
    tokens.write_text(f'[[tokens]]\nname = "fuzz"\nsha256 = "{hash_secret(SECRET)}"\nroles = ["ingest", "admin"]\n')
    with LiveServer(
        f"sqlite:///{directory}/fuzz.db",
        "--log-level",
        "warning",
        "--tokens-file",
        str(tokens),
        log=directory / "serve.log",
    ) as server:
        yield server


@schema.parametrize()
@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: schemathesis.Case, live: LiveServer) -> None:
    # Every other default check runs. "Schema-valid data is accepted" cannot hold here: rules such
    # as "exactly one CPU source per container" or "p50 <= ... <= peak" (I1) span several fields
    # and are not expressible in JSON Schema, so such bodies are rightly answered 422.
    case.call_and_validate(base_url=live.url, excluded_checks=[positive_data_acceptance])


@positive.parametrize()
@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_stage_computation_conforms_to_its_schema(case: schemathesis.Case, live: LiveServer) -> None:
    case.call_and_validate(base_url=live.url, excluded_checks=[positive_data_acceptance])
