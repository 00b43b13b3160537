"""``GET /api/v1/growths/{org}/{repo}/{workflow}/{job}``: what the growth guard did to a job's runs
(issue 40): runs grown, kills avoided, resizes refused, and the newest events."""

from __future__ import annotations

from fastapi import APIRouter

from service.auth import AuthenticatedRoute, ReadPrincipal
from service.deps import EngineDep
from service.errors import Forbidden, InvalidInput, Unauthorized, problem_responses
from service.growths import service as growths_service
from service.growths.schemas import JobGrowthsPublic
from service.jobs.service import job_id_of
from service.paths import JobKeyDep
from service.wire import utcnow

router = APIRouter(prefix="/api/v1/growths", tags=["growths"], route_class=AuthenticatedRoute)


@router.get(
    "/{org}/{repo}/{workflow}/{job}",
    response_model=JobGrowthsPublic,
    responses=problem_responses(InvalidInput, Unauthorized, Forbidden),
)
async def get_job_growths(key: JobKeyDep, principal: ReadPrincipal, engine: EngineDep) -> JobGrowthsPublic:
    """The job's growth events (posted with its runs by ``ci-sizer collect --grow``): over the last
    ``window_days`` days, the runs that grew, the kills avoided (runs that grew, were not OOM-killed and
    peaked above the limit they started with),
    the runs killed before a growth took effect and the events by result; and its newest events. A job
    never seen answers 200 with zeros. Path segments are percent-encoded, as for sizing (O6)."""
    principal.ensure_org(key.org)
    async with engine.connect() as conn:
        found = await growths_service.of_job(conn=conn, job_id=await job_id_of(conn=conn, key=key), now=utcnow())
    return JobGrowthsPublic.model_validate(
        {
            "org": key.org,
            "repo": key.repo,
            "workflow": key.workflow,
            "job": key.job,
            "window_days": found.window_days,
            "runs": found.runs,
            "runs_grown": found.runs_grown,
            "kills_avoided": found.kills_avoided,
            "runs_too_late": found.runs_too_late,
            "events": found.events,
            "recent": found.recent,
        }
    )
