"""Alembic on both databases: upgrade to head, downgrade to base, upgrade again; models match."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.engine import make_url
from sqlmodel import SQLModel

from service import migrations
from service.db import build_engine

from .conftest import _admin
from .pg import PostgresServer


async def _tables_and_diff(url: str) -> tuple[set[str], list[object]]:
    engine = build_engine(url)
    try:
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
            diff = await conn.run_sync(
                lambda c: compare_metadata(
                    MigrationContext.configure(c, opts={"compare_type": True}),
                    SQLModel.metadata,
                )
            )
    finally:
        await engine.dispose()
    return tables, diff


def _round_trip(url: str) -> None:
    migrations.upgrade(url)
    tables, diff = asyncio.run(_tables_and_diff(url))
    assert {"jobs", "runs", "run_containers", "overrides", "alembic_version"} <= tables
    assert diff == [], f"models and migrations differ: {diff}"
    migrations.downgrade(url, "base")
    tables, _ = asyncio.run(_tables_and_diff(url))
    assert tables <= {"alembic_version"}
    migrations.upgrade(url)
    tables, _ = asyncio.run(_tables_and_diff(url))
    assert "runs" in tables


def test_sqlite_upgrade_downgrade(tmp_path: pytest.TempPathFactory) -> None:
    _round_trip(f"sqlite+aiosqlite:///{tmp_path}/m.db")  # type: ignore[operator]


def test_postgresql_upgrade_downgrade(postgres_server: PostgresServer) -> None:
    name = f"ci_sizer_mig_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(postgres_server.url, f'CREATE DATABASE "{name}"'))
    try:
        _round_trip(make_url(postgres_server.url).set(database=name).render_as_string(hide_password=False))
    finally:
        asyncio.run(_admin(postgres_server.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
