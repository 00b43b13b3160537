"""Each job's build-path state on PostgreSQL (table ``job_state``, migration 0006): the facts about
all of its stored runs that its answers and its org's prior need, kept by every write of its runs,
so that neither a build's GET nor a run's POST scans the job's runs for them.

A row holds, over the job's stored runs:

- ``runs``: how many there are (retention prunes only the jobs over its bound);
- ``clean_runs``: how many are clean (rule S4's ``clean_samples``); NULL marks the row **invalid**
  (rebuild it from the runs; until then its readers count the runs themselves);
- ``samples``: how many are samples of the efficient policy (rule E1: no container killed), so that a
  run's POST knows whether it brings its job's first sample (rule E6) without looking at other runs;
- ``node_memory_*``: the newest one (by ``finished_at``, then id) that reported its node's memory (S15).

Each is a count or a maximum, so a new run is merged into the row whatever order runs arrive in.

Who writes it, and why it stays exact:

- a new run's POST (``runs/fastpath.py``) merges the run into the row in the same statement that
  stores it (``upsert_sql``): an upsert, so it holds the row's lock and merges into its latest
  version. A job created by that statement gets its row there; a job that existed without one gets
  an invalid row (its other runs are not counted in it);
- every other write of a job's runs (the route's ingest and batch, retention) and the repair of
  invalid or missing rows rebuild the row from the stored runs (``rebuild``): it first makes sure the
  row exists and locks it, so no POST can merge meanwhile, then counts the runs with a snapshot that
  sees every run stored before.

Rows are written on PostgreSQL only; SQLite's routes count the runs. Runs changed by hand in the
database bypass it: mark the job's row invalid (``UPDATE job_state SET clean_runs = NULL``) and the
next read has it rebuilt.
"""

from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.observability.metrics import DATABASE_ERRORS

log = logging.getLogger("ci_sizer.sizing")

#: a stored run ``r`` is a sample of the efficient policy (rule E1): clean, or no container killed
#: (``priors.killed``); a scalar subquery, so that PostgreSQL probes the run's containers by index
SAMPLE_SQL = (
    "(r.clean OR NOT coalesce((SELECT bool_or(c.oom_killed OR c.oom_kill_events > 0 OR (c.memory_limit_bytes "
    "IS NOT NULL AND c.memory_peak_bytes > c.memory_limit_bytes)) FROM run_containers AS c WHERE c.run_pk = r.id), "
    "false))"
)

#: columns of the POST's upsert (``runs/fastpath.py``), in this order
COLUMNS = "job_id, version, runs, clean_runs, samples, node_memory_bytes, node_memory_at, node_memory_run"


def upsert_sql(*, clean: str, sample: str, node_memory: str, finished_at: str) -> str:
    """``ON CONFLICT`` of the POST's upsert: one more run merged into the row's latest version
    (``EXCLUDED.node_memory_run``: the new run's id when it reported its node's memory)."""
    newer = (
        f"EXCLUDED.node_memory_run IS NOT NULL AND (s.node_memory_run IS NULL "
        f"OR ({finished_at}, EXCLUDED.node_memory_run) > (s.node_memory_at, s.node_memory_run))"
    )
    return f"""ON CONFLICT (job_id) DO UPDATE SET
        version = s.version + 1,
        runs = s.runs + 1,
        clean_runs = s.clean_runs + CASE WHEN {clean} THEN 1 ELSE 0 END,
        samples = s.samples + CASE WHEN {sample} THEN 1 ELSE 0 END,
        node_memory_bytes = CASE WHEN {newer} THEN {node_memory} ELSE s.node_memory_bytes END,
        node_memory_at = CASE WHEN {newer} THEN {finished_at} ELSE s.node_memory_at END,
        node_memory_run = CASE WHEN {newer} THEN EXCLUDED.node_memory_run ELSE s.node_memory_run END"""


