"""How long a full collection of the heap holds the event loop as the answer cache fills (issue 38).

Python's collector walks every object it tracks in a full (generation 2) collection, and holds the
GIL, so every request in flight waits for it. The start-up heap is frozen (``main._freeze_startup_heap``),
but each cached answer is a tree of objects the collector tracks. This script fills a SQLite file with
``--jobs`` jobs through the API, starts the app in process (its lifespan, its caches), asks for every job
with one parameter set after another (each set is a cache entry of its own), and after each pass times
``gc.collect()`` (the median of three), beside the same collection with the cache empty, at start.

    python bench/gcpause.py [--jobs 3000] [--sets 6]

It prints figures; nothing here is a target. How often a full collection comes is Python's rule: once
ten young collections have passed and the objects promoted since the last full one exceed a quarter of
those it kept (docs/performance.md, "Stalls found in the build path", section 7).
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from typing import Any

from bench import _load
from bench.http import filled_sqlite

#: the parameter sets asked for, one pass each (each a cache entry per job)
SETS = ["", "runs=3", "runs=4", "buffer=0", "runs=7", "runs=9", "runs=11", "runs=13"]


def full_collection_ms() -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def measure(url: str, jobs: int, sets: int) -> list[tuple[int, int, float]]:
    from service.main import create_app
    from service.observability import logs
    from service.settings import Settings

    logs.configure("warning", batched=True)
    app = create_app(Settings(database_url=url, log_level="warning"))
    paths = [_load.sizing_path(i).split("?")[0] for i in range(jobs)]

    async def get(path: str, query: str) -> None:
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
            "root_path": "", "headers": [(b"host", b"bench")], "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80), "state": {},
        }  # fmt: skip
        status: list[int] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await app(scope, receive, send)
        assert status == [200], (path, query, status)

    rows = []
    async with app.router.lifespan_context(app):
        cache = app.state.answers

        def entries() -> int:
            return sum(len(slot.entries) for slot in cache._slots.values())

        rows.append((0, len(gc.get_objects()), full_collection_ms()))
        for query in SETS[:sets]:
            for path in paths:
                await get(path, query)
            rows.append((entries(), len(gc.get_objects()), full_collection_ms()))
            print(f"  {rows[-1][0]:,} answers cached", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--sets", type=int, default=6, help=f"parameter sets asked for (at most {len(SETS)})")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        url = filled_sqlite(Path(tmp_name), "gcpause.db", args.jobs)
        rows = asyncio.run(measure(url, args.jobs, min(args.sets, len(SETS))))
    print()
    print(f"{'answers cached':>15}{'tracked objects':>17}{'full collection ms':>20}{'objects an answer':>19}")
    for answers, objects, ms in rows:
        each = f"{(objects - rows[0][1]) / answers:.1f}" if answers else "-"
        print(f"{answers:>15,}{objects:>17,}{ms:>20.1f}{each:>19}")


if __name__ == "__main__":
    main()
