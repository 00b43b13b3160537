"""Typed dependency aliases for what the app keeps in ``app.state`` (built by the lifespan in
``main.py``): routes ask for ``SettingsDep``, ``EngineDep``, ``AnswersDep``... and never read
``request.app.state`` themselves."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncEngine

from service.analyses import Room
from service.auth import TokenStore
from service.cache import AnswerCache
from service.changes import Notifier
from service.jobs.summaries import SummaryRefresher
from service.observability.fleet import FleetTracker
from service.runs.bodies import Reducer
from service.runs.retention import Pruner
from service.runs.service import JobIds
from service.settings import Settings
from service.sizing.service import Policy


def settings(request: Request) -> Settings:
    return cast(Settings, request.app.state.settings)


def engine(request: Request) -> AsyncEngine:
    """The read engine (PostgreSQL: the pool sized for reads; SQLite: the one engine)."""
    return cast(AsyncEngine, request.app.state.engine)


def write_engine(request: Request) -> AsyncEngine:
    return cast(AsyncEngine, request.app.state.write_engine)


def tokens(request: Request) -> TokenStore:
    return cast(TokenStore, request.app.state.tokens)


def answers(request: Request) -> AnswerCache:
    return cast(AnswerCache, request.app.state.answers)


def policy(request: Request) -> Policy:
    """The sizing policy the settings and the runner ceilings configure."""
    state = request.app.state
    return Policy.of(state.settings, state.ceilings)


def fleet(request: Request) -> FleetTracker:
    return cast(FleetTracker, request.app.state.fleet)


def notifier(request: Request) -> Notifier | None:
    """The worker's announcer of committed runs (PostgreSQL; None on SQLite)."""
    found: Notifier | None = getattr(request.app.state, "notifier", None)
    return found


def summaries(request: Request) -> SummaryRefresher:
    return cast(SummaryRefresher, request.app.state.summaries)


def pruner(request: Request) -> Pruner:
    return cast(Pruner, request.app.state.pruner)


def job_ids(request: Request) -> JobIds:
    return cast(JobIds, request.app.state.job_ids)


def bodies(request: Request) -> Reducer:
    return cast(Reducer, request.app.state.bodies)


def analysis_room(request: Request) -> Room:
    state = request.app.state
    return Room(
        engine=state.engine, write_engine=state.write_engine, limits=state.analysis_limits, tasks=state.analysis_tasks
    )


SettingsDep = Annotated[Settings, Depends(settings)]
EngineDep = Annotated[AsyncEngine, Depends(engine)]
WriteEngineDep = Annotated[AsyncEngine, Depends(write_engine)]
AnswersDep = Annotated[AnswerCache, Depends(answers)]
TokensDep = Annotated[TokenStore, Depends(tokens)]
PolicyDep = Annotated[Policy, Depends(policy)]
FleetDep = Annotated[FleetTracker, Depends(fleet)]
SummariesDep = Annotated[SummaryRefresher, Depends(summaries)]
NotifierDep = Annotated[Notifier | None, Depends(notifier)]
PrunerDep = Annotated[Pruner, Depends(pruner)]
JobIdsDep = Annotated[JobIds, Depends(job_ids)]
AnalysisRoomDep = Annotated[Room, Depends(analysis_room)]
