"""Bearer-token access control.

Tokens live in ``CI_SIZER_TOKENS_FILE`` (TOML or YAML): a list ``tokens`` of
``{name, sha256, roles, orgs?}``. Only the SHA-256 of each secret is stored; a presented secret is
hashed and compared in constant time against every entry. Secrets never reach a log.

Roles: ``ingest`` (POST runs), ``read`` (GET sizing and overrides), ``admin`` (override writes;
implies ``read``). A token with ``orgs`` may only touch those orgs.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from fastapi import Depends, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from service.errors import Forbidden, Unauthorized
from service.settings import read_config_file

Role = Literal["ingest", "read", "admin"]
ROLES: tuple[Role, ...] = ("ingest", "read", "admin")
_IMPLIED: dict[str, frozenset[str]] = {
    "ingest": frozenset({"ingest"}),
    "read": frozenset({"read"}),
    "admin": frozenset({"admin", "read"}),
}
SECRET_PREFIX = "cis_"
_CHALLENGE = 'Bearer realm="ci-sizer"'


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    roles: list[Role] = Field(min_length=1)
    orgs: list[str] | None = None


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenEntry] = Field(default_factory=list)


class TokensFileError(ValueError):
    """The tokens file is missing or malformed (the message never contains a secret)."""


@dataclass(frozen=True)
class Principal:
    name: str
    roles: frozenset[str]
    orgs: frozenset[str] | None = None  # None: every org
    anonymous: bool = False

    def may_access_org(self, org: str) -> bool:
        return self.orgs is None or org in self.orgs

    def ensure_org(self, org: str) -> None:
        if not self.may_access_org(org):
            raise Forbidden(f"token {self.name!r} may not access org {org!r}")


ANONYMOUS = Principal(name="anonymous", roles=frozenset(ROLES), anonymous=True)


@dataclass
class TokenStore:
    entries: list[tuple[bytes, Principal]] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return bool(self.entries)

    def authenticate(self, secret: str) -> Principal | None:
        digest = hashlib.sha256(secret.encode()).digest()
        found: Principal | None = None
        for (
            expected,
            principal,
        ) in self.entries:  # no early exit: constant work per request
            if hmac.compare_digest(digest, expected):
                found = principal
        return found


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def load_tokens(path: Path | None) -> TokenStore:
    if path is None:
        return TokenStore()
    parsed = read_config_file(path, TokensFile, "tokens", TokensFileError)
    if not parsed.tokens:
        # no entries would mean no authentication at all (every caller an anonymous admin)
        raise TokensFileError(f"tokens file {path} has no tokens; add one (ci-sizer token create) or unset it")
    names = [t.name for t in parsed.tokens]
    if len(set(names)) != len(names):
        raise TokensFileError(f"tokens file {path} has duplicate token names")
    store = TokenStore()
    for t in parsed.tokens:
        roles: set[str] = set()
        for r in t.roles:
            roles |= _IMPLIED[r]
        orgs = frozenset(t.orgs) if t.orgs is not None else None
        store.entries.append((bytes.fromhex(t.sha256), Principal(t.name, frozenset(roles), orgs)))
    return store


def token_line(
    name: str,
    secret: str,
    roles: Iterable[str],
    orgs: Iterable[str] | None,
    *,
    toml: bool,
) -> str:
    """The entry to add to the tokens file for a new secret."""
    roles_l = list(roles)
    orgs_l = list(orgs) if orgs is not None else None
    digest = hash_secret(secret)
    if toml:
        parts = [
            f"name = {_toml_str(name)}",
            f'sha256 = "{digest}"',
            "roles = [" + ", ".join(_toml_str(r) for r in roles_l) + "]",
        ]
        if orgs_l is not None:
            parts.append("orgs = [" + ", ".join(_toml_str(o) for o in orgs_l) + "]")
        return "[[tokens]]\n" + "\n".join(parts)
    entry: dict[str, Any] = {"name": name, "sha256": digest, "roles": roles_l}
    if orgs_l is not None:
        entry["orgs"] = orgs_l
    return str(yaml.safe_dump({"tokens": [entry]}, sort_keys=False)).rstrip()


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def principal_from(store: TokenStore, header: str) -> Principal:
    """The caller named by an ``Authorization`` header; raises Unauthorized."""
    if not store.enabled:
        return ANONYMOUS
    scheme, _, secret = header.partition(" ")
    if not header:
        raise Unauthorized("a bearer token is required", headers={"WWW-Authenticate": _CHALLENGE})
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized(
            "the Authorization header must be 'Bearer <token>'",
            headers={"WWW-Authenticate": _CHALLENGE + ', error="invalid_request"'},
        )
    principal = store.authenticate(secret.strip())
    if principal is None:
        raise Unauthorized(
            "the token is not valid",
            headers={"WWW-Authenticate": _CHALLENGE + ', error="invalid_token"'},
        )
    return principal


#: Declares the bearer scheme in the OpenAPI document (``components.securitySchemes`` and each
#: guarded operation's ``security``); it never answers by itself: ``AuthenticatedRoute`` does.
BEARER = HTTPBearer(
    scheme_name="bearer",
    bearerFormat="cis_<secret>",
    description="a token from the tokens file (ci-sizer token create); none when the service runs open",
    auto_error=False,
)
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


def authorize(store: TokenStore, header: str, role: Role) -> Principal:
    """The caller named by an ``Authorization`` header, if it has ``role``; raises Unauthorized or Forbidden."""
    principal = principal_from(store, header)
    if role not in principal.roles:
        raise Forbidden(f"token {principal.name!r} lacks the {role!r} role")
    return principal


def _authorize(request: Request, role: Role) -> Principal:
    principal = authorize(request.app.state.tokens, request.headers.get("authorization", ""), role)
    request.state.principal = principal
    return principal


def require(role: Role) -> Callable[..., Coroutine[Any, Any, Principal]]:
    async def dependency(request: Request, _: BearerCredentials) -> Principal:
        principal = getattr(request.state, "principal", None)  # set by AuthenticatedRoute
        if isinstance(principal, Principal) and role in principal.roles:
            return principal
        return _authorize(request, role)

    dependency.__name__ = f"require_{role}"
    dependency.role = role  # type: ignore[attr-defined]
    return dependency


def required_role(dependant: Dependant) -> Role | None:
    """The role a route's dependencies require (through ``require``), if any."""
    for dep in dependant.dependencies:
        role: Role | None = getattr(dep.call, "role", None) or required_role(dep)
        if role is not None:
            return role
    return None


class AuthenticatedRoute(APIRoute):
    """A route that authenticates (401) and checks the role (403) before FastAPI reads the body,
    parses it or validates any parameter: a caller without a valid token learns only that, never
    what is wrong with its input (422). The org check needs the parsed input and stays in the route."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        role = required_role(self.dependant)
        if role is None:
            return handler

        async def route_handler(request: Request) -> Response:
            _authorize(request, role)
            return await handler(request)

        return route_handler


IngestPrincipal = Annotated[Principal, Depends(require("ingest"))]
ReadPrincipal = Annotated[Principal, Depends(require("read"))]
AdminPrincipal = Annotated[Principal, Depends(require("admin"))]
