"""The operator's page at ``/ui/``: a static shell, and HTML fragments its script fetches with the
token in the ``Authorization`` header.

Every fragment reads through the services the API uses (``sizing.recommend``, ``jobs``,
``overrides``, ``formats``, ``analyses``) under the same token checks; writes are the API's own
requests, sent by the script. Nothing here sets a cookie, and fragments are never cached. The views
live beside this module: ``fleet`` (jobs, totals, trends), ``job``, ``overrides``, ``analyses``.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi.responses import HTMLResponse, Response

from service.auth import ReadPrincipal
from service.errors import NotFound
from service.ui import analyses, fleet, job, overrides
from service.ui.render import HEADERS, is_admin, render
from service.ui.render import router as router

#: the views whose routes are on ``router``: the fleet (jobs, totals, trends), one job, overrides, analyses
VIEWS = (fleet, job, overrides, analyses)

#: the page's own files, served from the package (``pip install .`` ships them as package data)
STATIC = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}


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


@router.get("/fragments/me")
async def me(principal: ReadPrincipal) -> HTMLResponse:
    return render("me.html", principal=principal, admin=is_admin(principal))
