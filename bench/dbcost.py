"""What the build path costs PostgreSQL per request, counted rather than timed (issue 38): figures
that do not move with the machine's noise.

A live ``ci-sizer serve`` (one worker) on a database loaded as bench/mixed.py loads it, driven by one
client, one request at a time, in phases; for each phase the WAL it wrote is read back with
``pg_waldump`` between the phase's first and last LSN (records, full-page images and bytes by record
type and by table, commit records), and ``pg_stat_statements`` (when the server preloads it) says
which statements ran, how often, and what WAL each wrote. The phases:

- ``idle``: nothing asked, the background passes alone (per second);
- ``posts after checkpoint``: a ``CHECKPOINT``, then N POSTs of new runs (the first write of every page
  after a checkpoint logs the whole page);
- ``posts``: N more POSTs right after (no checkpoint in between);
- ``gets``: one GET of each job's sizing (each a miss: the POSTs invalidated every answer);
- ``idle after``: nothing asked again, the background passes catching up with the POSTs (per second);
- ``postgresql alone``: N one-row inserts, each committed (bench/mixed.py's floor), for reference.

The bare app of bench/mixed.py asks nothing of PostgreSQL: zero on every line.

    python bench/dbcost.py --database-url postgresql://postgres@127.0.0.1:55438/postgres \\
        --waldir /tmp/cluster/pg_wal [--posts 1000] [--jobs 300] [--idle-seconds 30]

``--waldir``: the server's ``pg_wal`` directory (readable from here: a local throwaway cluster,
``initdb`` + ``pg_ctl`` with ``shared_preload_libraries = 'pg_stat_statements'``); without it only
``pg_stat_statements`` and the LSN difference are reported.
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import http.client
import re
import subprocess
import time
from collections import Counter
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from bench import _load
from bench.mixed import run_body
from tests.live import LiveServer
from tests.pg import find_pg_bin

STATEMENTS = """
SELECT s.queryid, s.calls, s.rows, s.wal_records, s.wal_fpi, s.wal_bytes::bigint AS wal_bytes,
    CASE WHEN s.query LIKE '%typeinfo_tree%' THEN 'asyncpg: WITH RECURSIVE typeinfo_tree ...'
        ELSE left(regexp_replace(s.query, '\\s+', ' ', 'g'), 90) END AS query
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1
"""


_RECORD = re.compile(r"^rmgr: (\S+)\s+len \(rec/tot\):\s+(\d+)/\s*(\d+), tx:.*?desc: (\S+)(.*)$")
_BLOCK = re.compile(r"blkref #\d+: rel \d+/\d+/(\d+)(?: fork \w+)? blk \d+( FPW)?")


def waldump(waldir: str, start: str, end: str, names: dict[int, str]) -> dict[str, Any]:
    """The WAL between two LSNs: records, FPIs and bytes by record type and by table, commits."""
    binary = find_pg_bin("pg_waldump")
    assert binary is not None, "pg_waldump not found"
    done = subprocess.run([binary, "-p", waldir, "-s", start, "-e", end], capture_output=True, text=True, check=False)
    if done.returncode != 0 and start != end:  # (a segment already recycled: a checkpoint in the phase)
        print(f"   pg_waldump: {done.stderr.strip()[:200]}")
    out = done.stdout
    records = fpi = total = commits = 0
    by_type: Counter[str] = Counter()
    by_type_bytes: Counter[str] = Counter()
    fpi_by_table: Counter[str] = Counter()
    records_by_table: Counter[str] = Counter()
    for line in out.splitlines():
        m = _RECORD.match(line)
        if not m:
            continue
        rmgr, _rec, tot, desc, rest = m.groups()
        kind = f"{rmgr}/{desc.rstrip(':')}"
        records += 1
        total += int(tot)
        by_type[kind] += 1
        by_type_bytes[kind] += int(tot)
        if kind == "Transaction/COMMIT":
            commits += 1
        seen: set[str] = set()
        for node, fpw in _BLOCK.findall(rest):
            table = names.get(int(node), f"rel {node}")
            if table not in seen:
                records_by_table[table] += 1
                seen.add(table)
            if fpw:
                fpi += 1
                fpi_by_table[table] += 1
    return {
        "records": records,
        "fpi": fpi,
        "bytes": total,
        "commits": commits,
        "by_type": by_type,
        "by_type_bytes": by_type_bytes,
        "fpi_by_table": fpi_by_table,
        "records_by_table": records_by_table,
    }


class Meter:
    """Snapshots of one database's counters, on a connection of its own."""

    def __init__(self, dsn: str, database: str, waldir: str | None) -> None:
        self.dsn = dsn
        self.database = database
        self.waldir = waldir
        self.conn: Any = None
        self.pgss = False
        self.names: dict[int, str] = {}

    async def open(self) -> None:
        self.conn = await asyncpg.connect(self.dsn)
        preload = await self.conn.fetchval("SHOW shared_preload_libraries")
        if "pg_stat_statements" in preload:
            await self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            self.pgss = True
        rows = await self.conn.fetch(
            "SELECT pg_relation_filenode(c.oid) AS node, c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i', 't')"
        )
        self.names = {row["node"]: row["relname"] for row in rows if row["node"] is not None}
        # toast tables and their indexes by their owner's name
        rows = await self.conn.fetch(
            "SELECT pg_relation_filenode(t.oid) AS node, c.relname FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
        )
        self.names.update({row["node"]: f"{row['relname']} (toast)" for row in rows})

    async def snapshot(self) -> dict[str, Any]:
        c = self.conn
        lsn = await c.fetchval("SELECT pg_current_wal_insert_lsn()::text")
        # an asynchronous commit (the announcements') reaches the disk within three wal_writer_delay, and
        # pg_waldump reads only what is there
        for _ in range(50):
            if await c.fetchval("SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn", lsn):
                break
            await asyncio.sleep(0.05)
        snap: dict[str, Any] = {"at": time.monotonic(), "lsn": lsn}
        snap["bgwriter"] = dict(
            await c.fetchrow("SELECT checkpoints_timed, checkpoints_req, buffers_checkpoint FROM pg_stat_bgwriter")
        )
        snap["statements"] = (
            {row["queryid"]: dict(row) for row in await c.fetch(STATEMENTS, self.database)} if self.pgss else {}
        )
        return snap

    def between(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"seconds": b["at"] - a["at"]}
        out["checkpoints"] = sum(b["bgwriter"][k] - a["bgwriter"][k] for k in ("checkpoints_timed", "checkpoints_req"))
        out["wal"] = waldump(self.waldir, a["lsn"], b["lsn"], self.names) if self.waldir else None
        statements = []
        for qid, row in b["statements"].items():
            before = a["statements"].get(qid, {})
            calls = row["calls"] - before.get("calls", 0)
            if calls <= 0:
                continue
            statements.append(
                {
                    "query": row["query"],
                    "calls": calls,
                    **{k: row[k] - before.get(k, 0) for k in ("rows", "wal_records", "wal_fpi", "wal_bytes")},
                }
            )
        out["statements"] = sorted(statements, key=lambda s: (-s["wal_bytes"], -s["calls"]))
        return out


