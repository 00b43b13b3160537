"""Metric objects (prometheus-client). Names: ``ci_sizer_`` prefix, base units, ``_total`` only on
counters, and never a label per org/repo/workflow/job.

Several uvicorn workers: set ``PROMETHEUS_MULTIPROC_DIR`` (``ci-sizer serve --workers N`` does) and
``/metrics`` aggregates every worker's values with prometheus-client's multiprocess collector, and
adds each worker's ``process_*`` and ``python_info``, labelled ``pid``.

Labelled counters are created at import with every label value the service can give them, so a
``rate()`` over them is 0, not missing, before the first event.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import re
from collections.abc import Iterable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client import multiprocess as _multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from service import __version__

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
#: an answer cut at the deadline takes it plus the fail-open path's few milliseconds, and more when
#: many are cut at once and wait for the event loop: edges this much above the deadline hold them
OVER_DEADLINE = (1.1, 1.25)


def latency_buckets(deadline: float) -> tuple[float, ...]:
    """The request-duration edges for a sizing deadline (seconds): the fixed ones, the deadline, and
    two just above it. Answers cut at a 250 ms deadline took 250-252 ms; with the next edge at 0.5 s,
    ``histogram_quantile`` put their p99 at 0.41-0.49 s (issue 39). Now it reads at most 275 ms, or
    312.5 ms when they queued."""
    return tuple(sorted({*_LATENCY_BUCKETS, deadline, *(round(deadline * k, 6) for k in OVER_DEADLINE)}))


HTTP_REQUESTS = Counter(
    "ci_sizer_http_requests_total",
    "HTTP requests answered.",
    ["route", "method", "status_class"],
)


def _request_durations(buckets: tuple[float, ...]) -> Histogram:
    return Histogram(
        "ci_sizer_http_request_duration_seconds",
        "Time to answer an HTTP request.",
        ["route", "method"],
        buckets=buckets,
    )


#: built again with the edges of the configured deadline by ``use_sizing_deadline`` (the app's
#: startup); no label set is made before that, so no bucket of other edges is ever written
HTTP_DURATION = _request_durations(_LATENCY_BUCKETS)
RUNS_INGESTED = Counter("ci_sizer_runs_ingested_total", "Runs posted, by result.", ["result"])
OOM_SUSPECT_RUNS = Counter(
    "ci_sizer_oom_suspect_runs_total",
    "Newly stored runs that were OOM-suspect (rule S1).",
)
GROWTHS = Counter(
    "ci_sizer_growths_total",
    "Growth events stored with newly stored runs (issue 40), by result: grown, deferred, infeasible, too_late, error.",
    ["result"],
)
RECOMMENDATIONS = Counter(
    "ci_sizer_recommendations_total",
    "Sizing answers served, by phase and override scope.",
    ["phase", "override_scope"],
)
CORE_DURATION = Histogram(
    "ci_sizer_core_compute_duration_seconds",
    "Time spent in the sizing core per call.",
    ["operation"],
    buckets=(0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1),
)
DATABASE_ERRORS = Counter("ci_sizer_database_errors_total", "Database operations that failed.")
DEGRADED_ANSWERS = Counter(
    "ci_sizer_degraded_answers_total",
    "Sizing answers served degraded because the database failed or was slow.",
)
SIZING_CACHE = Counter(
    "ci_sizer_sizing_cache_lookups_total",
    "Sizing requests by whether a fresh cached answer served them (hit) or the database was read (miss).",
    ["result"],
)
SIZING_DEADLINE = Gauge(
    "ci_sizer_sizing_deadline_seconds",
    "The fail-open deadline of a sizing answer (CI_SIZER_SIZING_DEADLINE_MS), for alerts to compare with.",
    multiprocess_mode="max",
)
CHANGE_FEED_UP = Gauge(
    "ci_sizer_change_feed_up",
    "1 while the worker listens for changes committed by other workers and replicas (PostgreSQL), 0 while "
    "it does not and reads every answer from the database; absent on SQLite (no feed). Worst worker.",
    ["channel"],
    multiprocess_mode="livemin",
)
DATABASE_READY = Gauge(
    "ci_sizer_database_ready",
    "1 when the database answered the worker's last check (at start, on /readyz, and every few seconds), "
    "else 0. Worst worker.",
    multiprocess_mode="livemin",
)
RETENTION_BACKLOG = Gauge(
    "ci_sizer_retention_backlog_jobs",
    "Jobs whose pruning failed in the last retention pass and wait for the next one.",
    multiprocess_mode="livesum",
)
RETENTION_PRUNED = Counter("ci_sizer_retention_pruned_runs_total", "Runs deleted by retention.")
ANALYSES = Counter(
    "ci_sizer_analyses_total",
    "Background analyses finished, by kind and result (done, failed, interrupted by a shutdown).",
    ["kind", "result"],
)
ANALYSES_RUNNING = Gauge(
    "ci_sizer_analyses_running",
    "Background analyses running, by kind.",
    ["kind"],
    multiprocess_mode="livesum",
)
OVERRIDES = Gauge(
    "ci_sizer_overrides",
    "Overrides stored, by scope.",
    ["scope"],
    multiprocess_mode="mostrecent",
)
BUILD_INFO = Gauge(
    "ci_sizer_build_info",
    "Always 1; labels say the version and the live core backend.",
    ["version", "core_backend"],
    multiprocess_mode="max",
)
FLEET_CPU = Gauge(
    "ci_sizer_fleet_cpu_cores",
    "Sum over jobs of the latest recommendation's CPU request, and of the CPU observed for it.",
    ["kind"],
    multiprocess_mode="mostrecent",
)
FLEET_MEMORY = Gauge(
    "ci_sizer_fleet_memory_bytes",
    "Sum over jobs of the latest recommendation's memory request, and of the memory observed for it.",
    ["kind"],
    multiprocess_mode="mostrecent",
)
FLEET_JOBS = Gauge(
    "ci_sizer_fleet_jobs",
    "Jobs with a recommendation in the fleet totals.",
    multiprocess_mode="mostrecent",
)
#: issue 34: the fleet's savings in money, from the job summaries (``observability/fleet.py``)
FLEET_SAVING = Gauge(
    "ci_sizer_fleet_saving_per_day",
    "Money saved per day if every job's answer were applied, at the operator's prices (--price-per-gib-hour, "
    "--price-per-core-hour), by resource; jobs kept below what they use by a pin count nothing (docs/ui.md).",
    ["resource", "currency"],
    multiprocess_mode="mostrecent",
)

#: issue 37: the admission webhook's own (``ci-sizer webhook serve``, its own process and /metrics): not in
#: the service's registry, so the sizer never exports them; ``service/webhook/app.py`` registers them
WEBHOOK_RESULTS = ("patched", "unknown_identity", "no_answer", "deadline", "error")
WEBHOOK_REQUESTS = Counter(
    "ci_sizer_webhook_requests_total",
    "Admission reviews the webhook answered, by result: patched, unknown_identity (no job could be told from "
    "the pod), no_answer (the sizer was unsure: a job never seen, a degraded answer, or none of its containers "
    "in the pod), deadline (the sizer did not answer in time), error. Every one was allowed.",
    ["result"],
    registry=None,
)
WEBHOOK_DURATION = Histogram(
    "ci_sizer_webhook_request_duration_seconds",
    "Time to answer an admission review, from its body read to its answer written.",
    buckets=latency_buckets(1.0),  # the default deadline (CI_SIZER_WEBHOOK_DEADLINE_MS) and just above it
    registry=None,
)

#: Every metric family the service exports (the dashboard test checks its queries against these).
EXPORTED = (
    HTTP_REQUESTS,
    HTTP_DURATION,
    RUNS_INGESTED,
    OOM_SUSPECT_RUNS,
    GROWTHS,
    RECOMMENDATIONS,
    CORE_DURATION,
    DATABASE_ERRORS,
    DEGRADED_ANSWERS,
    SIZING_CACHE,
    SIZING_DEADLINE,
    CHANGE_FEED_UP,
    DATABASE_READY,
    RETENTION_BACKLOG,
    RETENTION_PRUNED,
    ANALYSES,
    ANALYSES_RUNNING,
    OVERRIDES,
    BUILD_INFO,
    FLEET_CPU,
    FLEET_MEMORY,
    FLEET_JOBS,
    FLEET_SAVING,
    WEBHOOK_REQUESTS,
    WEBHOOK_DURATION,
)


#: the label values each labelled counter can take (the routes: those the dashboard and alerts read)
SIZING_ROUTE = "/api/v1/sizing/{org}/{repo}/{workflow}/{job}"
INGEST_ROUTES = ("/api/v1/runs", "/api/v1/runs:batch")
STATUS_CLASSES = ("2xx", "4xx", "5xx")
INGEST_RESULTS = ("created", "duplicate", "conflict", "rejected")
PHASES = ("unknown", "learning", "confident")
OVERRIDE_SCOPES = ("job", "workflow", "repo", "org", "global")
CACHE_RESULTS = ("hit", "miss")
CORE_OPERATIONS = ("six_stats", "size_job")
ANALYSIS_KINDS = ("simulation", "backtest")
ANALYSIS_RESULTS = ("done", "failed", "interrupted")


def _preinitialise() -> None:
    """Create every known label set, so each series exists (at 0) before its first event (the
    request durations' at ``use_sizing_deadline``)."""
    for status_class in STATUS_CLASSES:
        HTTP_REQUESTS.labels(route=SIZING_ROUTE, method="GET", status_class=status_class)
        for route in INGEST_ROUTES:
            HTTP_REQUESTS.labels(route=route, method="POST", status_class=status_class)
    for result in INGEST_RESULTS:
        RUNS_INGESTED.labels(result=result)
    for phase in PHASES:
        for scope in OVERRIDE_SCOPES:
            RECOMMENDATIONS.labels(phase=phase, override_scope=scope)
    for result in CACHE_RESULTS:
        SIZING_CACHE.labels(result=result)
    for operation in CORE_OPERATIONS:
        CORE_DURATION.labels(operation=operation)
    for kind in ANALYSIS_KINDS:
        ANALYSES_RUNNING.labels(kind=kind)
        for result in ANALYSIS_RESULTS:
            ANALYSES.labels(kind=kind, result=result)


_preinitialise()

# label children the build path counts on every request, bound once (``labels()`` costs a few µs)
CACHE_HIT = SIZING_CACHE.labels(result="hit")
CACHE_MISS = SIZING_CACHE.labels(result="miss")
RUNS_CREATED = RUNS_INGESTED.labels(result="created")
SIX_STATS_DURATION = CORE_DURATION.labels(operation="six_stats")
SIZE_JOB_DURATION = CORE_DURATION.labels(operation="size_job")
RECOMMENDED = {(p, s): RECOMMENDATIONS.labels(phase=p, override_scope=s) for p in PHASES for s in OVERRIDE_SCOPES}
#: issue 40: ``ci_sizer_growths_total`` by result, each series created (at 0) here
GROWTH_RESULTS = ("grown", "deferred", "infeasible", "too_late", "error")
GROWN = {result: GROWTHS.labels(result=result) for result in GROWTH_RESULTS}


def use_sizing_deadline(deadline: float) -> None:
    """At the app's startup: export the sizing deadline (seconds), and give the request-duration
    histogram its edges (``latency_buckets``), with the sizing and ingest routes' series at 0. The
    histogram is built again when its edges differ (a process that starts an app with another
    deadline: tests); the middleware reads ``HTTP_DURATION`` when it first sees a route."""
    global HTTP_DURATION
    SIZING_DEADLINE.set(deadline)
    buckets = latency_buckets(deadline)
    if tuple(HTTP_DURATION._upper_bounds[:-1]) != buckets:
        with contextlib.suppress(KeyError):  # not registered (multiprocess mode builds its own registry)
            REGISTRY.unregister(HTTP_DURATION)
        HTTP_DURATION = _request_durations(buckets)
    HTTP_DURATION.labels(route=SIZING_ROUTE, method="GET")
    for route in INGEST_ROUTES:
        HTTP_DURATION.labels(route=route, method="POST")


def set_build_info(core_backend: str) -> None:
    BUILD_INFO.labels(version=__version__, core_backend=core_backend).set(1)


_DB_FILE = re.compile(r"_(\d+)\.db$")


def _server_pids(directory: str) -> set[int]:
    """The pids of the server's processes that wrote to ``directory``: this worker, the workers
    beside it (children of its parent) and the supervisor that started them (its parent). A pid
    is taken only while it is one of those, so neither a pid reused by an unrelated process after a
    worker died, nor a process a worker started (the large-body reducer), is ever taken."""
    found = {int(m.group(1)) for name in os.listdir(directory) if (m := _DB_FILE.search(name))}
    me, parent = os.getpid(), os.getppid()
    return {pid for pid in found if pid in (me, parent) or _parent_of(pid) == parent}


class ServingWorkers(_multiprocess.MultiProcessCollector):
    """prometheus-client's multiprocess collector, whose ``live*`` gauges (the worst worker's change
    feed and database, the workers' sum of backlog and running analyses) read only the workers that
    serve now: this one and those beside it. Not the supervisor, which serves nothing and whose
    gauges kept the 0 they were created with (``ci_sizer_database_ready`` read 0 on a healthy
    server: issue 39), not a process a worker started (it imports the metrics too), and not a
    worker that died without marking itself dead. Counters, histograms and the other gauges read
    every file, as prometheus-client does: a worker that was replaced still counted what it did."""

    def collect(self) -> Iterable[Metric]:
        serving = _server_pids(self._path) - {os.getppid()}
        files = []
        for path in glob.glob(os.path.join(self._path, "*.db")):
            name = os.path.basename(path)
            if name.startswith("gauge_live") and (m := _DB_FILE.search(name)) and int(m.group(1)) not in serving:
                continue
            files.append(path)
        return self.merge(files, accumulate=True)  # type: ignore[no-any-return,no-untyped-call]


class WorkerProcesses(Collector):
    """``process_*`` and ``python_info`` of each process that writes to the multiprocess directory
    (the workers, and the supervisor that started them), read from ``/proc`` and labelled ``pid``
    (``_server_pids``)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        platform = list(PlatformCollector(registry=None).collect())  # the same interpreter runs every worker
        for pid in sorted(_server_pids(self.directory)):
            for family in [*ProcessCollector(pid=functools.partial(int, pid), registry=None).collect(), *platform]:
                out = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    out.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
        return list(families.values())


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def render() -> tuple[bytes, str]:
    """The exposition text: this process's registry, or every worker's in multiprocess mode."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        registry = CollectorRegistry()
        ServingWorkers(registry, directory)  # type: ignore[no-untyped-call]
        registry.register(WorkerProcesses(directory))
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
