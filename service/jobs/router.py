"""``GET /api/v1/jobs``: the known jobs with their phase, answer, what they ran with and what
applying the answer would save, filtered, sorted and a page at a time."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field

from service.auth import ReadPrincipal
from service.deps import EngineDep, SettingsDep
from service.errors import Forbidden, InvalidInput, Unauthorized, problem_responses
from service.jobs import service as jobs_service
from service.jobs.money import Prices
from service.jobs.public import public as job_public
from service.jobs.service import Sort

router = APIRouter(prefix="/api/v1", tags=["jobs"])


class JobPodPublic(BaseModel):
    cpu_request_millicores: float | None = Field(description="summed over the containers")
    memory_limit_bytes: int | None = Field(description="summed over the containers")


class JobSavedPublic(BaseModel):
    memory_gib_hours: float | None = Field(
        description="(in force - answer) memory limit in GiB x run-hours per day; negative: the answer is larger"
    )
    cpu_core_hours: float | None = Field(description="(in force - answer) CPU request in cores x run-hours per day")


class MoneyPublic(BaseModel):
    per_day: float | None = Field(description="the saving per day times the operator's prices (null: unknown)")
    per_month: float | None = Field(description="per_day x 730 / 24 (a month of 730 hours)")
    currency: str


class JobRiskPublic(BaseModel):
    level: Literal["critical", "high", "warn"] | None = Field(
        description="critical: a pinned memory limit below the peak; high: OOM backoff; warn: throttled; null: none"
    )
    reasons: list[Literal["pinned below peak", "OOM backoff", "throttled"]]


class JobContainerAnswerPublic(BaseModel):
    memory_limit_bytes: int
    memory_limit_source: str
    cpu_request_millicores: int
    cpu_limit_millicores: int
    cpu_limit_source: str
    cpu_enforced: bool


class JobContainerRanWithPublic(BaseModel):
    memory_limit_bytes: int | None
    cpu_request_millicores: float | None


class JobContainerUsedPublic(BaseModel):
    memory_peak_bytes: int | None = Field(description="the highest peak of the newest 60 runs")
    cpu_p95_millicores: float | None = Field(description="the highest CPU p95 of the newest 60 runs")


class JobContainerPublic(BaseModel):
    name: str
    answer: JobContainerAnswerPublic
    ran_with: JobContainerRanWithPublic = Field(description="what the newest run reported running with")
    used: JobContainerUsedPublic
    oom_consecutive: int
    below_peak: bool = Field(description="the memory limit is pinned below the peak: killed on every run")
    throttled: bool = Field(description="the CPU limit is enforced below the CPU p95")


class JobPublic(BaseModel):
    org: str
    repo: str
    workflow: str
    job: str
    phase: Literal["unknown", "learning", "confident"] | None = Field(description="null until first summarised")
    override_scope: Literal["job", "workflow", "repo", "org", "global"] | None
    oom_backoff: bool | None = Field(description="a container's memory limit is backed off after OOM-suspect runs")
    last_run_at: str | None
    window_days: int
    runs: int | None = Field(description="runs that finished in the window")
    oom_kills: int | None = Field(description="runs in the window with a container OOM-killed")
    run_hours_per_day: float | None = Field(description="mean run-hours per day in the window (needs started_at)")
    in_force: JobPodPublic = Field(description="what the newest run reported it ran with (null: not reported)")
    answer: JobPodPublic | None = Field(description="the current answer's pod totals (GET /api/v1/sizing)")
    saved_per_day: JobSavedPublic = Field(
        description="null for memory when a pinned memory limit is below the peak, for CPU when a pinned CPU "
        "limit is below the CPU p95: running below what a job uses is no saving"
    )
    saved_money: MoneyPublic
    risk: JobRiskPublic
    containers: list[JobContainerPublic] = Field(description="per container of the answer ([] until summarised)")
    summarised_at: str | None = Field(description="when this row's answer was computed")


class JobTotalsPublic(BaseModel):
    jobs: int
    summarised: int
    unknown: int
    learning: int
    confident: int
    oom_backoff: int
    at_risk: int = Field(description="jobs with any risk (pinned below peak, OOM backoff, throttled)")
    pinned_below_peak: int
    saved_memory_gib_hours_per_day: float
    saved_cpu_core_hours_per_day: float
    saved_money: MoneyPublic
    oldest_summary_at: str | None


class JobsPublic(BaseModel):
    items: list[JobPublic]
    next_cursor: str | None
    totals: JobTotalsPublic = Field(description="over every job the filters select, not only this page")


Name = Annotated[str | None, Query(max_length=200)]


@router.get(
    "/jobs",
    response_model=JobsPublic,
    responses=problem_responses(InvalidInput, Unauthorized, Forbidden),
)
async def list_jobs(
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    response: Response,
    principal: ReadPrincipal,
    org: Name = None,
    repo: Name = None,
    workflow: Name = None,
    job: Name = None,
    phase: Literal["unknown", "learning", "confident"] | None = None,
    q: Annotated[str | None, Query(max_length=200, description="a substring of any name, case-insensitive")] = None,
    sort: Annotated[
        Sort,
        Query(
            description="waste_memory, waste_cpu, money (most saved first), risk (pinned below peak, then OOM "
            "backoff, then throttled; most money saved first within), oom (most OOM kills first), "
            "last_run (newest first), name"
        ),
    ] = "waste_memory",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
) -> JobsPublic:
    """The jobs this token may read, a page at a time; ``Link: rel="next"`` points at the next page.

    Each row's answer is the one ``GET /api/v1/sizing`` gives with the default parameters, as
    computed in the background within seconds of the job's last run or an override change
    (``summarised_at``); a job seen moments ago may not be summarised yet (``phase: null``).
    Runs and OOM kills count the last ``window_days`` days. Savings are per day and signed, in
    GiB-hours, core-hours and money at the operator's prices (``--price-per-gib-hour``,
    ``--price-per-core-hour``); a job at risk (``risk``) saves nothing where it is at risk."""
    flt = jobs_service.job_filter(principal, org=org, repo=repo, workflow=workflow, job=job, phase=phase, q=q)
    prices = Prices.of(settings)
    page, totals = await jobs_service.read_page(
        engine=engine, principal=principal, flt=flt, sort=sort, limit=limit, cursor=cursor, prices=prices
    )
    if page.next_cursor is not None:
        params = {k: v for k, v in request.query_params.items() if k != "cursor"}
        params["cursor"] = page.next_cursor
        response.headers["Link"] = f'<{request.url.path}?{urlencode(params, quote_via=quote)}>; rel="next"'
    return JobsPublic(
        items=[JobPublic.model_validate(job_public(r, prices)) for r in page.rows],
        next_cursor=page.next_cursor,
        totals=JobTotalsPublic.model_validate(totals),
    )
