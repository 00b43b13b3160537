"""The build path as runners use it: each build finishes with a POST of its run and the next build
of that job starts with a GET of its sizing, so half the requests are POSTs (120 CPU samples) that
invalidate the job's answer and half are GETs that mostly miss the answer cache.

A live ``ci-sizer serve`` (one worker, PostgreSQL, jobs loaded with history) against a bare FastAPI app
on the same stack (bench/bare_app.py) that parses the same POST body into a pydantic model and
answers GETs with bytes of the same size. Rounds alternate between the two, and each figure is the
median of the rounds, because this machine is shared and noisy.

Targets (issue 20): ratio >= 0.5 with p99 <= 50 ms at one worker and 32 connections.

    python bench/mixed.py [--database-url postgresql://...] [--jobs 300] [--seconds 5] [--rounds 3]
                          [--workers N] [--replicas N] [--paced] [--variant NAME:KEY=VALUE,...] [--waits]

``--paced`` adds rounds of the same mix at about a fifth of saturation (issue 38): 8 connections, each
waiting 20 ms (wrk's ``delay()``) after an answer before its next request, so nothing should queue; it
reports p50, p99 and max beside the bare app at the same pace. Targets: p99 at most the bare app's + 3 ms,
max at most 25 ms. ``--paced-only`` skips the saturation and sequential figures (for experiments).

``--variant NAME:KEY=VALUE,...`` (repeatable) starts one more ``ci-sizer serve`` with that environment
and measures it in the same alternating rounds, to compare a setting side by side (for instance
``--variant quiet:CI_SIZER_JOBS_SUMMARY_SECONDS=3600,CI_SIZER_RETENTION_INTERVAL_SECONDS=3600``).
``--waits`` samples pg_stat_activity and pg_locks every few ms during each paced ci-sizer round and prints
what the service's backends were waiting on.

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
import asyncio
import contextlib
import http.client
import json
import os
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx

from bench import _load, _wrk
from bench._util import cpu_seconds, latencies, save, verdict
from bench.http import BareApp, rounds
from tests.live import LiveServer

SAMPLES = 120
#: the paced rounds' stand-in for PostgreSQL alone (``pg_floor``)
FLOOR = "postgresql-alone"

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

#: the paced mix: each connection waits ``args[4]`` ms after an answer before its next request (wrk
#: measures a request's latency from its send, so the wait is not counted)
PACED_SCRIPT = (
    SCRIPT
    + r"""
local pace = 20
local base_init = init
function init(args)
  base_init(args)
  pace = tonumber(args[4]) or 20
end

function delay()
  return pace
end
"""
)

#: what the service's backends are doing, sampled (``--waits``): active ones by wait event (none: on
#: CPU), and the locks anyone waits for
WAITS_QUERY = r"""
SELECT coalesce(a.wait_event_type || ':' || a.wait_event, 'running') AS what,
    CASE WHEN a.query LIKE '%INSERT INTO runs%' THEN 'POST' WHEN a.query LIKE '%job_state%' THEN 'GET/state'
        ELSE left(regexp_replace(a.query, '\s+', ' ', 'g'), 40) END AS query
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.state = 'active'
UNION ALL
SELECT 'lock wait:' || l.locktype || ':' || l.mode,
    'behind: ' || coalesce((SELECT CASE WHEN b.query LIKE '%INSERT INTO runs%' THEN 'POST'
        ELSE left(regexp_replace(b.query, '\s+', ' ', 'g'), 40) END
        FROM pg_stat_activity b WHERE b.pid = (pg_blocking_pids(l.pid))[1]), '?')
FROM pg_locks l WHERE NOT l.granted
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


