"""One aggregator includes every router (overrides before sizing: their paths overlap)."""

from fastapi import APIRouter

from service import health
from service.backtests import router as backtests
from service.ballast import router as ballast
from service.growths import router as growths
from service.jobs import router as jobs
from service.observability import router as metrics
from service.overrides import router as overrides
from service.placement import router as placement
from service.runs import router as runs
from service.simulations import router as simulations
from service.sizing import router as sizing
from service.stages import router as stages

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