def report(name: str, figures: dict[str, Any], per: float, unit: str) -> None:
    wal = figures["wal"]
    print(f"\n== {name}: {figures['seconds']:.1f} s, checkpoints {figures['checkpoints']}; per {unit} ({per:g}):")
    if wal is not None:
        print(
            f"   commit records {wal['commits'] / per:.3f}, WAL records {wal['records'] / per:.2f}, "
            f"full-page images {wal['fpi'] / per:.3f}, WAL bytes {wal['bytes'] / per:,.0f}"
        )
        for kind, n in wal["by_type"].most_common(12):
            print(f"     {n / per:8.3f} {kind:<28} {wal['by_type_bytes'][kind] / per:>10,.0f} B")
        if wal["fpi_by_table"]:
            print(
                "   full-page images by table/index: "
                + ", ".join(f"{t} {n / per:.3f}" for t, n in wal["fpi_by_table"].most_common(8))
            )
        print(
            "   records by table/index: "
            + ", ".join(f"{t} {n / per:.2f}" for t, n in wal["records_by_table"].most_common(10))
        )
    lookups = sum(s["calls"] for s in figures["statements"] if "typeinfo_tree" in s["query"])
    print(f"   asyncpg's catalog type lookups (typeinfo_tree): {lookups}")
    if figures["statements"]:
        calls = sum(s["calls"] for s in figures["statements"])
        print(f"   statements {calls / per:.2f} (pg_stat_statements; BEGIN/COMMIT counted where explicit):")
        for s in figures["statements"][:14]:
            print(
                f"     {s['calls'] / per:8.3f} calls  WAL {s['wal_records'] / per:7.2f} rec {s['wal_fpi'] / per:6.3f} fpi "
                f"{s['wal_bytes'] / per:>9,.0f} B  {s['query']}"
            )


