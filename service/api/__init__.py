"""One aggregator includes every router (overrides before sizing: their paths overlap)."""

from fastapi import APIRouter

from service.backtests import router as backtests
from service.ballast import router as ballast
from service.simulations import router as simulations

from . import health, jobs, metrics, overrides, placement, runs, sizing, stages

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
