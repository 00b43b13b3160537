"""Background analyses: fleet simulations (``/api/v1/simulations``), backtests (``/api/v1/backtests``),
and ballast advice (``GET /api/v1/ballast``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from service import analyses
from service.auth import AuthenticatedRoute, ReadPrincipal
from service.backtests import service as backtest_service
from service.backtests.schemas import BacktestCreate
from service.ballast import service as ballast_service
from service.deps import policy as policy_of
from service.errors import (
    BadRequest,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    TooManyRequests,
    Unauthorized,
    problem_responses,
)
from service.placement.schemas import PlacementCpu, PlacementMemory
from service.simulations import engine as simulate
from service.simulations.schemas import AnalysisPublic, BallastPublic, SimulationCreate
from service.wire import Name, utcnow

router = APIRouter(prefix="/api/v1", tags=["analyses"], route_class=AuthenticatedRoute)


def pool_of(body: SimulationCreate) -> simulate.Pool:
    p = body.pool
    return simulate.Pool(
        shapes=tuple(simulate.Shape(s.name, s.cpu, s.memory, s.price_per_hour) for s in p.shapes),
        initial_nodes=p.initial_nodes,
        min_nodes=p.min_nodes,
        max_nodes=p.max_nodes,
        provision_delay=p.provision_delay_seconds,
        scale_down_idle=p.scale_down_idle_seconds,
        expendable_cutoff=p.expendable_pods_priority_cutoff,
    )


def ballast_of(body: SimulationCreate, builds: list[simulate.Build], provision_delay: float) -> simulate.Ballast | None:
    if body.ballast is None:
        return None
    auto = simulate.auto_ballast(builds, provision_delay, body.ballast_coverage)
    if body.ballast == "auto":
        return auto
    return simulate.Ballast(
        body.ballast.replicas,
        auto.cpu if body.ballast.cpu is None else body.ballast.cpu,
        auto.memory if body.ballast.memory is None else body.ballast.memory,
        body.ballast.priority,
    )


def _take_room(request: Request) -> None:
    """Take one of the process's analysis slots, or answer 429. No ``await`` here: the check and the
    count are one step on the event loop. The slot is given back when the analysis ends, or
    by ``_launch`` if it never starts."""
    limits: analyses.Limits = request.app.state.analysis_limits
    if not limits.try_acquire():
        raise TooManyRequests(
            f"{limits.max_running} analyses are running in this process; retry later", headers={"Retry-After": "10"}
        )


@router.post(
    "/simulations",
    status_code=202,
    response_model=AnalysisPublic,
    responses=problem_responses(BadRequest, InvalidInput, PayloadTooLarge, Unauthorized, Forbidden, TooManyRequests),
)
async def create_simulation(
    body: SimulationCreate, request: Request, response: Response, principal: ReadPrincipal
) -> dict[str, Any]:
    """Start a fleet simulation: replay a trace (``synthetic``, or the org's stored runs in a
    ``history`` window) onto the node ``pool`` under each profile, with and without ballast, and
    compare node-hours, cost, allocation, build start delays and nodes held by a lone build.
    Answers 202 at once; poll ``GET /api/v1/simulations/{id}`` (``Location``) for progress and the report."""
    if body.history is not None:
        principal.ensure_org(body.history.org)
    state = request.app.state
    pool = pool_of(body)
    policy = policy_of(request)

    async def prepare() -> analyses.Work:
        loaded: list[simulate.Build] | None = None
        source: dict[str, Any] = {}
        if body.history is not None:
            h = body.history
            async with state.engine.connect() as conn:
                loaded, info = await simulate.load_trace(
                    conn=conn, org=h.org, since=h.since, until=h.until, sizes=h.sizes, policy=policy
                )
            source = {"history": info}

        def work(progress: Any) -> dict[str, Any]:
            builds = loaded
            if builds is None:  # a synthetic trace is generated in the thread, not on the event loop
                assert body.synthetic is not None
                builds = simulate.synthetic_from(body.synthetic)
                source["synthetic"] = body.synthetic.model_dump()
            scenarios = simulate.scenarios_for(body.profiles, ballast_of(body, builds, pool.provision_delay))
            result = simulate.run_all(builds, pool, scenarios, seed=body.seed, progress=progress)
            result["trace"].update(source)
            return result

        return work

    return await _launch(request, response, "simulation", body, principal, prepare)


async def _launch(
    request: Request, response: Response, kind: str, body: Any, principal: Any, prepare: analyses.Prepare
) -> dict[str, Any]:
    """Store the analysis, start it in this process, answer its row with ``Location``. It
    takes a slot first (429 when there is none); it goes back if the analysis cannot be stored."""
    _take_room(request)
    engine = request.app.state.write_engine
    limits: analyses.Limits = request.app.state.analysis_limits
    try:
        analysis_id = await analyses.create(
            engine=engine, kind=kind, request=body.model_dump(mode="json"), created_by=principal.name
        )
    except BaseException:
        limits.release()
        raise
    analyses.start(
        request.app.state.analysis_tasks,
        engine=engine,
        analysis_id=analysis_id,
        prepare=prepare,
        kind=kind,
        limits=limits,
    )
    response.headers["Location"] = f"/api/v1/{kind}s/{analysis_id}"
    return await _get(request, analysis_id, kind, principal)


async def _get(request: Request, analysis_id: str, kind: str, principal: Any) -> dict[str, Any]:
    async with request.app.state.engine.connect() as conn:
        return await analyses.get_readable(conn=conn, analysis_id=analysis_id, kind=kind, principal=principal)


@router.get(
    "/simulations/{analysis_id}",
    response_model=AnalysisPublic,
    responses=problem_responses(NotFound, Unauthorized, Forbidden),
)
async def get_simulation(analysis_id: str, request: Request, principal: ReadPrincipal) -> dict[str, Any]:
    """Status (``queued``, ``running``, ``done``, ``failed``), progress 0..1, and when done the report."""
    return await _get(request, analysis_id, "simulation", principal)


@router.get(
    "/ballast",
    response_model=BallastPublic,
    responses=problem_responses(InvalidInput, Unauthorized, Forbidden),
)
async def get_ballast(
    request: Request,
    principal: ReadPrincipal,
    org: Annotated[Name, Query(description="the org whose builds the ballast serves")],
    days: Annotated[int, Query(ge=1, le=92, description="the window of stored runs, ending now")] = 28,
    provision_delay_seconds: Annotated[
        float, Query(ge=1, le=86400, description="how long the autoscaler takes to bring a node")
    ] = 120,
    coverage: Annotated[
        float, Query(gt=0, le=1, description="the share of bursts the ballast should absorb (SA2)")
    ] = ballast_service.COVERAGE,
    node_cpu: Annotated[
        PlacementCpu, Query(description="the node the ballast lands on, to cost each choice in node-hours")
    ] = 8000,
    node_memory: Annotated[PlacementMemory, Query(description="the node's memory")] = 32 << 30,
) -> dict[str, Any]:
    """Ballast pods for instant build starts: their size (the most common recommended build-pod
    size), their count (the smallest that covers ``coverage`` of the bursts of build starts within
    the provision delay, with every choice's share and cost in node-hours), the hours of the week
    with no build among those the data covers (ballast can scale to zero), what the autoscaler
    needs for an evicted ballast pod to bring a node, and the cf-runtime Helm values to paste."""
    principal.ensure_org(org)
    until = utcnow()
    async with request.app.state.engine.connect() as conn:
        return await ballast_service.advise(
            conn=conn,
            org=org,
            since=until - timedelta(days=days),
            until=until,
            provision_delay=provision_delay_seconds,
            policy=policy_of(request),
            coverage=coverage,
            node_cpu=node_cpu,
            node_memory=node_memory,
        )


def param_sets(body: BacktestCreate) -> list[backtest_service.Params]:
    return backtest_service.grid(body.runs, body.buffer, body.cpu_percentile, body.memory_qos)


@router.post(
    "/backtests",
    status_code=202,
    response_model=AnalysisPublic,
    responses=problem_responses(BadRequest, InvalidInput, PayloadTooLarge, Unauthorized, Forbidden, TooManyRequests),
)
async def create_backtest(
    body: BacktestCreate, request: Request, response: Response, principal: ReadPrincipal
) -> dict[str, Any]:
    """Start a backtest: walk each job's stored history in time order and, before each run, size it
    with each parameter set (every combination of ``runs``, ``buffer``, ``cpu_percentile``,
    ``memory_qos``; the current overrides apply), then score against what the run used: OOM risk,
    throttle exposure, waste. The limits recorded with the runs and three baselines are scored
    alike; the waste/risk frontier is marked. Answers 202; poll ``Location`` for the report."""
    if body.org is not None:
        principal.ensure_org(body.org)
    elif principal.orgs is not None:
        raise Forbidden(f"token {principal.name!r} may not backtest every org: name one")
    state = request.app.state
    max_memory = state.settings.max_memory

    async def prepare() -> analyses.Work:
        async with state.engine.connect() as conn:
            series = await backtest_service.load(
                conn=conn, org=body.org, since=body.since, until=body.until, max_memory=max_memory
            )
            overrides = await backtest_service.load_pins(conn=conn, org=body.org)
        pols = backtest_service.policies(param_sets(body), baselines=body.baselines)

        def work(progress: Any) -> dict[str, Any]:
            return backtest_service.run(
                series, pols, overrides, progress=progress, max_backoff_memory=state.settings.max_backoff_memory
            )

        return work

    return await _launch(request, response, "backtest", body, principal, prepare)


@router.get(
    "/backtests/{analysis_id}",
    response_model=AnalysisPublic,
    responses=problem_responses(NotFound, Unauthorized, Forbidden),
)
async def get_backtest(analysis_id: str, request: Request, principal: ReadPrincipal) -> dict[str, Any]:
    """Status, progress 0..1, and when done the report: per policy fleet-wide and per job."""
    return await _get(request, analysis_id, "backtest", principal)
