"""The build path as runners use it: each build finishes with a POST of its run and the next build
of that job starts with a GET of its sizing, so half the requests are POSTs (120 CPU samples) that
invalidate the job's answer and half are GETs that mostly miss the answer cache.

A live ``ci-sizer serve`` (one worker, PostgreSQL, jobs loaded with history) against a bare FastAPI app
on the same stack (bench/bare_app.py) that parses the same POST body into a pydantic model and
answers GETs with bytes of the same size. Rounds alternate between the two, and each figure is the
median of the rounds, because this machine is shared and noisy.

Targets (issue 20): ratio >= 0.5 with p99 <= 50 ms at one worker and 32 connections.

    python bench/mixed.py [--database-url postgresql://...] [--jobs 300] [--seconds 5] [--rounds 3]
                          [--workers N] [--replicas N]

``--workers N`` runs each ``ci-sizer serve`` with N uvicorn workers. ``--replicas N`` starts N separate
servers on distinct ports on the one PostgreSQL (and N bare apps), and drives them with N wrk processes
at once, each with its share of the connections: the figures are the sum of the requests per second,
the median of the p50s and the largest p99 (no proxy in between, which would cost the cores measured).
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import contextlib
import http.client
import json
import os
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx

from bench import _load, _wrk
from bench._util import cpu_seconds, save, verdict
from bench.http import BareApp, rounds
from tests.live import LiveServer

SAMPLES = 120

# wrk picks a job at random for every request, and a POST of a new run of it or a GET of its sizing
# at random (half each); a POST's body is the job's identity and a unique run id around a fixed run.
SCRIPT = r"""
local jobs = {}
local prefix, suffix = nil, nil
local counter = 0

function init(args)
  for line in io.lines(args[1]) do
    local org, repo, workflow, job = line:match("^(%S+) (%S+) (%S+) (%S+)$")
    jobs[#jobs + 1] = {org = org, repo = repo, workflow = workflow, job = job,
      path = "/api/v1/sizing/" .. org .. "/" .. repo .. "/" .. workflow .. "/" .. job}
  end
  local f = io.open(args[2], "rb"); local body = f:read("*a"); f:close()
  local at = string.find(body, "@JOB@", 1, true)
  prefix = string.sub(body, 1, at - 1); suffix = string.sub(body, at + 5)
  math.randomseed(tonumber(args[3]) or 1)
  wrk.thread_tag = tostring(math.random(1, 1000000000))
end

