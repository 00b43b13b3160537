"""What every fragment of the operator's page shares: the router (``/ui``, each view module adds its
routes to it), the templates (autoescaped), their filters, the response headers and the query-string
types."""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, select_autoescape

from service.auth import Principal
from service.quantity import format_cpu, format_memory
from service.wire import NAME_MAX, to_rfc3339

router = APIRouter(prefix="/ui", include_in_schema=False)
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
PAGE_SIZE = 50
Name = Annotated[str | None, Query(max_length=NAME_MAX)]
Required = Annotated[str, Query(min_length=1, max_length=NAME_MAX)]


def _memory(value: float | None) -> str:
    return "-" if value is None else format_memory(int(value))


def _cpu(value: float | None) -> str:
    return "-" if value is None else format_cpu(int(-(-value // 1)))


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def human_memory(value: float | None) -> str:
    """A measured amount of memory as a person reads it: ``798 MiB``, ``6.6 GiB`` (3 significant
    digits), never a raw count of bytes."""
    if value is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            scaled = value / size
            return f"{scaled:.3g} {unit}" if scaled < 1000 else f"{scaled:,.0f} {unit}"
    return f"{value:.0f} B"


def money(value: float | None, currency: str) -> str:
    """An amount with its currency: whole units from 100, cents from 1, three decimals below."""
    if value is None:
        return "-"
    digits = 0 if abs(value) >= 100 else 2 if abs(value) >= 1 else 3
    shown = round(value, digits) or 0.0  # no "-0.000"
    return f"{shown:,.{digits}f} {currency}"


def when(value: str | None, seconds: bool = False) -> str:
    """An RFC 3339 time as ``YYYY-MM-DD HH:MM`` (UTC)."""
    return "-" if not value else value[: 19 if seconds else 16].replace("T", " ")


@cache
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("service.ui", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        memory=_memory, cpu=_cpu, num=_num, rfc3339=to_rfc3339, human_memory=human_memory, money=money, when=when
    )
    return env


def render(template: str, **context: Any) -> HTMLResponse:
    return HTMLResponse(environment().get_template(template).render(**context), headers=HEADERS)


def is_admin(principal: Principal) -> bool:
    return "admin" in principal.roles
