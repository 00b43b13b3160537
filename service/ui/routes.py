"""The operator's page at ``/ui/``: a static shell, and HTML fragments its script fetches with the
token in the ``Authorization`` header.

Every fragment reads through the services the API uses (``sizing.recommend``, ``jobs``,
``overrides``, ``formats``, ``analyses``) under the same token checks; writes are the API's own
requests, sent by the script. Nothing here sets a cookie, and fragments are never cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from service import analyses
from service.auth import Principal, ReadPrincipal
from service.backtests import service as backtest_service
from service.db import UnitOfWorkDep
from service.deps import EngineDep, PolicyDep
from service.errors import NotFound
from service.growths import service as growths_service
from service.jobs import service as jobs_service
from service.jobs.service import Sort
from service.keys import SCOPES, ScopeKey
from service.overrides import service as overrides_service
from service.overrides.service import FIELDS, ListFilter
from service.plots import line_panels
from service.quantity import format_cpu, format_memory
from service.simulations import report as simulate
from service.sizing import formats
from service.sizing import service as sizing_service
from service.sizing.answer import Answer
from service.sizing.params import SizingParams
from service.wire import NAME_MAX, to_rfc3339, utcnow

router = APIRouter(prefix="/ui", include_in_schema=False)

#: the page's own files, served from the package (``pip install .`` ships them as package data)
STATIC = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
PAGE_SIZE = 50
GIB = float(1 << 30)
Name = Annotated[str | None, Query(max_length=NAME_MAX)]
Required = Annotated[str, Query(min_length=1, max_length=NAME_MAX)]


def _memory(value: float | None) -> str:
    return "-" if value is None else format_memory(int(value))


def _cpu(value: float | None) -> str:
    return "-" if value is None else format_cpu(int(-(-value // 1)))


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


@cache
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("service.ui", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(memory=_memory, cpu=_cpu, num=_num, rfc3339=to_rfc3339)
    return env


def render(template: str, **context: Any) -> HTMLResponse:
    return HTMLResponse(environment().get_template(template).render(**context), headers=HEADERS)


@cache
def _asset(name: str) -> bytes:
    return resources.files("service.ui").joinpath("static", name).read_bytes()


@router.get("/")
async def shell() -> HTMLResponse:
    """The page; it holds no data (the script fetches every fragment with the token)."""
    return render("shell.html")


@router.get("/static/{name}")
async def static(name: str) -> Response:
    if name not in STATIC:
        raise NotFound(f"no asset {name!r}")
    return Response(_asset(name), media_type=STATIC[name], headers={**HEADERS, "Cache-Control": "no-cache"})


def is_admin(principal: Principal) -> bool:
    return "admin" in principal.roles


@router.get("/fragments/me")
async def me(principal: ReadPrincipal) -> HTMLResponse:
    return render("me.html", principal=principal, admin=is_admin(principal))


# --------------------------------------------------------------------------- fleet


@router.get("/fragments/jobs")
async def fleet(
    principal: ReadPrincipal,
    engine: EngineDep,
    org: Name = None,
    repo: Name = None,
    workflow: Name = None,
    q: Name = None,
    phase: Literal["", "unknown", "learning", "confident"] = "",
    sort: Sort = "waste_memory",
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
) -> HTMLResponse:
    flt = jobs_service.job_filter(
        principal, org=org or None, repo=repo or None, workflow=workflow or None, job=None, phase=phase or None, q=q
    )
    page, totals = await jobs_service.read_page(
        engine=engine, principal=principal, flt=flt, sort=sort, limit=PAGE_SIZE, cursor=cursor or None
    )
    return render(
        "jobs.html",
        rows=[jobs_service.public(r) for r in page.rows],
        totals=totals,
        next_cursor=page.next_cursor,
        first_page=not cursor,
        window_days=jobs_service.WINDOW_DAYS,
    )


# --------------------------------------------------------------------------- one job


@dataclass(frozen=True)
class FieldResolution:
    field: str
    by_scope: dict[str, str | None]
    effective: str
    source: str


def _quantity(column: str, value: int | None) -> str | None:
    if value is None:
        return None
    return format_cpu(value) if column.startswith("cpu") else format_memory(value)


def resolution(pins: dict[str, Any], answer: Answer) -> list[FieldResolution]:
    """Field by field: the value pinned at each scope, and what the answer's first container
    resolved to (rules O2-O3) with the scope it came from."""
    out = []
    first = answer.containers[0] if answer.containers else None
    for column in FIELDS:
        kind, _, rest = column.partition("_")
        which = rest.split("_")[0]  # request / limit
        by_scope: dict[str, str | None] = {
            scope: _quantity(column, getattr(pins.get(scope), column, None)) for scope in SCOPES
        }
        if first is None:
            effective, source = "-", "-"
        else:
            block = getattr(first, kind)
            effective, source = getattr(block, which), getattr(block.source, which)
        out.append(FieldResolution(f"{kind}.{which}", by_scope, effective, source))
    return out


def runs_plot(rows: list[Any], answer: Answer) -> str | None:
    """Each run's memory peak against the limit it ran with and the current answer, per container
    (GiB), OOM kills marked."""
    if not rows:
        return None
    order: dict[int, int] = {}
    for r in rows:
        order.setdefault(r.id, len(order) + 1)
    limits = {c.name: c.memory.limit_bytes for c in answer.containers}
    names = list(dict.fromkeys(r.name for r in rows))[:4]
    panels = []
    markers = []
    for p, name in enumerate(names):
        mine = [r for r in rows if r.name == name]
        series: dict[str, list[tuple[float, float]]] = {
            "peak": [(order[r.id], r.memory_peak_bytes / GIB) for r in mine],
            "limit it ran with": [
                (order[r.id], r.memory_limit_bytes / GIB) for r in mine if r.memory_limit_bytes is not None
            ],
        }
        if name in limits:
            series["current answer"] = [(1, limits[name] / GIB), (len(order), limits[name] / GIB)]
        panels.append((f"{name}: memory (GiB)", series))
        kills: list[tuple[float, float]] = [
            (float(order[r.id]), r.memory_peak_bytes / GIB)
            for r in mine
            if r.oom_killed or (r.oom_kill_events or 0) > 0
        ]
        markers.append((p, "OOM kill", kills))
    return line_panels(
        f"the newest {len(order)} runs: memory peak, the limit each ran with, the current answer",
        panels,
        x_label="run (oldest to newest)",
        markers=markers,
    )


@router.get("/fragments/job")
async def job_view(
    principal: ReadPrincipal,
    engine: EngineDep,
    policy: PolicyDep,
    org: Required,
    repo: Required,
    workflow: Required,
    job: Required,
) -> HTMLResponse:
    jobs_service.check_names(org=org, repo=repo, workflow=workflow, job=job)
    key = ScopeKey(org, repo, workflow, job)
    principal.ensure_org(key.org)
    params = SizingParams()
    async with engine.connect() as conn:
        rec = await sizing_service.recommend(conn=conn, key=key, params=params, policy=policy)
        pins = await overrides_service.applicable(conn=conn, key=key)
        rows = [] if rec.job_id is None else await jobs_service.recent_runs(conn=conn, job_id=rec.job_id)
        growth = await growths_service.of_job(conn=conn, job_id=rec.job_id, now=utcnow(), recent=0)  # issue 40
    answer = rec.answer
    wire = answer.as_dict()
    rendered = {name: render_format(answer, None) for name, render_format in formats.RENDERERS.items()}
    return render(
        "job.html",
        key=key,
        answer=wire,
        meta=wire["meta"],
        formats={name: text for name, (_, text) in rendered.items()},
        resolution=resolution(pins, answer),
        scopes=SCOPES,
        plot=runs_plot(rows, answer),
        admin=is_admin(principal),
        answer_json=orjson.dumps(wire, option=orjson.OPT_INDENT_2).decode(),
        growth=growth,
    )


# --------------------------------------------------------------------------- overrides


def _scope_key(org: str, repo: str | None, workflow: str | None, job: str | None) -> ScopeKey:
    return ScopeKey(org, repo or "", workflow or "", job or "")


@router.get("/fragments/overrides")
async def overrides_view(
    principal: ReadPrincipal,
    uow: UnitOfWorkDep,
    org: Name = None,
    repo: Name = None,
    workflow: Name = None,
    job: Name = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> HTMLResponse:
    jobs_service.check_names(org=org, repo=repo, workflow=workflow, job=job)
    if org:
        principal.ensure_org(org)
    after = overrides_service.decode_cursor(cursor) if cursor else 0
    rows, more = await overrides_service.list_overrides(
        session=uow.session,
        flt=ListFilter(org=org or None, repo=repo or None, workflow=workflow or None, job=job or None),
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
        "values": {f: _quantity(f, getattr(o, f)) for f in FIELDS},
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
    org: Name = None,
    repo: Name = None,
    workflow: Name = None,
    job: Name = None,
    view: Literal["form", "current"] = "form",
) -> HTMLResponse:
    """The editor of one scope's override (``form``; without ``org``, a new override at a scope
    to type in), or only its stored value (``current``, shown when a write met a newer version)."""
    jobs_service.check_names(org=org, repo=repo, workflow=workflow, job=job)
    if not org:
        return render("override_form.html", key=None, current=None, admin=is_admin(principal))
    key = _scope_key(org, repo, workflow, job)
    principal.ensure_org(key.org)
    found = await overrides_service.get(session=uow.session, key=key)
    return render(
        "override_form.html" if view == "form" else "override_current.html",
        key=key,
        current=None if found is None else _override(found),
        admin=is_admin(principal),
    )


# --------------------------------------------------------------------------- analyses


@router.get("/fragments/analyses")
async def analyses_view(principal: ReadPrincipal) -> HTMLResponse:
    return render("analyses.html", orgs=sorted(principal.orgs) if principal.orgs is not None else None)


def backtest_plot(result: dict[str, Any]) -> str | None:
    """Each policy's memory waste against its OOM-risk runs, the frontier as a line."""
    points = [(p["oom_risk_runs"], p["memory_waste_gib_hours"]) for p in result["policies"] if p.get("runs_scored")]
    frontier = sorted(
        (p["oom_risk_runs"], p["memory_waste_gib_hours"]) for p in result["policies"] if p["frontier"]["memory"]
    )
    if not points:
        return None
    return line_panels(
        "memory waste (GiB-h) by OOM-risk runs, per policy",
        [("memory waste (GiB-h)", {"frontier": [(float(x), float(y)) for x, y in frontier]})],
        x_label="OOM-risk runs",
        markers=[(0, "a policy", [(float(x), float(y)) for x, y in points])],
    )


@router.get("/fragments/analysis")
async def analysis_view(
    principal: ReadPrincipal,
    engine: EngineDep,
    kind: Literal["backtest", "simulation"],
    id: Annotated[str, Query(min_length=1, max_length=36)],
) -> HTMLResponse:
    async with engine.connect() as conn:
        found = await analyses.get_readable(conn=conn, analysis_id=id, kind=kind, principal=principal)
    table = plot = None
    result = found["result"]
    if found["status"] == "done" and result is not None:
        if kind == "simulation":
            table = simulate.render(result)
            plot = simulate.plot(result)
        else:
            table = backtest_service.render(result)
            plot = backtest_plot(result)
    return render("analysis.html", a=found, kind=kind, table=table, plot=plot)
