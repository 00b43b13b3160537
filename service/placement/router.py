"""``POST /api/v1/placement:advise``: where a CI pod or step should land (rules P1-P10)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.auth import AuthenticatedRoute, ReadPrincipal
from service.deps import EngineDep, PolicyDep, SettingsDep
from service.errors import BadRequest, Forbidden, InvalidInput, PayloadTooLarge, Unauthorized, problem_responses
from service.keys import ScopeKey
from service.placement import service as placement_service
from service.placement.pods import pod_from_answer
from service.placement.public import PlacementPublic
from service.placement.schemas import PlacementAdvise, PlacementPod
from service.sizing import service as sizing_service
from service.sizing.params import DEFAULT

router = APIRouter(prefix="/api/v1", tags=["placement"], route_class=AuthenticatedRoute)


@router.post(
    "/placement:advise",
    response_model=PlacementPublic,
    responses=problem_responses(BadRequest, InvalidInput, PayloadTooLarge, Unauthorized, Forbidden),
)
async def advise(
    body: PlacementAdvise, principal: ReadPrincipal, settings: SettingsDep, engine: EngineDep, policy: PolicyDep
) -> dict[str, Any]:
    """Either a Concourse strategy ``chain`` (P1-P6: each strategy narrows the workers, the last
    survivors are picked from at random, an empty set means ``wait``) or a Kubernetes scoring
    ``profile`` (P7-P10: nodes that do not fit are filtered out, the rest ranked by the weighted
    scores; built-in ``spread``, ``limit-aware``, ``ci-bin-pack``). The random pick is seeded:
    the answer echoes ``seed``, and the same body with that seed gives the same answer.

    ``pod.job`` takes the pod's containers from the sizer's recommendation for that job; when the
    database fails or is slow the unknown-phase defaults are used and ``pod.degraded`` is true."""
    pod: PlacementPod = body.pod
    info: dict[str, Any] = {"source": "given"}
    if body.pod.job is not None:
        ref = body.pod.job
        key = ScopeKey(ref.org, ref.repo, ref.workflow, ref.job)
        principal.ensure_org(key.org)
        answers, degraded = await sizing_service.answers_for(
            engine=engine, keys=[key], policy=policy, deadline=settings.sizing_deadline_ms / 1000
        )
        answer = answers.get(key)
        if answer is None:
            answer = sizing_service.degraded(key=key, last=None, params=DEFAULT, policy=policy)
        phase = answer.meta.phase
        info = {"source": "default" if phase == "unknown" else "recommendation", "phase": phase, "degraded": degraded}
        pod = pod_from_answer(answer, cpu_limit=body.pod.job_cpu_limit).model_copy(
            update={"init_containers": body.pod.init_containers, "overhead": body.pod.overhead}
        )
    return placement_service.advise(body, pod, info)
