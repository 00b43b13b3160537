"""Operator overrides (rules O1-O6): storage, ETags, listing."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlmodel import col

from service.errors import InvalidInput, NotFound, PreconditionFailed
from service.keys import Scope, ScopeKey
from service.tables import Override
from service.wire import utcnow

FIELDS = (
    "cpu_request_millicores",
    "cpu_limit_millicores",
    "memory_request_bytes",
    "memory_limit_bytes",
)


@dataclass(frozen=True)
class Pins:
    cpu_request_millicores: int | None
    cpu_limit_millicores: int | None
    memory_request_bytes: int | None
    memory_limit_bytes: int | None
    reason: str | None
    expires_at: datetime | None
    #: "seed" or "efficient": the sizing policy at this scope; None inherits (issue 25)
    sizing_policy: str | None = None


def etag(o: Override) -> str:
    """A strong ETag over everything the override says, its version and creation time."""
    parts = [
        str(o.id),
        str(o.version),
        o.created_at.isoformat(),
        o.updated_at.isoformat(),
    ]
    parts += [str(getattr(o, f)) for f in FIELDS]
    parts += [o.reason or "", o.expires_at.isoformat() if o.expires_at else ""]
    if o.sizing_policy is not None:  # only when set: an override without one keeps its ETag
        parts.append(o.sizing_policy)
    return '"' + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32] + '"'


#: an override as read for sizing: a row with the overrides table's columns
PinRow = Any


def is_expired(o: Override | PinRow, now: datetime | None = None) -> bool:
    return o.expires_at is not None and o.expires_at <= (now or utcnow())


def sizing_policy(pins: dict[str, PinRow], default: str) -> str:
    """The sizing policy for one job (issue 25, O2 style): the most specific applicable override's
    ``sizing_policy``, else ``default`` (the server's setting)."""
    for scope in ("job", "workflow", "repo", "org"):
        o = pins.get(scope)
        chosen = None if o is None else getattr(o, "sizing_policy", None)  # rows built by hand may lack it
        if chosen is not None:
            return str(chosen)
    return default


def _where_key(key: ScopeKey) -> ColumnElement[bool]:
    return and_(
        col(Override.org) == key.org,
        col(Override.repo) == key.repo,
        col(Override.workflow) == key.workflow,
        col(Override.job) == key.job,
    )


async def get(*, session: AsyncSession, key: ScopeKey, for_update: bool = False) -> Override | None:
    """The override at ``key``. With ``for_update`` the row stays locked until the transaction
    ends (PostgreSQL ``SELECT ... FOR UPDATE``) and is read as last committed, so a conditional
    write checks and writes the same version. SQLite has no row locks: there the write session's
    ``BEGIN IMMEDIATE`` already serialises writers for the whole read-check-write."""
    stmt = select(Override).where(_where_key(key))
    if for_update:
        stmt = stmt.with_for_update().execution_options(populate_existing=True)
    return (await session.execute(stmt)).scalar_one_or_none()


def check_preconditions(current: Override | None, *, if_match: str | None, if_none_match: str | None) -> None:
    if_match = if_match.strip() if if_match and if_match.strip() else None  # an empty header is no header
    if_none_match = if_none_match.strip() if if_none_match and if_none_match.strip() else None
    if if_match is not None:
        if current is None:
            raise PreconditionFailed("If-Match given but there is no override at this scope")
        wanted = [t.strip() for t in if_match.split(",")]
        if "*" not in wanted and etag(current) not in wanted:
            raise PreconditionFailed("the override changed since it was read (stale ETag)")
    if if_none_match is not None and current is not None:
        wanted = [t.strip() for t in if_none_match.split(",")]
        if "*" in wanted or etag(current) in wanted:
            raise PreconditionFailed("an override already exists at this scope")


#: tries of a PUT's read-lock-write when concurrent creators and deleters keep winning the race
_PUT_ATTEMPTS = 32


async def put(
    *,
    session: AsyncSession,
    key: ScopeKey,
    pins: Pins,
    updated_by: str,
    if_match: str | None = None,
    if_none_match: str | None = None,
) -> tuple[Override, bool]:
    """Create or replace the override at ``key``; returns it and whether it was created (O5).

    The read-check-write is atomic: the row is locked before its ETag is checked, so of any
    number of concurrent writers carrying the same ``If-Match`` exactly one succeeds and the
    others get 412; a concurrent DELETE is seen as "no override" (412 with ``If-Match``).

    An insert that loses to a concurrent creator is tried again as a replace; a concurrent DELETE
    can undo that creation, so under a burst of racing writers an attempt can lose more than once.
    Each loss means another writer's change was committed, so the attempts are bounded by
    ``_PUT_ATTEMPTS``, not by a timer."""
    for attempt in range(_PUT_ATTEMPTS):
        current = await get(session=session, key=key, for_update=True)
        check_preconditions(current, if_match=if_match, if_none_match=if_none_match)
        now = utcnow()
        if current is None:
            created = Override(
                scope=key.scope,
                org=key.org,
                repo=key.repo,
                workflow=key.workflow,
                job=key.job,
                created_at=now,
                updated_at=now,
                updated_by=updated_by,
                version=1,
                **_pin_values(pins),
            )
            session.add(created)
            try:
                await session.flush()
            except IntegrityError:  # a concurrent PUT created it first: replace instead
                await session.rollback()
                if attempt == _PUT_ATTEMPTS - 1:
                    raise
                continue
            return created, True
        for name, value in _pin_values(pins).items():
            setattr(current, name, value)
        current.updated_at = max(now, current.updated_at)
        current.updated_by = updated_by
        current.version += 1
        await session.flush()
        return current, False
    raise AssertionError("unreachable")  # pragma: no cover


def _pin_values(pins: Pins) -> dict[str, Any]:
    return {
        "cpu_request_millicores": pins.cpu_request_millicores,
        "cpu_limit_millicores": pins.cpu_limit_millicores,
        "memory_request_bytes": pins.memory_request_bytes,
        "memory_limit_bytes": pins.memory_limit_bytes,
        "reason": pins.reason,
        "expires_at": pins.expires_at,
        "sizing_policy": pins.sizing_policy,
    }


async def delete(*, session: AsyncSession, key: ScopeKey, if_match: str | None = None) -> None:
    current = await get(session=session, key=key, for_update=True)
    if current is None:
        if if_match is not None:
            raise PreconditionFailed("If-Match given but there is no override at this scope")
        raise NotFound("no override at this scope")
    check_preconditions(current, if_match=if_match, if_none_match=None)
    await session.delete(current)
    await session.flush()


_table = Override.__table__  # type: ignore[attr-defined]
_APPLICABLE = select(_table).where(
    _table.c.org == bindparam("org"),
    or_(
        and_(_table.c.repo == "", _table.c.workflow == "", _table.c.job == ""),
        and_(_table.c.repo == bindparam("repo"), _table.c.workflow == "", _table.c.job == ""),
        and_(_table.c.repo == bindparam("repo"), _table.c.workflow == bindparam("workflow"), _table.c.job == ""),
        and_(
            _table.c.repo == bindparam("repo"),
            _table.c.workflow == bindparam("workflow"),
            _table.c.job == bindparam("job"),
        ),
    ),
)


async def applicable(*, conn: AsyncConnection, key: ScopeKey) -> dict[str, PinRow]:
    """The unexpired overrides that bear on one job, by scope (rule O2)."""
    rows = await conn.execute(_APPLICABLE, {"org": key.org, "repo": key.repo, "workflow": key.workflow, "job": key.job})
    now = utcnow()
    return {row.scope: row for row in rows if not is_expired(row, now)}


def applicable_of(overrides: Iterable[PinRow], key: ScopeKey) -> dict[str, PinRow]:
    """Of a list of override rows, those that bear on one job, by scope (rule O2) (``applicable``
    without the database; expiry is the caller's)."""
    levels = {
        "org": (key.org, "", "", ""),
        "repo": (key.org, key.repo, "", ""),
        "workflow": (key.org, key.repo, key.workflow, ""),
        "job": (key.org, key.repo, key.workflow, key.job),
    }
    return {o.scope: o for o in overrides if (o.org, o.repo, o.workflow, o.job) == levels.get(o.scope)}


async def of_org(*, conn: AsyncConnection, org: str | None) -> list[PinRow]:
    """The unexpired override rows of ``org`` (of every org: None)."""
    q = select(_table)
    if org is not None:
        q = q.where(_table.c.org == org)
    now = utcnow()
    return [o for o in await conn.execute(q) if not is_expired(o, now)]


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"o:{last_id}".encode()).decode().rstrip("=")


