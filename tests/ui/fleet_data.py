"""A realistic fleet for the operator's page: three orgs, 56 jobs, about 600 runs over the last two
weeks, OOM kills, kills avoided by growth, sidecars (a Docker daemon, a database), a pin below what a job
uses and a CPU pin that throttles. Deterministic (seeded), posted through the API as a runner would."""

from __future__ import annotations

import itertools
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx

from service.wire import utcnow

MIB = 1 << 20
GIB = 1 << 30

#: org -> repo -> workflow -> jobs
LAYOUT: dict[str, dict[str, dict[str, list[str]]]] = {
    "acme": {
        "web": {".github/workflows/ci.yml": ["build", "test (3.11)", "test (3.12)", "lint", "e2e", "link"]},
        "api": {".github/workflows/ci.yml": ["build", "unit", "integration", "docker-image", "migrations"]},
        "mobile": {"ci.yml": ["android", "ios-sim", "bundle", "detox"]},
        "docs": {"pages.yml": ["build-site", "link-check", "spell"]},
    },
    "globex": {
        "platform": {
            ".gitlab-ci.yml": ["compile", "test-shard-1", "test-shard-2", "test-shard-3", "package", "scan"],
            "release.yml": ["sign", "publish"],
        },
        "data": {"pipeline.yml": ["spark-tests", "dbt-build", "notebook-lint", "etl-smoke", "schema-check"]},
        "infra": {"terraform.yml": ["plan", "validate", "tflint"]},
        "sdk": {".github/workflows/sdk.yml": ["go-test", "java-test", "python-test", "rust-test", "docs", "bench"]},
    },
    "initech": {
        "tps": {"Jenkinsfile": ["build", "report", "cover-sheet", "archive", "nightly"]},
        "billing": {"ci.yml": ["build", "test", "lint", "contract-tests", "load-test"]},
        "portal": {"ci.yml": ["build", "test", "storybook", "a11y", "deploy-preview", "visual-diff"]},
    },
}
#: (org, repo, workflow, job) of the job the issue describes: peaks at 6.6 GiB on every run
LINKER = ("acme", "web", ".github/workflows/ci.yml", "link")
#: jobs with a sidecar container: name, and its memory peak
SIDECARS = {
    "docker-image": ("dind", 900 * MIB),
    "integration": ("postgres", 380 * MIB),
    "spark-tests": ("minio", 260 * MIB),
}
#: jobs whose newest runs are OOM-killed (the answer backs off), and an older kill elsewhere
OOM_RECENT = {("globex", "data", "pipeline.yml", "spark-tests"), ("initech", "tps", "Jenkinsfile", "nightly")}
OOM_OLD = {("acme", "api", ".github/workflows/ci.yml", "integration"), ("initech", "portal", "ci.yml", "visual-diff")}
#: jobs whose every third run went past the limit it started with and was grown in place (issue 40's guard):
#: a kill avoided each, posted with its growth events and the limit it ended with
GROWN = {("globex", "sdk", ".github/workflows/sdk.yml", "rust-test"), ("initech", "billing", "ci.yml", "load-test")}


@dataclass
class Fleet:
    """What was posted: every job's key and its runs, to check the page against."""

    runs: list[dict[str, Any]] = field(default_factory=list)

    def jobs(self) -> list[tuple[str, str, str, str]]:
        return sorted({(r["org"], r["repo"], r["workflow"], r["job"]) for r in self.runs})


def _stats(p95: float) -> dict[str, float]:
    return {"peak": p95 * 1.3, "p99": p95 * 1.1, "p95": p95, "p75": p95 * 0.7, "p50": p95 * 0.5, "avg": p95 * 0.45}


