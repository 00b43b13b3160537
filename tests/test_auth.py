"""Access control: every endpoint x {no token, wrong token, each role, wrong org}, on both databases."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.auth import hash_secret, load_tokens
from service.main import ExposureError, check_exposure
from service.settings import Settings

from .helpers import JOB, run, sizing_path

SECRETS = {
    "ingest": "cis_ingest-secret",
    "read": "cis_read-secret",
    "admin": "cis_admin-secret",
    "other-org": "cis_other-org-secret",
}


def write_tokens(path: Path) -> Path:
    entries = [
        ("ingester", SECRETS["ingest"], ["ingest"], None),
        ("reader", SECRETS["read"], ["read"], ["acme"]),
        ("operator", SECRETS["admin"], ["admin"], None),
        ("elsewhere", SECRETS["other-org"], ["ingest", "read", "admin"], ["globex"]),
    ]
    lines = []
    for name, secret, roles, orgs in entries:
        lines.append("[[tokens]]")
        lines.append(f'name = "{name}"')
        lines.append(f'sha256 = "{hash_secret(secret)}"')
        lines.append("roles = [" + ", ".join(f'"{r}"' for r in roles) + "]")
        if orgs is not None:
            lines.append("orgs = [" + ", ".join(f'"{o}"' for o in orgs) + "]")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
async def secured(make_client: Any, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client(tokens_file=write_tokens(tmp_path / "tokens.toml")) as client:
        yield client


OVR = "/api/v1/sizing/overrides/acme/web"
# endpoint -> (method, path, body)
ENDPOINTS: dict[str, tuple[str, str, Any]] = {
    "post run": ("POST", "/api/v1/runs", run(1)),
    "post batch": ("POST", "/api/v1/runs:batch", {"runs": [run(2)]}),
    "get sizing": ("GET", sizing_path(), None),
    "list overrides": ("GET", "/api/v1/sizing/overrides?org=acme", None),
    "get override": ("GET", OVR, None),
    "put override": ("PUT", OVR, {"memory_limit": "2Gi"}),
    "delete override": ("DELETE", OVR, None),
    "healthz": ("GET", "/healthz", None),
    "readyz": ("GET", "/readyz", None),
    "info": ("GET", "/api/v1/info", None),
    "compute stage": (
        "POST",
        "/api/v1/stages:compute",
        {"stage": [{"job": {**JOB}}], "options": {"use_recommendations": True}},
    ),
    "advise placement": (
        "POST",
        "/api/v1/placement:advise",
        {
            "nodes": [{"name": "n", "allocatable": {"cpu": 4, "memory": "8Gi"}}],
            "pod": {"job": {**JOB}},
            "profile": "spread",
        },
    ),
    "ballast": ("GET", "/api/v1/ballast?org=acme", None),
    "simulate history": (
        "POST",
        "/api/v1/simulations",
        {
            "history": {"org": "acme", "since": "2026-11-01T00:00:00Z", "until": "2026-11-02T00:00:00Z"},
            "pool": {"shapes": [{"name": "m", "cpu": 8, "memory": "32Gi"}]},
        },
    ),
    "backtest": ("POST", "/api/v1/backtests", {"org": "acme"}),
}
CALLERS = ["none", "wrong", "ingest", "read", "admin", "other-org"]
# expected status per endpoint, in CALLERS order
MATRIX: dict[str, list[int]] = {
    "post run": [401, 401, 201, 403, 403, 403],
    "post batch": [
        401,
        401,
        200,
        403,
        403,
        200,
    ],  # per-run org check: see the test below
    "get sizing": [401, 401, 403, 200, 200, 403],
    "list overrides": [401, 401, 403, 200, 200, 403],
    "get override": [401, 401, 403, 404, 404, 403],
    "put override": [401, 401, 403, 403, 201, 403],
    "delete override": [401, 401, 403, 403, 404, 403],
    "healthz": [200] * 6,
    "readyz": [200] * 6,
    "info": [200] * 6,
    "compute stage": [401, 401, 403, 200, 200, 403],  # the referenced job's org is checked
    "advise placement": [401, 401, 403, 200, 200, 403],
    "ballast": [401, 401, 403, 200, 200, 403],
    "simulate history": [401, 401, 403, 202, 202, 403],
    # past the token checks, a backtest of an org with no stored run is refused (issue 34): 422, never a 202
    "backtest": [401, 401, 403, 422, 422, 403],
}


def headers_for(caller: str) -> dict[str, str]:
    if caller == "none":
        return {}
    if caller == "wrong":
        return {"Authorization": "Bearer cis_not-a-real-token"}
    return {"Authorization": f"Bearer {SECRETS[caller]}"}


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
async def test_access_matrix(secured: httpx.AsyncClient, endpoint: str, caller: str) -> None:
    method, path, body = ENDPOINTS[endpoint]
    r = await secured.request(method, path, json=body, headers=headers_for(caller))
    expected = MATRIX[endpoint][CALLERS.index(caller)]
    assert r.status_code == expected, (endpoint, caller, r.text)
    if expected == 401:
        assert r.headers["WWW-Authenticate"].startswith('Bearer realm="ci-sizer"')
        assert r.headers["content-type"] == "application/problem+json"
    if expected == 403:
        assert r.headers["content-type"] == "application/problem+json"


async def test_batch_rejects_runs_of_other_orgs_one_by_one(
    secured: httpx.AsyncClient,
) -> None:
    other = {**run(3), "org": "globex"}
    r = await secured.post(
        "/api/v1/runs:batch",
        json={"runs": [run(2), other]},
        headers=headers_for("other-org"),
    )
    assert [x["status"] for x in r.json()["results"]] == [403, 201]


async def test_limited_token_lists_only_its_orgs(secured: httpx.AsyncClient) -> None:
    admin = headers_for("admin")
    for org in ("acme", "globex"):
        assert (
            await secured.put(
                f"/api/v1/sizing/overrides/{org}",
                json={"cpu_limit": "1"},
                headers=admin,
            )
        ).status_code == 201
    r = await secured.get("/api/v1/sizing/overrides", headers=headers_for("read"))
    assert [o["org"] for o in r.json()["items"]] == ["acme"]
    r = await secured.get("/api/v1/sizing/overrides", headers=admin)
    assert sorted(o["org"] for o in r.json()["items"]) == ["acme", "globex"]


async def test_updated_by_is_the_token_name(secured: httpx.AsyncClient) -> None:
    r = await secured.put(OVR, json={"memory_limit": "2Gi"}, headers=headers_for("admin"))
    assert r.json()["updated_by"] == "operator"


@pytest.mark.parametrize("header", ["Basic abc", "Bearer", "Bearer   ", "cis_admin-secret"])
async def test_malformed_authorization_is_401(secured: httpx.AsyncClient, header: str) -> None:
    r = await secured.get(sizing_path(), headers={"Authorization": header})
    assert r.status_code == 401


async def test_secrets_never_logged(secured: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await secured.get(sizing_path(), headers=headers_for("read"))
    await secured.get(sizing_path(), headers={"Authorization": "Bearer cis_guess"})
    for secret in [*SECRETS.values(), "cis_guess"]:
        assert secret not in caplog.text


def test_open_mode_only_on_loopback(tmp_path: Path) -> None:
    no_tokens = load_tokens(None)
    check_exposure(Settings(host="127.0.0.1"), no_tokens)
    check_exposure(Settings(host="::1"), no_tokens)
    check_exposure(Settings(host="localhost"), no_tokens)
    with pytest.raises(ExposureError, match="--allow-anonymous"):
        check_exposure(Settings(host="0.0.0.0"), no_tokens)
    check_exposure(Settings(host="0.0.0.0", allow_anonymous=True), no_tokens)
    check_exposure(Settings(host="0.0.0.0"), load_tokens(write_tokens(tmp_path / "t.toml")))


async def test_startup_log_says_open_mode(make_client: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ci_sizer")
    async with make_client():
        pass
    assert "open access" in caplog.text
    assert "core backend=" in caplog.text


@pytest.mark.parametrize(
    ("content", "suffix", "needle"),
    [
        ("tokens = [{name = 'x'}]", ".toml", "sha256"),
        ("tokens:\n  - {name: x, sha256: zz, roles: [read]}", ".yaml", "sha256"),
        ("not [valid toml", ".toml", "does not parse"),
        (
            "tokens:\n  - {name: x, sha256: " + "a" * 64 + ", roles: [root]}",
            ".yaml",
            "roles",
        ),
    ],
)
def test_bad_tokens_file_is_a_clear_error(tmp_path: Path, content: str, suffix: str, needle: str) -> None:
    from service.auth import TokensFileError

    path = tmp_path / f"tokens{suffix}"
    path.write_text(content)
    with pytest.raises(TokensFileError, match=needle):
        load_tokens(path)


# endpoint -> (method, path, body): each request is invalid in a path segment, a query parameter or
# its body; the caller must still learn first that it is not authenticated (401), or lacks the role
# (403), before anything about its input (422) is validated or read
INVALID: dict[str, tuple[str, str, Any]] = {
    "post run, bad body": ("POST", "/api/v1/runs", {"org": ""}),
    "post run, malformed json": ("POST", "/api/v1/runs", b"{not json"),
    "post batch, bad body": ("POST", "/api/v1/runs:batch", {"runs": []}),
    "get sizing, bad segment": ("GET", "/api/v1/sizing/acme/web/ci%01/build", None),
    "get sizing, bad query": ("GET", sizing_path() + "?runs=0", None),
    "list overrides, bad query": ("GET", "/api/v1/sizing/overrides?limit=0", None),
    "list overrides, bad cursor": ("GET", "/api/v1/sizing/overrides?cursor=garbage!", None),
    "get override, bad segment": ("GET", "/api/v1/sizing/overrides/ac%E2%80%AEme", None),
    "put override, bad segment": ("PUT", "/api/v1/sizing/overrides/ac%01me", {"cpu_limit": "1"}),
    "put override, bad body": ("PUT", OVR, {"cpu_limit": "-1"}),
    "delete override, bad segment": ("DELETE", "/api/v1/sizing/overrides/ac%FFme", None),
    "compute stage, bad body": ("POST", "/api/v1/stages:compute", {"stage": []}),
    "advise placement, bad body": ("POST", "/api/v1/placement:advise", {"nodes": []}),
    "ballast, bad query": ("GET", "/api/v1/ballast", None),
    "simulate, bad body": ("POST", "/api/v1/simulations", {"pool": {}}),
    "backtest, bad body": ("POST", "/api/v1/backtests", {"runs": [0]}),
}
# the role each needs lacks from this caller
WRONG_ROLE = {
    name: "read" if method != "GET" and "override" in name else "ingest" for name, (method, _, _) in INVALID.items()
}
WRONG_ROLE.update({"post run, bad body": "read", "post run, malformed json": "read", "post batch, bad body": "read"})


async def _send(
    client: httpx.AsyncClient, method: str, path: str, body: Any, headers: dict[str, str]
) -> httpx.Response:
    if isinstance(body, bytes):
        headers = {**headers, "content-type": "application/json"}
        return await client.request(method, path, content=body, headers=headers)
    return await client.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize("endpoint", list(INVALID))
async def test_authentication_comes_before_validation(secured: httpx.AsyncClient, endpoint: str) -> None:
    method, path, body = INVALID[endpoint]
    for caller in ("none", "wrong"):
        r = await _send(secured, method, path, body, headers_for(caller))
        assert r.status_code == 401, (endpoint, caller, r.text)
        assert r.headers["WWW-Authenticate"].startswith('Bearer realm="ci-sizer"')
    r = await _send(secured, method, path, body, headers_for(WRONG_ROLE[endpoint]))
    assert r.status_code == 403, (endpoint, r.text)
    r = await _send(secured, method, path, body, headers_for("admin" if WRONG_ROLE[endpoint] == "read" else "read"))
    if endpoint.startswith(("post run", "post batch")):
        r = await _send(secured, method, path, body, headers_for("ingest"))
    assert r.status_code == 422, (endpoint, r.text)  # with the right token: the input is judged


def test_openapi_declares_the_bearer_scheme(tmp_path: Path) -> None:
    from service.main import create_app

    doc = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}")).openapi()
    schemes = doc["components"]["securitySchemes"]
    assert len(schemes) == 1
    (name, scheme), *_ = schemes.items()
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    guarded = {p: ops for p, ops in doc["paths"].items() if p.startswith("/api/v1/") and p != "/api/v1/info"}
    assert guarded
    for path, ops in guarded.items():
        for method, op in ops.items():
            assert op.get("security") == [{name: []}], (method, path)
            assert "401" in op["responses"], (method, path)
    for path in ("/healthz", "/readyz", "/api/v1/info"):
        assert "security" not in doc["paths"][path]["get"], path