#: ids are 64-bit signed integers on every database: a cursor past them is not one this API made
MAX_ID = 2**63 - 1


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        prefix, _, value = raw.partition(":")
        if prefix != "o" or not value.isascii() or not value.isdigit() or int(value) > MAX_ID:
            raise ValueError
        return int(value)
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput(
            "the cursor is not valid",
            errors=[{"field": "query/cursor", "message": "not a cursor from this API"}],
        ) from None


@dataclass(frozen=True)
class ListFilter:
    org: str | None = None
    repo: str | None = None
    workflow: str | None = None
    job: str | None = None
    scope: Scope | None = None


async def list_overrides(
    *,
    session: AsyncSession,
    flt: ListFilter,
    after_id: int,
    limit: int,
    orgs: frozenset[str] | None,
) -> tuple[list[Override], bool]:
    """Overrides in id order after ``after_id``; the bool says whether more follow."""
    stmt = select(Override).where(col(Override.id) > after_id)
    for column, value in (
        (col(Override.org), flt.org),
        (col(Override.repo), flt.repo),
        (col(Override.workflow), flt.workflow),
        (col(Override.job), flt.job),
        (col(Override.scope), flt.scope),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    if orgs is not None:
        stmt = stmt.where(col(Override.org).in_(sorted(orgs)))
    stmt = stmt.order_by(col(Override.id)).limit(limit + 1)
    rows = list((await session.execute(stmt)).scalars())
    return rows[:limit], len(rows) > limit
