"""Write ``bench/RESULTS.md`` from the JSON the bench scripts leave with ``--results``.

python bench/report.py bench/out/*.json > bench/RESULTS.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TITLES = {
    "mixed": "Headline: the build path as runners use it, half POST runs and half GET sizing (bench/mixed.py)",
    "mixed-workers": "Scaling: the same mix with 2 uvicorn workers, both apps (bench/mixed.py --workers 2)",
    "mixed-replicas": "Scaling: the same mix on 2 replicas sharing one PostgreSQL, both apps (bench/mixed.py --replicas 2)",
    "core": "Core: six stats and per-container arithmetic (bench/core.py)",
    "http": "HTTP: GET sizing on a warm answer cache (every job asked before) vs a bare FastAPI app (bench/http.py)",
    "http-sqlite": "HTTP on SQLite: the cold start beside a bare FastAPI app (bench/http.py --sqlite [--baseline])",
    "history": "History size: 1,000 vs 1,000,000 stored runs (bench/history.py)",
    "ingest": "Ingest: POST runs of 3,600 samples vs a bare FastAPI app (bench/ingest.py)",
    "placement": "Placement: scoring 5,000 nodes x 50 pods, Cython vs reference (bench/placement.py)",
    "backtest": "Backtest: a year of history for 1,000 jobs at 20 runs a day (bench/backtest.py)",
    "ui": "Operator's page and GET /api/v1/jobs at 10,000 jobs (bench/ui.py)",
    "ui-sqlite": "Operator's page and GET /api/v1/jobs at 10,000 jobs on SQLite (bench/ui.py --sqlite)",
    "pgpool": "Connection pool: service.pgpool (no reset on release) vs asyncpg's Pool (bench/pgpool.py)",
}
ORDER = [
    "mixed",
    "mixed-workers",
    "mixed-replicas",
    "core",
    "http",
    "http-sqlite",
    "history",
    "ingest",
    "pgpool",
    "placement",
    "backtest",
    "ui",
    "ui-sqlite",
]


def table(rows: list[dict[str, object]]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    lines = ["| " + " | ".join(c.replace("_", " ") for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return lines


def main() -> None:
    results = [json.loads(Path(p).read_text()) for p in sys.argv[1:]]
    results.sort(key=lambda r: ORDER.index(r["bench"]) if r["bench"] in ORDER else len(ORDER))
    if not results:
        sys.exit("no results given")
    out = [
        "# Benchmark results",
        "",
        "Written by `make bench` (bench/report.py); every figure is a ratio or a pair measured side by side in",
        "the same run, because the machine is shared and noisy. Latencies in ms, core timings in microseconds.",
        "",
        f"- Machine: {results[0]['machine']}",
        f"- Date: {results[0]['date']}",
        "",
    ]
    for r in results:
        out += [f"## {TITLES.get(r['bench'], r['bench'])}", "", *table(r["rows"]), ""]
        out += [f"- {note}" for note in r.get("notes", [])]
        if r.get("notes"):
            out.append("")
    print("\n".join(out).rstrip() + "\n")


if __name__ == "__main__":
    main()