def build(seed: int = 34, now: datetime | None = None, orgs: dict[str, str] | None = None) -> Fleet:
    """The runs of the fleet (``orgs`` renames orgs, for a test that needs its own)."""
    rnd = random.Random(seed)
    now = now or utcnow()
    fleet = Fleet()
    for org, repos in LAYOUT.items():
        for repo, workflows in repos.items():
            for workflow, jobs in workflows.items():
                for name in jobs:
                    key = (org, repo, workflow, name)
                    small = org == "acme" and repo == "web"  # the repo the 2Gi pin is meant for
                    sizes = [0.3, 0.6, 0.9, 1.4] if small else [0.3, 0.6, 0.9, 1.4, 2.2, 3.1, 4.5]
                    base = 6.6 * GIB if key == LINKER else rnd.choice(sizes) * GIB
                    # what it runs with: the next of 2, 4, 8, 16Gi above its peak with room to spare
                    room = base * rnd.uniform(1.3, 3.0)
                    limit = 16 * GIB if key == LINKER else next(g * GIB for g in (2, 4, 8, 16, 32) if g * GIB >= room)
                    p95 = rnd.choice([150, 400, 800, 1200, 1800, 2600])
                    request = rnd.choice([1000, 2000, 4000])
                    minutes = rnd.choice([6, 12, 20, 35])
                    count = rnd.randint(6, 16)
                    spacing = 13 * 24 / count  # hours: the runs spread over the last 13 days
                    for n in range(count):
                        finished = now - timedelta(hours=n * spacing * rnd.uniform(0.8, 1.2) + rnd.uniform(0, 2))
                        peak = int(base * rnd.uniform(0.85, 1.0))
                        killed = (key in OOM_RECENT and n < 2) or (key in OOM_OLD and n == count - 2)
                        if killed:
                            peak = int(limit * 0.99)
                        main: dict[str, Any] = {
                            "name": "build",
                            "cpu_stats_millicores": _stats(p95 * rnd.uniform(0.8, 1.0)),
                            "memory_peak_bytes": peak,
                            "memory_limit_bytes": limit,
                            "cpu_request_millicores": request,
                        }
                        if killed:
                            main["oom_killed"] = True
                        elif key in GROWN and n % 3 == 0:
                            # started at the limit, grew twice by a quarter when use reached 90 % of it
                            at = finished - timedelta(minutes=minutes / 2)
                            steps = [limit, limit + limit // 4, limit + limit // 2]
                            main["memory_peak_bytes"] = int(limit * 1.3)
                            main["memory_limit_bytes"] = steps[-1]
                            main["growths"] = [
                                {
                                    "at": (at + timedelta(seconds=10 * i)).isoformat() + "Z",
                                    "from_bytes": a,
                                    "to_bytes": b,
                                    "result": "grown",
                                }
                                for i, (a, b) in enumerate(itertools.pairwise(steps))
                            ]
                        containers = [main]
                        if name in SIDECARS:
                            side, side_peak = SIDECARS[name]
                            containers.append(
                                {
                                    "name": side,
                                    "cpu_stats_millicores": _stats(120),
                                    "memory_peak_bytes": int(side_peak * rnd.uniform(0.9, 1.0)),
                                    "memory_limit_bytes": 2 * GIB,
                                    "cpu_request_millicores": 500,
                                }
                            )
                        fleet.runs.append(
                            {
                                "org": (orgs or {}).get(org, org),
                                "repo": repo,
                                "workflow": workflow,
                                "job": name,
                                "run_id": f"{org}-{repo}-{name}-{n}".replace(" ", "_"),
                                "node_memory_bytes": 64 * GIB,
                                "started_at": (
                                    finished - timedelta(minutes=minutes * rnd.uniform(0.8, 1.2))
                                ).isoformat()
                                + "Z",
                                "finished_at": finished.isoformat() + "Z",
                                "containers": containers,
                            }
                        )
    return fleet


def post(url: str, headers: dict[str, str], fleet: Fleet, *, size: int = 60, parallel: int = 4) -> None:
    """Every run through ``POST /api/v1/runs:batch``: batches of about ``size`` runs, each job's runs in
    one batch, ``parallel`` batches at a time (as several runners post at once)."""
    batches: list[list[dict[str, Any]]] = [[]]
    for job in fleet.jobs():
        if len(batches[-1]) >= size:
            batches.append([])
        batches[-1] += [r for r in fleet.runs if (r["org"], r["repo"], r["workflow"], r["job"]) == job]

    def send(batch: list[dict[str, Any]]) -> None:
        r = httpx.post(f"{url}/api/v1/runs:batch", json={"runs": batch}, headers=headers, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["created"] == len(batch), r.text

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(send, batches))
