"""Migration 0007 (issue 40) on both databases: ``run_growths``, the growth events stored with their runs.
Upgrade from 0006 with runs in place, store events, check the schema against ``service/tables.py``
(``RunGrowth``), the cascade with the run and the one-event-once key; downgrade to 0006 (runs survive),
upgrade again."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from service import migrations

from .test_migration_0005 import _inspect, _write, empty_postgresql  # noqa: F401 (a fixture)

BIG = 5 << 40  # past 32 bits
T = datetime(2026, 11, 20, 10)
JOB = (
    "INSERT INTO jobs (id, org, repo, workflow, job, created_at) VALUES (1, 'acme', 'web', 'ci.yml', 'build', :t)",
    {"t": T},
)
RUNS = [
    (
        "INSERT INTO runs (id, job_id, run_id, finished_at, ingested_at, clean, content_hash) "
        f"VALUES ({n}, 1, 'run-{n}', :t, :t, true, 'h{n}')",
        {"t": T},
    )
    for n in (1, 2)
]
GROWTH = (
    "INSERT INTO run_growths (run_pk, position, seq, at, from_bytes, to_bytes, result) "
    "VALUES (:run, 0, :seq, :t, :frm, :to, :result)"
)


def _round_trip(url: str) -> None:
    migrations.upgrade(url, "0006")
    asyncio.run(_write(url, JOB, *RUNS))  # runs stored before 0007 exists

    migrations.upgrade(url, "0007")
    found = asyncio.run(_inspect(url, at="0007"))
    assert found["diff"] == [], f"migration 0007 and service/tables.py differ: {found['diff']}"
    assert {c: v["nullable"] for c, v in found["columns"]["run_growths"].items()} == {
        "id": False,
        "run_pk": False,
        "position": False,
        "seq": False,
        "at": False,
        "from_bytes": False,
        "to_bytes": False,
        "result": False,
    }
    asyncio.run(
        _write(
            url,
            (GROWTH, {"run": 1, "seq": 0, "t": T, "frm": 1 << 30, "to": BIG, "result": "grown"}),
            (GROWTH, {"run": 1, "seq": 1, "t": T, "frm": BIG, "to": BIG, "result": "too_late"}),
            (GROWTH, {"run": 2, "seq": 0, "t": T, "frm": 1 << 30, "to": 2 << 30, "result": "deferred"}),
        )
    )
    rows = asyncio.run(_inspect(url, "SELECT run_pk, seq, to_bytes, result FROM run_growths ORDER BY id"))["rows"]
    assert rows == [(1, 0, BIG, "grown"), (1, 1, BIG, "too_late"), (2, 0, 2 << 30, "deferred")]
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):  # one event once
        asyncio.run(_write(url, (GROWTH, {"run": 1, "seq": 0, "t": T, "frm": 1, "to": 2, "result": "error"})))
    asyncio.run(_write(url, ("DELETE FROM runs WHERE id = 1", {})))  # retention: the events go with the run
    assert asyncio.run(_inspect(url, "SELECT run_pk FROM run_growths"))["rows"] == [(2,)]

    migrations.downgrade(url, "0006")
    found = asyncio.run(_inspect(url, "SELECT run_id FROM runs"))
    assert "run_growths" not in found["tables"]
    assert found["rows"] == [("run-2",)]  # the runs survive the downgrade

    migrations.upgrade(url)
    found = asyncio.run(_inspect(url, "SELECT count(*) FROM run_growths", at_head=True))
    assert found["diff"] == []
    assert found["rows"] == [(0,)]


def test_sqlite(tmp_path: pytest.TempPathFactory) -> None:
    _round_trip(f"sqlite+aiosqlite:///{tmp_path}/m.db")  # type: ignore[operator]


def test_postgresql(request: pytest.FixtureRequest) -> None:
    _round_trip(request.getfixturevalue("empty_postgresql"))  # test_migration_0005's: a fresh database