def drive(url: str, body: bytes, jobs: int, n: int, tag: str, *, post: bool, offset: int = 0) -> None:
    host, _, port = url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for i in range(offset, offset + n):
            org, repo, workflow, job = _load.job_key(i % jobs)
            if post:
                identity = (
                    f'"org": "{org}", "repo": "{repo}", "workflow": "{workflow}", "job": "{job}", "run_id": "{tag}-{i}"'
                )
                conn.request(
                    "POST",
                    "/api/v1/runs",
                    body.replace(b"@JOB@", identity.encode()),
                    {"Content-Type": "application/json"},
                )
                expected = 201
            else:
                conn.request("GET", _load.sizing_path(i % jobs))
                expected = 200
            r = conn.getresponse()
            r.read()
            if r.status != expected:
                raise RuntimeError(f"answered {r.status}")
    finally:
        conn.close()


async def floor(dsn: str, n: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, at timestamptz)")
        for _ in range(n):
            await conn.execute("INSERT INTO bench_floor (at) VALUES (now())")
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="a PostgreSQL server")
    parser.add_argument("--database-name", default="ci_sizer_bench_dbcost")
    parser.add_argument("--waldir", help="the server's pg_wal directory (for pg_waldump)")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--runs-per-job", type=int, default=20)
    parser.add_argument("--posts", type=int, default=1000)
    parser.add_argument("--idle-seconds", type=float, default=30)
    parser.add_argument("--settle-seconds", type=float, default=15, help="after the start, before measuring")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="the server's environment")
    parser.add_argument("--log", help="keep the server's log here")
    args = parser.parse_args()

    url = _load.run(_load.fresh_database(args.database_url, args.database_name))
    _load.run(_load.load(url, jobs=args.jobs, runs_per_job=args.runs_per_job))
    dsn = url.replace("postgresql+asyncpg://", "postgresql://")
    meter = Meter(dsn, args.database_name, args.waldir)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(meter.open())
    body = run_body()
    env = dict(a.split("=", 1) for a in args.env)
    log = Path(args.log) if args.log else None
    started = loop.run_until_complete(meter.snapshot())
    server = LiveServer(url, "--log-level", "info", log=log, env=env)
    try:  # stopped even after a failed start: a server left running would write to the next run's database
        server.start(timeout=300)  # (a busy shared machine took over a minute)
        time.sleep(args.settle_seconds)
        settled = loop.run_until_complete(meter.snapshot())
        report("start-up and settling", meter.between(started, settled), 1, "start")

        def phase(name: str, per: float, unit: str, work: Any, *, checkpoint: bool = False) -> None:
            if checkpoint:
                loop.run_until_complete(meter.conn.execute("CHECKPOINT"))
            a = loop.run_until_complete(meter.snapshot())
            work()
            b = loop.run_until_complete(meter.snapshot())
            report(name, meter.between(a, b), per, unit)

        phase("idle", args.idle_seconds, "second", lambda: time.sleep(args.idle_seconds), checkpoint=True)
        phase(
            "posts after checkpoint",
            args.posts,
            "POST",
            lambda: drive(server.url, body, args.jobs, args.posts, "a", post=True),
            checkpoint=True,
        )
        phase("posts", args.posts, "POST", lambda: drive(server.url, body, args.jobs, args.posts, "b", post=True))
        phase("gets (misses)", args.jobs, "GET", lambda: drive(server.url, body, args.jobs, args.jobs, "", post=False))
        phase("idle after", args.idle_seconds, "second", lambda: time.sleep(args.idle_seconds))
    finally:
        server.stop()
    phase_floor_a = loop.run_until_complete(meter.snapshot())
    loop.run_until_complete(floor(dsn, args.posts))
    phase_floor_b = loop.run_until_complete(meter.snapshot())
    report(
        "postgresql alone (one-row insert, committed)",
        meter.between(phase_floor_a, phase_floor_b),
        args.posts,
        "insert",
    )
    loop.run_until_complete(meter.conn.close())
    loop.close()


if __name__ == "__main__":
    main()
