"""One aggregator includes every router (overrides before sizing: their paths overlap)."""

from fastapi import APIRouter
from starlette.routing import BaseRoute

from service import health
from service.backtests import router as backtests
from service.ballast import router as ballast
from service.errors import HeadersTooLarge, problem_responses
from service.growths import router as growths
from service.jobs import router as jobs
from service.observability import router as metrics
from service.overrides import router as overrides
from service.placement import router as placement
from service.runs import router as runs
from service.simulations import router as simulations
from service.sizing import router as sizing
from service.stages import router as stages
from service.ui.routes import router as ui_router

api_router = APIRouter()
api_router.include_router(health.router)
api_router.include_router(metrics.router)
api_router.include_router(runs.router)
api_router.include_router(overrides.router)
api_router.include_router(sizing.router)
api_router.include_router(stages.router)
api_router.include_router(placement.router)
api_router.include_router(simulations.router)
api_router.include_router(ballast.router)
api_router.include_router(backtests.router)
api_router.include_router(jobs.router)
api_router.include_router(growths.router)

#: Every route an app serves (the API, then the operator's page), included once per process.
#: FastAPI builds an included router's routes (dependencies, parameters, response models) on the
#: first request of each app it is included in: about 0.1 s of CPU for this API. The apps of one
#: process (the test suite makes one per test) share these objects and so build them once.
#: The holder stands for the app in FastAPI's include: it carries the app's own responses (every
#: operation may answer 431, before routing: service/connections.py), and no
#: ``dependency_overrides_provider``, so ``app.dependency_overrides`` does not apply (nothing here uses it).
APP_RESPONSES = problem_responses(HeadersTooLarge)
_included = APIRouter(responses=APP_RESPONSES)
_included.include_router(api_router)
_included.include_router(ui_router)


def app_routes() -> list[BaseRoute]:
    """The routes ``create_app`` adds to each app: the same objects every time."""
    return list(_included.routes)
