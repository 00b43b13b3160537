"""The job view: the answer computed afresh, what the job runs with today and what it would save,
its risk, its runs by date, its trend, the override resolution and the runner formats."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from fastapi.responses import HTMLResponse

from service.auth import ReadPrincipal
from service.deps import EngineDep, PolicyDep, SettingsDep
from service.growths import service as growths_service
from service.jobs import service as jobs_service
from service.jobs import summaries, trends
from service.jobs.money import Prices, money_block
from service.jobs.public import public as job_public
from service.jobs.service import JobFilter
from service.keys import SCOPES, ScopeKey
from service.overrides import service as overrides_service
from service.overrides.service import FIELDS
from service.plots import line_panels
from service.quantity import format_cpu, format_memory
from service.sizing import formats
from service.sizing import service as sizing_service
from service.sizing.answer import Answer
from service.sizing.params import SizingParams
from service.ui.fleet import trend_context
from service.ui.render import Required, human_memory, is_admin, render, router
from service.wire import to_rfc3339, utcnow

GIB = float(1 << 30)


@dataclass(frozen=True)
class FieldResolution:
    field: str
    by_scope: dict[str, str | None]
    effective: str
    source: str


def quantity(column: str, value: int | None) -> str | None:
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
            scope: quantity(column, getattr(pins.get(scope), column, None)) for scope in SCOPES
        }
        if first is None:
            effective, source = "-", "-"
        else:
            block = getattr(first, kind)
            effective, source = getattr(block, which), getattr(block.source, which)
        out.append(FieldResolution(f"{kind}.{which}", by_scope, effective, source))
    return out


def _run_text(r: Any) -> str:
    limit = "no limit reported" if r.memory_limit_bytes is None else f"limit {format_memory(r.memory_limit_bytes)}"
    killed = ", OOM-killed" if r.oom_killed or (r.oom_kill_events or 0) > 0 else ""
    return f"run {r.run_id}, {str(r.finished_at)[:16]} UTC: {r.name} peak {human_memory(r.memory_peak_bytes)}, {limit}{killed}"


def runs_plot(rows: list[Any], answer: Answer) -> str | None:
    """Each run's memory peak against the limit it ran with and the current answer, per container
    (GiB), OOM kills marked; each peak's dot names its run when the pointer is on it."""
    if not rows:
        return None
    order: dict[int, int] = {}
    for r in rows:
        order.setdefault(r.id, len(order) + 1)
    limits = {c.name: c.memory.limit_bytes for c in answer.containers}
    names = list(dict.fromkeys(r.name for r in rows))[:4]
    panels = []
    markers = []
    hover = []
    for p, name in enumerate(names):
        mine = [r for r in rows if r.name == name]
        series: dict[str, list[tuple[float, float]]] = {
            "peak": [(order[r.id], r.memory_peak_bytes / GIB) for r in mine],
            "limit it ran with": [
                (order[r.id], r.memory_limit_bytes / GIB) for r in mine if r.memory_limit_bytes is not None
            ],
        }
        if name in limits:
            series["current answer"] = [(1, limits[name] / GIB), (max(len(order), 2), limits[name] / GIB)]
        panels.append((f"{name}: memory (GiB)", series))
        hover.append({"peak": [_run_text(r) for r in mine]})
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
        hover=hover,
    )


def runs_table(rows: list[Any]) -> list[dict[str, Any]]:
    """The runs newest first, each with its containers: when, run id, duration, and per container
    the memory peak, the memory limit and CPU request it ran with, the CPU p95, OOM."""
    runs: dict[int, dict[str, Any]] = {}
    for r in rows:
        run = runs.setdefault(
            r.id,
            {
                "run_id": r.run_id,
                "finished_at": to_rfc3339(r.finished_at),
                "minutes": None
                if r.started_at is None
                else round((r.finished_at - r.started_at).total_seconds() / 60, 1),
                "containers": [],
            },
        )
        run["containers"].append(
            {
                "name": r.name,
                "peak": r.memory_peak_bytes,
                "limit": r.memory_limit_bytes,
                "cpu_request": r.cpu_request_millicores,
                "cpu_p95": r.cpu_p95,
                "killed": bool(r.oom_killed) or (r.oom_kill_events or 0) > 0,
                "suspect": bool(r.oom_suspect),
            }
        )
    return list(reversed(runs.values()))


@router.get("/fragments/job")
async def job_view(
    principal: ReadPrincipal,
    engine: EngineDep,
    policy: PolicyDep,
    settings: SettingsDep,
    org: Required,
    repo: Required,
    workflow: Required,
    job: Required,
) -> HTMLResponse:
    jobs_service.check_names(org=org, repo=repo, workflow=workflow, job=job)
    key = ScopeKey(org, repo, workflow, job)
    principal.ensure_org(key.org)
    prices = Prices.of(settings)
    params = SizingParams()
    today: dict[str, Any] | None = None
    async with engine.connect() as conn:
        rec = await sizing_service.recommend(conn=conn, key=key, params=params, policy=policy)
        pins = await overrides_service.applicable(conn=conn, key=key)
        rows = [] if rec.job_id is None else await jobs_service.recent_runs(conn=conn, job_id=rec.job_id)
        growth = await growths_service.of_job(conn=conn, job_id=rec.job_id, now=utcnow(), recent=0)  # issue 40
        if rec.job_id is not None:
            now = utcnow()
            stats = await summaries.run_stats(conn=conn, job_id=rec.job_id, now=now)
            today = summaries.summary_row(
                job_id=rec.job_id, answer=rec.answer, fresh_until=rec.fresh_until, stats=stats, now=now
            )
        days = await trends.trend(
            conn=conn, flt=JobFilter(org=org, repo=repo, workflow=workflow, job=job), orgs=principal.orgs, prices=prices
        )
    answer = rec.answer
    wire = answer.as_dict()
    rendered = {name: render_format(answer, None) for name, render_format in formats.RENDERERS.items()}
    row = None if today is None else job_public(_Summary(key, today), prices)
    return render(
        "job.html",
        key=key,
        answer=wire,
        meta=wire["meta"],
        formats={name: text for name, (_, text) in rendered.items()},
        resolution=resolution(pins, answer),
        scopes=SCOPES,
        plot=runs_plot(rows, answer),
        runs=runs_table(rows),
        row=row,
        by_container={} if row is None else {c["name"]: c for c in row["containers"]},
        money=money_block(prices, None, None) if row is None else row["saved_money"],
        admin=is_admin(principal),
        answer_json=orjson.dumps(wire, option=orjson.OPT_INDENT_2).decode(),
        growth=growth,
        **trend_context(days, prices),
    )


class _Summary:
    """A job's summary computed now (``summaries.summary_row``), read as a stored row is."""

    def __init__(self, key: ScopeKey, row: dict[str, Any]) -> None:
        self.__dict__.update(row)
        self.org, self.repo, self.workflow, self.job = key.org, key.repo, key.workflow, key.job