function request()
  local j = jobs[math.random(#jobs)]
  if math.random() < 0.5 then
    return wrk.format("GET", j.path)
  end
  counter = counter + 1
  local identity = string.format(
    '"org": "%s", "repo": "%s", "workflow": "%s", "job": "%s", "run_id": "mix-%s-%d"',
    j.org, j.repo, j.workflow, j.job, wrk.thread_tag, counter)
  return wrk.format("POST", "/api/v1/runs", {["Content-Type"] = "application/json"}, prefix .. identity .. suffix)
end
"""


def run_body(seed: int = 1) -> bytes:
    """A finished run of one container with 120 CPU samples; ``@JOB@`` stands where the job's
    identity and the run id go."""
    rng = random.Random(seed)
    samples = [round(max(0.0, rng.gauss(900.0, 300.0)), 3) for _ in range(SAMPLES)]
    finished = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    rest = json.dumps(
        {
            "finished_at": finished,
            "containers": [{"name": "build", "cpu_samples_millicores": samples, "memory_peak_bytes": 1_500_000_000}],
        }
    )
    return ("{@JOB@, " + rest[1:]).encode()


def sequential(base_url: str, body: bytes, jobs: int, n: int = 300) -> dict[str, float]:
    """One client, one kept-alive connection, nothing else in flight: for each of ``n`` requests a
    POST of a new run of a job (120 samples), then a GET of that job's sizing, which misses the
    answer cache since the POST invalidated it. The p50 of each, in ms, as the client sees them."""
    host, _, port = base_url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    posts: list[float] = []
    gets: list[float] = []
    try:
        for i in range(n):
            org, repo, workflow, job = _load.job_key(i % jobs)
            identity = (
                f'"org": "{org}", "repo": "{repo}", "workflow": "{workflow}", "job": "{job}", "run_id": "seq-{i}"'
            )
            content = body.replace(b"@JOB@", identity.encode())
            started = time.perf_counter()
            conn.request("POST", "/api/v1/runs", content, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            posts.append(time.perf_counter() - started)
            if r.status != 201:
                raise RuntimeError(f"POST answered {r.status}")
            started = time.perf_counter()
            conn.request("GET", _load.sizing_path(i % jobs))
            r = conn.getresponse()
            r.read()
            gets.append(time.perf_counter() - started)
            if r.status != 200:
                raise RuntimeError(f"GET answered {r.status}")
    finally:
        conn.close()
    skip = n // 10  # warm-up
    return {
        "post_p50_ms": statistics.median(posts[skip:]) * 1000,
        "get_miss_p50_ms": statistics.median(gets[skip:]) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a PostgreSQL server (a database ci_sizer_bench_mixed is made on it)")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--runs-per-job", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers per server")
    parser.add_argument("--replicas", type=int, default=1, help="servers on distinct ports, one PostgreSQL")
    parser.add_argument("--results", help="write the figures as JSON here (for bench/report.py)")
    args = parser.parse_args()
    if not _wrk.available():
        sys.exit("wrk is not installed: apt-get install wrk")

    server, owned = _load.server_url(args.database_url)
    try:
        url = _load.run(_load.fresh_database(server, "ci_sizer_bench_mixed"))
        print(f"loading {args.jobs:,} jobs x {args.runs_per_job} runs ...", flush=True)
        _load.run(_load.load(url, jobs=args.jobs, runs_per_job=args.runs_per_job))
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            jobs_file = tmp / "jobs.txt"
            jobs_file.write_text("".join(" ".join(_load.job_key(i)) + "\n" for i in range(args.jobs)))
            body_file = tmp / "run.json"
            body_file.write_bytes(run_body())
            figures = bench(url, jobs_file, body_file, tmp, args)
            load = os.getloadavg()
    finally:
        if owned is not None:
            owned.close()
    ours, bare = figures["ci-sizer"], figures["bare FastAPI"]
    ratio = ours["rps"] / bare["rps"]
    print()
    print(f"{'':<16}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}")
    for name, fig in (("bare FastAPI", bare), ("ci-sizer", ours)):
        print(f"{name:<16}{fig['rps']:>10.0f}{fig['p50_ms']:>10.2f}{fig['p99_ms']:>10.2f}{fig['errors']:>8}")
    ok = ratio >= 0.5 and ours["p99_ms"] <= 50
    print(
        f"ratio ci-sizer / bare: {ratio:.2f}; p99 {ours['p99_ms']:.2f} ms (target ratio >= 0.5, p99 <= 50 ms: {verdict(ok)})"
    )
    seq = figures["sequential"]
    get_ok, post_ok = seq["get_miss_p50_ms"] <= 1.5, seq["post_p50_ms"] <= 2.5
    print(
        f"sequential: missing GET p50 {seq['get_miss_p50_ms']:.2f} ms (target <= 1.5: {verdict(get_ok)}), "
        f"POST of {SAMPLES} samples p50 {seq['post_p50_ms']:.2f} ms (target <= 2.5: {verdict(post_ok)}); "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    rows = [
        {
            "figure": (
                f"mixed build path: half POST runs ({SAMPLES} samples), half GET sizing, {args.jobs} jobs, "
                f"{args.connections} connections, {args.workers} worker(s)"
                + (f" x {args.replicas} replicas" if args.replicas > 1 else "")
                + ", PostgreSQL"
            ),
            "ci_sizer_rps": round(ours["rps"]),
            "bare_rps": round(bare["rps"]),
            "ratio": round(ratio, 2),
            "ci_sizer_p50_ms": round(ours["p50_ms"], 2),
            "ci_sizer_p99_ms": round(ours["p99_ms"], 2),
            "bare_p50_ms": round(bare["p50_ms"], 2),
            "bare_p99_ms": round(bare["p99_ms"], 2),
            "target": "ratio >= 0.5, p99 <= 50 ms",
            "result": verdict(ok),
        },
        {
            "figure": "sequential, one client: a GET that misses the answer cache (after a POST of the job), p50",
            "ci_sizer_p50_ms": round(seq["get_miss_p50_ms"], 2),
            "target": "p50 <= 1.5 ms",
            "result": verdict(get_ok),
        },
        {
            "figure": f"sequential, one client: a POST of a new run ({SAMPLES} samples), p50",
            "ci_sizer_p50_ms": round(seq["post_p50_ms"], 2),
            "target": "p50 <= 2.5 ms",
            "result": verdict(post_ok),
        },
    ]
    notes = [f"load average during the run (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (2 cores, shared)"]
    if "app_cpu_us" in ours and "app_cpu_us" in bare:
        cpu = (
            f"CPU per request (median of the rounds, from /proc): ci-sizer {ours['app_cpu_us']:.0f} us in the app and "
            f"{ours['pg_cpu_us']:.0f} us in PostgreSQL; the bare app {bare['app_cpu_us']:.0f} us"
        )
        print(cpu)
        notes.append(cpu)
    name = (
        "mixed"
        if args.workers == 1 and args.replicas == 1
        else "mixed-replicas"
        if args.replicas > 1
        else "mixed-workers"
    )
    if name != "mixed":  # the targets are for one worker; this run shows how the path scales
        rows[0]["target"], rows[0]["result"] = "(reported)", "-"
        rows = rows[:1]
    save(args.results, name, rows, notes)


def bench(
    url: str, jobs_file: Path, body_file: Path, tmp: Path, args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    def measure(servers: str, seed: int) -> dict[str, Any]:
        # CPU per request: the app's processes (with uvicorn's workers) and PostgreSQL's, over the round
        before = cpu_seconds(pids[servers])
        fig = load(servers, seed)
        after = cpu_seconds(pids[servers])
        if fig["requests"]:
            fig["app_cpu_us"] = (after[0] - before[0]) / fig["requests"] * 1e6
            fig["pg_cpu_us"] = (after[1] - before[1]) / fig["requests"] * 1e6
        return fig

    def load(servers: str, seed: int) -> dict[str, Any]:
        urls = servers.split(" ")
        share = [
            args.connections // len(urls) + (1 if i < args.connections % len(urls) else 0) for i in range(len(urls))
        ]

        def one(i: int) -> dict[str, Any]:
            script_args = [str(jobs_file), str(body_file), str(seed * 100 + i)]
            return _wrk.run_script(urls[i], SCRIPT, script_args, seconds=args.seconds, connections=share[i])

        if len(urls) == 1:
            return one(0)
        with ThreadPoolExecutor(len(urls)) as pool:
            figs = list(pool.map(one, range(len(urls))))
        return {
            "rps": sum(f["rps"] for f in figs),
            "p50_ms": statistics.median(f["p50_ms"] for f in figs),
            "p99_ms": max(f["p99_ms"] for f in figs),
            "errors": sum(f["errors"] for f in figs),
            "requests": sum(f["requests"] for f in figs),
        }

    flags = ("--log-level", "info", "--workers", str(args.workers))  # production defaults: access lines to a file
    with contextlib.ExitStack() as stack:
        ours = [
            stack.enter_context(LiveServer(url, *flags, log=tmp / f"ci-sizer-{i}.log")) for i in range(args.replicas)
        ]
        answer = httpx.get(ours[0].url + _load.sizing_path(0), timeout=10)
        answer.raise_for_status()
        (tmp / "answer.json").write_bytes(answer.content)
        print(f"answer body: {len(answer.content)} bytes", flush=True)
        bare = [
            stack.enter_context(BareApp(tmp / "answer.json", tmp / f"bare-{i}.log", workers=args.workers))
            for i in range(args.replicas)
        ]
        servers = {"bare FastAPI": " ".join(b.url for b in bare), "ci-sizer": " ".join(o.url for o in ours)}
        pids = {
            servers["bare FastAPI"]: [b.proc.pid for b in bare if b.proc is not None],
            servers["ci-sizer"]: [o.proc.pid for o in ours if o.proc is not None],
        }
        figures: dict[str, dict[str, float]] = rounds(
            servers,
            args.rounds,
            measure,
        )
        figures["sequential"] = sequential(ours[0].url, body_file.read_bytes(), args.jobs)
        return figures


if __name__ == "__main__":
    main()
