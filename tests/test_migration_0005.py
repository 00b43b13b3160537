"""Migration 0005 (issue 25) on both databases: ``overrides.sizing_policy`` (a per-scope opt-in,
NULL = inherit) and ``fleet_priors`` (rule E6's first-run prior per org, the core's
``prior_update`` state). Upgrade from 0004 with data in place, downgrade to 0004, upgrade again.
The migrated schema is compared with ``service/tables.py`` (``FleetPrior``, ``Override.sizing_policy``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import MetaData, inspect, text
from sqlalchemy.engine import make_url

from service import core, migrations
from service.db import build_engine
from service.tables import SQLModel

from .conftest import _admin
from .pg import PostgresServer

BIG_PEAK = 5 << 40  # 5 TiB: past 32 bits, so a 32-bit column would fail


#: what each migration after 0005 adds, absent before it: whole tables, and columns of older tables
LATER_TABLES = {"0006": {"job_state"}, "0007": {"run_growths"}}
LATER_COLUMNS = {"0008": {"job_summaries": {"risk", "containers"}}}


def expected_metadata(*, at: str = "0005", at_head: bool = False) -> MetaData:
    """The tables as service/tables.py declares them (overrides.sizing_policy and fleet_priors included),
    without what later migrations add (tables and columns past revision ``at``), unless ``at_head``."""
    assert "fleet_priors" in SQLModel.metadata.tables
    if at_head:
        return SQLModel.metadata
    tables = {t for rev, names in LATER_TABLES.items() if rev > at for t in names}
    columns: dict[str, set[str]] = {}
    for rev, by_table in LATER_COLUMNS.items():
        if rev > at:
            for table, names in by_table.items():
                columns.setdefault(table, set()).update(names)
    metadata = MetaData(naming_convention=SQLModel.metadata.naming_convention)
    for name, table in SQLModel.metadata.tables.items():
        if name not in tables:
            copy = table.to_metadata(metadata)
            for column in columns.get(name, ()):
                copy._columns.remove(copy.c[column])
    return metadata


async def _inspect(
    url: str,
    sql: str | None = None,
    params: dict[str, Any] | None = None,
    *,
    at: str = "0005",
    at_head: bool = False,
) -> dict[str, Any]:
    """Tables, columns, primary keys, the models-vs-database diff, and the rows ``sql`` selects."""
    engine = build_engine(url)
    try:
        async with engine.connect() as conn:

            def look(c: Any) -> dict[str, Any]:
                i = inspect(c)
                tables = set(i.get_table_names())
                return {
                    "tables": tables,
                    "columns": {t: {col["name"]: col for col in i.get_columns(t)} for t in tables},
                    "pk": {t: i.get_pk_constraint(t) for t in tables},
                    "diff": compare_metadata(
                        MigrationContext.configure(c, opts={"compare_type": True}),
                        expected_metadata(at=at, at_head=at_head),
                    ),
                }

            found = await conn.run_sync(look)
            found["rows"] = [tuple(r) for r in (await conn.execute(text(sql), params or {}))] if sql else []
    finally:
        await engine.dispose()
    return found


async def _write(url: str, *statements: tuple[str, dict[str, Any]]) -> None:
    engine = build_engine(url)
    try:
        async with engine.begin() as conn:
            for sql, params in statements:
                await conn.execute(text(sql), params)
    finally:
        await engine.dispose()


OVERRIDE = (
    "INSERT INTO overrides (scope, org, repo, workflow, job, memory_limit_bytes, created_at, updated_at, "
    "updated_by, version) VALUES ('org', 'acme', '', '', '', 1073741824, :t, :t, 'ops', 1)",
    {"t": datetime(2026, 11, 20, 10)},
)
OVERRIDES = "SELECT org, memory_limit_bytes FROM overrides ORDER BY id"


def _round_trip(url: str) -> None:
    migrations.upgrade(url, "0004")
    asyncio.run(_write(url, OVERRIDE))  # a row written before 0005 exists

    migrations.upgrade(url, "0005")
    found = asyncio.run(_inspect(url, "SELECT org, memory_limit_bytes, sizing_policy FROM overrides"))
    assert found["diff"] == [], f"migration 0005 and the expected models differ: {found['diff']}"
    assert found["rows"] == [("acme", 1 << 30, None)]  # an existing override inherits (NULL)
    policy = found["columns"]["overrides"]["sizing_policy"]
    assert policy["nullable"] is True
    assert getattr(policy["type"], "length", None) == 16
    assert "fleet_priors" in found["tables"]
    assert found["pk"]["fleet_priors"]["constrained_columns"] == ["org"]
    assert found["pk"]["fleet_priors"]["name"] in ("pk_fleet_priors", None)  # SQLite does not name it
    assert {c: v["nullable"] for c, v in found["columns"]["fleet_priors"].items()} == {
        "org": False,
        "sampled_jobs": False,
        "peak_bytes": False,
        "updated_at": False,
    }

    # the core's prior state round-trips as it is, the empty state's -1 and a peak past 32 bits included
    empty = core.PRIOR_EMPTY
    state = core.prior_update(core.prior_update(empty, BIG_PEAK, True), 1 << 20, True)
    insert = "INSERT INTO fleet_priors (org, sampled_jobs, peak_bytes, updated_at) VALUES (:o, :j, :p, :t)"
    asyncio.run(
        _write(
            url,
            (insert, {"o": "acme", "j": state[0], "p": state[1], "t": datetime(2026, 11, 25, 9)}),
            (insert, {"o": "new-org", "j": empty[0], "p": empty[1], "t": datetime(2026, 11, 25, 9)}),
            ("UPDATE overrides SET sizing_policy = 'efficient' WHERE org = 'acme'", {}),
        )
    )
    rows = asyncio.run(_inspect(url, "SELECT org, sampled_jobs, peak_bytes FROM fleet_priors ORDER BY org"))["rows"]
    assert rows == [("acme", 2, BIG_PEAK), ("new-org", 0, -1)]
    assert core.prior_read(rows[0][1:]) == 4 << 30  # two jobs: 1.5 x the 5 TiB peak, never above the 4Gi default (E6)
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):  # one row per org
        asyncio.run(_write(url, (insert, {"o": "acme", "j": 3, "p": 1, "t": datetime(2026, 11, 25, 9, 0, 1)})))

    migrations.downgrade(url, "0004")
    found = asyncio.run(_inspect(url, OVERRIDES))
    assert "fleet_priors" not in found["tables"]
    assert "sizing_policy" not in found["columns"]["overrides"]
    assert found["rows"] == [("acme", 1 << 30)]  # the override itself survives the downgrade

    migrations.upgrade(url)
    found = asyncio.run(_inspect(url, "SELECT org, sizing_policy FROM overrides", at_head=True))
    assert found["diff"] == []
    assert found["rows"] == [("acme", None)]
    assert "fleet_priors" in found["tables"]


def test_sqlite(tmp_path: pytest.TempPathFactory) -> None:
    _round_trip(f"sqlite+aiosqlite:///{tmp_path}/m.db")  # type: ignore[operator]


@pytest.fixture
def empty_postgresql(postgres_server: PostgresServer) -> Iterator[str]:
    name = f"ci_sizer_mig5_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(postgres_server.url, f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(postgres_server.url).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(_admin(postgres_server.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_postgresql(empty_postgresql: str) -> None:
    _round_trip(empty_postgresql)