def sequential(base_url: str, body: bytes, jobs: int, n: int = 300, tag: str = "seq") -> dict[str, float]:
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
                f'"org": "{org}", "repo": "{repo}", "workflow": "{workflow}", "job": "{job}", "run_id": "{tag}-{i}"'
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
    parser.add_argument(
        "--database-name", default="ci_sizer_bench_mixed", help="the database made (dropped first) on that server"
    )
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--runs-per-job", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers per server")
    parser.add_argument("--replicas", type=int, default=1, help="servers on distinct ports, one PostgreSQL")
    parser.add_argument("--paced", action="store_true", help="also the mix paced at about a fifth of saturation")
    parser.add_argument("--paced-only", action="store_true", help="only the paced rounds (experiments)")
    parser.add_argument("--paced-connections", type=int, default=8)
    parser.add_argument("--pace-ms", type=int, default=20, help="each connection's wait after an answer")
    parser.add_argument("--paced-seconds", type=float, default=10)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="one more ci-sizer with this environment, in the same rounds",
    )
    parser.add_argument("--waits", action="store_true", help="sample pg_stat_activity/pg_locks in ci-sizer rounds")
    parser.add_argument("--logs", help="keep the servers' logs in this directory (default: a temporary one)")
    parser.add_argument("--results", help="write the figures as JSON here (for bench/report.py)")
    args = parser.parse_args()
    args.paced = args.paced or args.paced_only
    if not _wrk.available():
        sys.exit("wrk is not installed: apt-get install wrk")

    server, owned = _load.server_url(args.database_url)
    try:
        url = _load.run(_load.fresh_database(server, args.database_name))
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
    rows: list[dict[str, Any]] = []
    notes = [f"load average during the run (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (2 cores, shared)"]
    names = ["bare FastAPI", "ci-sizer", *(v.split(":", 1)[0] for v in args.variant)]
    if "saturation" in figures:
        rows += saturation_rows(figures, names, args, notes)
    if "paced" in figures:
        rows += paced_rows(figures["paced"], names, args, notes)
    for name, counts in figures.get("waits", {}).items():
        total = sum(counts.values()) or 1
        print(f"\nwhat {name}'s active backends were doing ({total} samples of active backends and lock waits):")
        for (what, query), n in sorted(counts.items(), key=lambda kv: -kv[1])[:15]:
            print(f"  {n / total:>6.1%}  {what:<40} {query}")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    name = (
        "mixed"
        if args.workers == 1 and args.replicas == 1
        else "mixed-replicas"
        if args.replicas > 1
        else "mixed-workers"
    )
    if name != "mixed":  # the targets are for one worker; this run shows how the path scales
        for row in rows:
            row["target"], row["result"] = "(reported)", "-"
        rows = rows[:1]
    save(args.results, name, rows, notes)


