"""Metric objects (prometheus-client). Names: ``ci_sizer_`` prefix, base units, ``_total`` only on
counters, and never a label per org/repo/workflow/job.

Several uvicorn workers: set ``PROMETHEUS_MULTIPROC_DIR`` (``ci-sizer serve --workers N`` does) and
``/metrics`` aggregates every worker's values with prometheus-client's multiprocess collector.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as _multiprocess

from .. import __version__

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

HTTP_REQUESTS = Counter(
    "ci_sizer_http_requests_total",
    "HTTP requests answered.",
    ["route", "method", "status_class"],
)
HTTP_DURATION = Histogram(
    "ci_sizer_http_request_duration_seconds",
    "Time to answer an HTTP request.",
    ["route", "method"],
    buckets=_LATENCY_BUCKETS,
)
RUNS_INGESTED = Counter("ci_sizer_runs_ingested_total", "Runs posted, by result.", ["result"])
OOM_SUSPECT_RUNS = Counter(
    "ci_sizer_oom_suspect_runs_total",
    "Newly stored runs that were OOM-suspect (rule S1).",
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

#: Every metric family the service exports (the dashboard test checks its queries against these).
EXPORTED = (
    HTTP_REQUESTS,
    HTTP_DURATION,
    RUNS_INGESTED,
    OOM_SUSPECT_RUNS,
    RECOMMENDATIONS,
    CORE_DURATION,
    DATABASE_ERRORS,
    DEGRADED_ANSWERS,
    OVERRIDES,
    BUILD_INFO,
    FLEET_CPU,
    FLEET_MEMORY,
    FLEET_JOBS,
)


def set_build_info(core_backend: str) -> None:
    BUILD_INFO.labels(version=__version__, core_backend=core_backend).set(1)


def render() -> tuple[bytes, str]:
    """The exposition text: this process's registry, or every worker's in multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        _multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