# make sure each job has a row (an invalid one where none was) and lock the rows, in id order (two
# rebuilders of overlapping jobs wait for each other instead of deadlocking); then count. :ids the
# jobs' ids
_LOCK = [
    text(
        "INSERT INTO job_state (job_id, version) SELECT id, 0 FROM jobs WHERE id = ANY(CAST(:ids AS bigint[])) "
        "ORDER BY id ON CONFLICT (job_id) DO NOTHING"
    ),
    text("SELECT job_id FROM job_state WHERE job_id = ANY(CAST(:ids AS bigint[])) ORDER BY job_id FOR UPDATE"),
]
_REBUILD = text(f"""
UPDATE job_state AS s SET version = s.version + 1, runs = x.runs, clean_runs = x.clean_runs, samples = x.samples,
    node_memory_bytes = x.node_memory_bytes, node_memory_at = x.node_memory_at, node_memory_run = x.node_memory_run
FROM (
    SELECT j.id,
        (SELECT count(*) FROM runs AS r WHERE r.job_id = j.id) AS runs,
        (SELECT count(*) FROM runs AS r WHERE r.job_id = j.id AND r.clean) AS clean_runs,
        (SELECT count(*) FROM runs AS r WHERE r.job_id = j.id AND {SAMPLE_SQL}) AS samples,
        nm.node_memory_bytes, nm.finished_at AS node_memory_at, nm.id AS node_memory_run
    FROM jobs AS j
    LEFT JOIN LATERAL (
        SELECT r.node_memory_bytes, r.finished_at, r.id FROM runs AS r
        WHERE r.job_id = j.id AND r.node_memory_bytes IS NOT NULL
        ORDER BY r.finished_at DESC, r.id DESC LIMIT 1
    ) AS nm ON true
    WHERE j.id = ANY(CAST(:ids AS bigint[]))
) AS x
WHERE s.job_id = x.id
""")


async def rebuild(*, conn: AsyncConnection, job_ids: list[int]) -> None:
    """Rebuild these jobs' rows from their stored runs, in the caller's transaction (PostgreSQL
    only; nothing on SQLite). Called after any write of runs but the POST's merge."""
    if conn.dialect.name != "postgresql" or not job_ids:
        return
    params = {"ids": sorted(set(job_ids))}
    for statement in _LOCK:
        await conn.execute(statement, params)
    await conn.execute(_REBUILD, params)


_OVER = text(
    "SELECT j.id FROM jobs AS j LEFT JOIN job_state AS s ON s.job_id = j.id "
    "WHERE j.id = ANY(CAST(:ids AS bigint[])) AND (s.clean_runs IS NULL OR s.runs > :keep)"
)


async def over(*, conn: AsyncConnection, job_ids: list[int], keep: int) -> list[int] | None:
    """Which of these jobs may hold more than ``keep`` runs (PostgreSQL: by their rows, a job whose
    row is invalid or missing included); None on SQLite, where no row is kept."""
    if conn.dialect.name != "postgresql":
        return None
    return [row[0] for row in await conn.execute(_OVER, {"ids": job_ids, "keep": keep})]


_INVALID = text(
    "SELECT j.id FROM jobs AS j LEFT JOIN job_state AS s ON s.job_id = j.id "
    "WHERE (s.job_id IS NULL OR s.clean_runs IS NULL) AND j.id > :after ORDER BY j.id LIMIT :limit"
)


class StateRepair:
    """Rebuilds the rows a read found invalid or missing (noted by the build path), and once per
    process every job's that is (jobs stored before migration 0006, or by other means than the
    service). Off the request path: until then, readers count the job's runs themselves."""

    BATCH = 500

    def __init__(self) -> None:
        self.pending: set[int] = set()
        self.scanned = False

    def note(self, job_id: int) -> None:
        self.pending.add(job_id)

    async def scan(self, engine: AsyncEngine) -> int:
        """Rebuild every invalid or missing row, a batch of jobs per transaction; how many."""
        repaired, after = 0, 0
        while True:
            async with engine.begin() as conn:
                found = await conn.execute(_INVALID, {"after": after, "limit": self.BATCH})
                ids = [row[0] for row in found]
                await rebuild(conn=conn, job_ids=ids)
            repaired += len(ids)
            if len(ids) < self.BATCH:
                return repaired
            after = ids[-1]

    async def run_once(self, engine: AsyncEngine) -> int:
        """The scan once per process, then the noted jobs; a failed pass keeps them noted."""
        if engine.dialect.name != "postgresql":
            return 0
        if not self.scanned:
            try:
                found = await self.scan(engine)
            except Exception as exc:  # tried again at the next pass
                DATABASE_ERRORS.inc()
                log.warning("build-path state scan failed: %s", type(exc).__name__)
                return 0
            self.scanned = True
            if found:
                log.info("build-path state rebuilt for %d job(s)", found)
        jobs, self.pending = sorted(self.pending), set()
        repaired = 0
        for start in range(0, len(jobs), self.BATCH):  # a bounded transaction each
            batch = jobs[start : start + self.BATCH]
            try:
                async with engine.begin() as conn:
                    await rebuild(conn=conn, job_ids=batch)
            except Exception as exc:
                DATABASE_ERRORS.inc()
                log.warning("build-path state repair failed: %s", type(exc).__name__)
                self.pending.update(jobs[start:])
                break
            repaired += len(batch)
        return repaired