def saturation_rows(
    figures: dict[str, Any], names: list[str], args: argparse.Namespace, notes: list[str]
) -> list[dict[str, Any]]:
    sat = figures["saturation"]
    bare = sat["bare FastAPI"]
    print()
    print(f"saturation, {args.connections} connections")
    print(f"{'':<16}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'errors':>8}")
    for name in names:
        fig = sat[name]
        print(
            f"{name:<16}{fig['rps']:>10.0f}{fig['p50_ms']:>10.2f}{fig['p99_ms']:>10.2f}{fig['max_ms']:>10.2f}{fig['errors']:>8}"
        )
    for name in names[2:]:
        print(f"ratio {name} / ci-sizer: {sat[name]['rps'] / sat['ci-sizer']['rps']:.2f}")
    ours = sat["ci-sizer"]
    ratio = ours["rps"] / bare["rps"]
    ok = ratio >= 0.5 and ours["p99_ms"] <= 50
    print(
        f"ratio ci-sizer / bare: {ratio:.2f}; p99 {ours['p99_ms']:.2f} ms (target ratio >= 0.5, p99 <= 50 ms: {verdict(ok)})"
    )
    seq = figures["sequential"]
    get_ok, post_ok = seq["get_miss_p50_ms"] <= 1.5, seq["post_p50_ms"] <= 2.5
    print(
        f"sequential: missing GET p50 {seq['get_miss_p50_ms']:.2f} ms (target <= 1.5: {verdict(get_ok)}), "
        f"POST of {SAMPLES} samples p50 {seq['post_p50_ms']:.2f} ms (target <= 2.5: {verdict(post_ok)})"
    )
    if "app_cpu_us" in ours and "app_cpu_us" in bare:
        cpu = (
            f"CPU per request at saturation (median of the rounds, from /proc): ci-sizer {ours['app_cpu_us']:.0f} us in "
            f"the app and {ours['pg_cpu_us']:.0f} us in PostgreSQL; the bare app {bare['app_cpu_us']:.0f} us"
        )
        print(cpu)
        notes.append(cpu)
    return [
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
            **latencies(ours, bare),
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


def paced_rows(
    paced: dict[str, dict[str, float]], names: list[str], args: argparse.Namespace, notes: list[str]
) -> list[dict[str, Any]]:
    bare, ours = paced["bare FastAPI"], paced["ci-sizer"]
    print()
    print(f"paced: {args.paced_connections} connections, each {args.pace_ms} ms between an answer and its next request")
    print(f"{'':<16}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'errors':>8}")
    for name in [*names, "PostgreSQL alone"]:
        fig = paced[name]
        print(
            f"{name:<16}{fig['rps']:>10.0f}{fig['p50_ms']:>10.2f}{fig['p99_ms']:>10.2f}{fig['max_ms']:>10.2f}{fig['errors']:>8}"
        )
    floor = paced["PostgreSQL alone"]
    notes.append(
        f"paced floor, PostgreSQL alone ({args.paced_connections} clients each inserting a row and committing, "
        f"{args.pace_ms} ms apart): p50 {floor['p50_ms']:.2f} ms, p99 {floor['p99_ms']:.2f} ms, max {floor['max_ms']:.1f} ms"
    )
    ok = ours["p99_ms"] <= bare["p99_ms"] + 3 and ours["max_ms"] <= 25
    print(
        f"paced ci-sizer: p99 {ours['p99_ms']:.2f} ms vs bare {bare['p99_ms']:.2f} + 3, max {ours['max_ms']:.1f} ms "
        f"(target max <= 25 ms): {verdict(ok)}"
    )
    notes.append(
        f"paced: {args.paced_connections} connections, each waiting {args.pace_ms} ms (wrk's delay()) after an "
        f"answer, {args.paced_seconds:g} s a round; max is the median of the rounds' maxima"
    )
    return [
        {
            "figure": (
                f"the same mix paced: {args.paced_connections} connections, {args.pace_ms} ms apart "
                f"(about a fifth of saturation), {args.workers} worker(s), PostgreSQL"
            ),
            "ci_sizer_rps": round(ours["rps"]),
            "bare_rps": round(bare["rps"]),
            **latencies(ours, bare),
            "target": "p99 <= bare p99 + 3 ms, max <= 25 ms",
            "result": verdict(ok),
        }
    ]


def pg_floor(url: str, *, clients: int, pace_ms: int, seconds: float) -> dict[str, Any]:
    """PostgreSQL alone at the paced mix's shape: ``clients`` connections, each inserting one row and
    committing (a disk flush), then waiting ``pace_ms``: what a POST's commit costs at best here."""
    dsn = url.replace("postgresql+asyncpg://", "postgresql://")

    async def main() -> list[float]:
        setup = await asyncpg.connect(dsn)
        await setup.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, at timestamptz)")
        await setup.close()
        times: list[float] = []
        end = time.monotonic() + seconds

        async def client() -> None:
            conn = await asyncpg.connect(dsn)
            try:
                while time.monotonic() < end:
                    started = time.perf_counter()
                    await conn.execute("INSERT INTO bench_floor (at) VALUES (now())")
                    times.append(time.perf_counter() - started)
                    await asyncio.sleep(pace_ms / 1000)
            finally:
                await conn.close()

        await asyncio.gather(*(client() for _ in range(clients)))
        return times

    times = sorted(asyncio.run(main()))
    return {
        "rps": len(times) / seconds,
        "p50_ms": times[len(times) // 2] * 1000,
        "p99_ms": times[int(len(times) * 0.99)] * 1000,
        "max_ms": times[-1] * 1000,
        "errors": 0,
        "requests": len(times),
    }


class Waits:
    """``WAITS_QUERY`` every ``every`` seconds on a thread of its own while ``sampling`` (``--waits``)."""

    def __init__(self, url: str, every: float = 0.004) -> None:
        self.dsn = url.replace("postgresql+asyncpg://", "postgresql://")
        self.every = every
        self.counts: dict[str, Counter[tuple[str, str]]] = {}

    @contextlib.contextmanager
    def sampling(self, name: str) -> Iterator[None]:
        counts = self.counts.setdefault(name, Counter())
        stop = threading.Event()

        async def sample() -> None:
            conn = await asyncpg.connect(self.dsn)
            try:
                while not stop.is_set():
                    for row in await conn.fetch(WAITS_QUERY):
                        counts[(row["what"], row["query"])] += 1
                    await asyncio.sleep(self.every)
            finally:
                await conn.close()

        thread = threading.Thread(target=lambda: asyncio.run(sample()), daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def bench(url: str, jobs_file: Path, body_file: Path, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    waits = Waits(url) if args.waits else None

    def measure(servers: str, seed: int, *, paced: bool = False) -> dict[str, Any]:
        # CPU per request: the app's processes (with uvicorn's workers) and PostgreSQL's, over the round
        if servers == FLOOR:
            return pg_floor(url, clients=args.paced_connections, pace_ms=args.pace_ms, seconds=args.paced_seconds)
        before = cpu_seconds(pids[servers])
        name = names[servers]
        with (
            waits.sampling(name) if waits is not None and name != "bare FastAPI" and paced else contextlib.nullcontext()
        ):
            fig = load(servers, seed, paced)
        after = cpu_seconds(pids[servers])
        if fig["requests"]:
            fig["app_cpu_us"] = (after[0] - before[0]) / fig["requests"] * 1e6
            fig["pg_cpu_us"] = (after[1] - before[1]) / fig["requests"] * 1e6
        return fig

    def load(servers: str, seed: int, paced: bool) -> dict[str, Any]:
        urls = servers.split(" ")
        connections = args.paced_connections if paced else args.connections
        share = [connections // len(urls) + (1 if i < connections % len(urls) else 0) for i in range(len(urls))]

        def one(i: int) -> dict[str, Any]:
            # run ids differ between the servers too (they share the database: the same ids would be duplicates)
            salt = list(names).index(servers) * 10_000
            script_args = [str(jobs_file), str(body_file), str(salt + seed * 100 + i), str(args.pace_ms)]
            return _wrk.run_script(
                urls[i],
                PACED_SCRIPT if paced else SCRIPT,
                script_args,
                seconds=args.paced_seconds if paced else args.seconds,
                connections=share[i],
            )

        if len(urls) == 1:
            return one(0)
        with ThreadPoolExecutor(len(urls)) as pool:
            figs = list(pool.map(one, range(len(urls))))
        return {
            "rps": sum(f["rps"] for f in figs),
            "p50_ms": statistics.median(f["p50_ms"] for f in figs),
            "p99_ms": max(f["p99_ms"] for f in figs),
            "max_ms": max(f["max_ms"] for f in figs),
            "errors": sum(f["errors"] for f in figs),
            "requests": sum(f["requests"] for f in figs),
        }

    flags = ("--log-level", "info", "--workers", str(args.workers))  # production defaults: access lines to a file
    logs = Path(args.logs) if args.logs else tmp
    logs.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        ours = [
            stack.enter_context(LiveServer(url, *flags, log=logs / f"ci-sizer-{i}.log")) for i in range(args.replicas)
        ]
        answer = httpx.get(ours[0].url + _load.sizing_path(0), timeout=10)
        answer.raise_for_status()
        (tmp / "answer.json").write_bytes(answer.content)
        print(f"answer body: {len(answer.content)} bytes", flush=True)
        bare = [
            stack.enter_context(BareApp(tmp / "answer.json", logs / f"bare-{i}.log", workers=args.workers))
            for i in range(args.replicas)
        ]
        servers = {"bare FastAPI": " ".join(b.url for b in bare), "ci-sizer": " ".join(o.url for o in ours)}
        pids = {
            servers["bare FastAPI"]: [b.proc.pid for b in bare if b.proc is not None],
            servers["ci-sizer"]: [o.proc.pid for o in ours if o.proc is not None],
        }
        for variant in args.variant:
            name, _, assignments = variant.partition(":")
            env = dict(a.split("=", 1) for a in assignments.split(",") if a)
            others = [
                stack.enter_context(LiveServer(url, *flags, log=logs / f"{name}-{i}.log", env=env))
                for i in range(args.replicas)
            ]
            servers[name] = " ".join(o.url for o in others)
            pids[servers[name]] = [o.proc.pid for o in others if o.proc is not None]
        names = {address: name for name, address in servers.items()}
        figures: dict[str, Any] = {}
        if not args.paced_only:
            figures["saturation"] = rounds(servers, args.rounds, measure)
            figures["sequential"] = sequential(ours[0].url, body_file.read_bytes(), args.jobs)
            for name in list(servers)[2:]:  # the variants' first servers, with run ids of their own
                seq = sequential(servers[name].split(" ")[0], body_file.read_bytes(), args.jobs, tag=f"seq-{name}")
                print(
                    f"sequential {name}: missing GET p50 {seq['get_miss_p50_ms']:.2f} ms, POST p50 {seq['post_p50_ms']:.2f} ms"
                )
        if args.paced:
            print("paced rounds", flush=True)
            # other seeds than the saturation rounds' (the same seed repeats the run ids: duplicates)
            paced = {**servers, "PostgreSQL alone": FLOOR}
            figures["paced"] = rounds(paced, args.rounds, lambda s, seed: measure(s, seed + 50, paced=True))
        if waits is not None:
            figures["waits"] = waits.counts
        return figures


if __name__ == "__main__":
    main()
