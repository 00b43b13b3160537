"""Alembic environment: async, the same engine builder as the app, batch mode on SQLite.

The URL comes from ``config.attributes["database_url"]`` (set by ``ci-sizer migrate`` and the
tests), else from the service settings (``CI_SIZER_DATABASE_URL``).
"""

from __future__ import annotations

import asyncio

from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

import service.tables  # noqa: F401  (defines the tables on SQLModel.metadata)
from alembic import context
from service.db import build_engine
from service.settings import get_settings, normalize_database_url

config = context.config
target_metadata = SQLModel.metadata


def _url() -> str:
    url = config.attributes.get("database_url")
    if url is None:
        return get_settings().database_url
    return normalize_database_url(str(url))


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = build_engine(_url(), poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_configure)
    finally:
        await engine.dispose()


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=_url().startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(_run_async())
