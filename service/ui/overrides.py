"""The overrides view: every override at every scope, and the editor of one scope's override."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, Query
from fastapi.responses import HTMLResponse

from service.auth import ReadPrincipal
from service.db import UnitOfWorkDep
from service.jobs import service as jobs_service
from service.keys import ScopeKey
from service.overrides import service as overrides_service
from service.overrides.service import FIELDS, ListFilter
from service.ui.job import quantity
from service.ui.render import PAGE_SIZE, Name, is_admin, render, router
from service.wire import to_rfc3339


@dataclass(frozen=True)
class Names:
    """The scope names of the query string, checked (no control characters); '' when not given."""

    org: str
    repo: str
    workflow: str
    job: str


def _names(org: Name = None, repo: Name = None, workflow: Name = None, job: Name = None) -> Names:
    jobs_service.check_names(org=org, repo=repo, workflow=workflow, job=job)
    return Names(org or "", repo or "", workflow or "", job or "")


NamesDep = Annotated[Names, Depends(_names)]


@router.get("/fragments/overrides")
async def overrides_view(
    principal: ReadPrincipal,
    uow: UnitOfWorkDep,
    names: NamesDep,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> HTMLResponse:
    if names.org:
        principal.ensure_org(names.org)
    after = overrides_service.decode_cursor(cursor) if cursor else 0
    rows, more = await overrides_service.list_overrides(
        session=uow.session,
        flt=ListFilter(
            org=names.org or None, repo=names.repo or None, workflow=names.workflow or None, job=names.job or None
        ),
        after_id=after,
        limit=PAGE_SIZE,
        orgs=principal.orgs,
    )
    next_cursor = overrides_service.encode_cursor(rows[-1].id) if more and rows and rows[-1].id else None
    return render(
        "overrides.html",
        rows=[_override(o) for o in rows],
        next_cursor=next_cursor,
        admin=is_admin(principal),
        first_page=not cursor,
    )


def _override(o: Any) -> dict[str, Any]:
    return {
        "scope": o.scope,
        "org": o.org,
        "repo": o.repo,
        "workflow": o.workflow,
        "job": o.job,
        "values": {f: quantity(f, getattr(o, f)) for f in FIELDS},
        "reason": o.reason,
        "expires_at": to_rfc3339(o.expires_at),
        "expired": overrides_service.is_expired(o),
        "updated_at": to_rfc3339(o.updated_at),
        "updated_by": o.updated_by,
        "etag": overrides_service.etag(o),
    }


@router.get("/fragments/override")
async def override_form(
    principal: ReadPrincipal,
    uow: UnitOfWorkDep,
    names: NamesDep,
    view: Literal["form", "current"] = "form",
) -> HTMLResponse:
    """The editor of one scope's override (``form``; without ``org``, a new override at a scope
    to type in), or only its stored value (``current``, shown when a write met a newer version)."""
    if not names.org:
        return render("override_form.html", key=None, current=None, admin=is_admin(principal))
    key = ScopeKey(names.org, names.repo, names.workflow, names.job)
    principal.ensure_org(key.org)
    found = await overrides_service.get(session=uow.session, key=key)
    return render(
        "override_form.html" if view == "form" else "override_current.html",
        key=key,
        current=None if found is None else _override(found),
        admin=is_admin(principal),
    )
