"""One row of the jobs list in its wire shape (``router.JobPublic``), for the API and the page alike."""

from __future__ import annotations

from typing import Any

from service.jobs import risk
from service.jobs.money import Prices, money_block
from service.jobs.service import WINDOW_DAYS
from service.wire import to_rfc3339


def public(row: Any, prices: Prices) -> dict[str, Any]:
    """One row of the list in its wire shape (``models.JobPublic``)."""
    summarised = row.phase is not None

    def r(value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    flags = row.risk if summarised else None
    return {
        "org": row.org,
        "repo": row.repo,
        "workflow": row.workflow,
        "job": row.job,
        "phase": row.phase,
        "override_scope": row.override_scope,
        "oom_backoff": row.oom_backoff,
        "last_run_at": to_rfc3339(row.last_run_at),
        "window_days": WINDOW_DAYS,
        "runs": row.window_runs,
        "oom_kills": row.window_oom_kills,
        "run_hours_per_day": r(row.run_hours_per_day),
        "in_force": {
            "cpu_request_millicores": row.in_force_cpu_request_millicores,
            "memory_limit_bytes": row.in_force_memory_limit_bytes,
        },
        "answer": None
        if not summarised
        else {
            "cpu_request_millicores": row.answer_cpu_request_millicores,
            "memory_limit_bytes": row.answer_memory_limit_bytes,
        },
        "saved_per_day": {
            "memory_gib_hours": r(row.saved_memory_gib_hours_per_day),
            "cpu_core_hours": r(row.saved_cpu_core_hours_per_day),
        },
        "saved_money": money_block(prices, row.saved_memory_gib_hours_per_day, row.saved_cpu_core_hours_per_day),
        "risk": {"level": risk.level(flags), "reasons": risk.reasons(flags)},
        "containers": [_container(c) for c in risk.load(row.containers if summarised else None)],
        "summarised_at": to_rfc3339(row.refreshed_at),
    }


def _container(c: dict[str, Any]) -> dict[str, Any]:
    """A stored ``risk.ContainerRisk`` in its wire shape (``JobContainerPublic``)."""
    return {
        "name": c["name"],
        "answer": {
            "memory_limit_bytes": c["memory_limit_bytes"],
            "memory_limit_source": c["memory_limit_source"],
            "cpu_request_millicores": c["cpu_request_millicores"],
            "cpu_limit_millicores": c["cpu_limit_millicores"],
            "cpu_limit_source": c["cpu_limit_source"],
            "cpu_enforced": c["cpu_enforced"],
        },
        "ran_with": {
            "memory_limit_bytes": c["ran_with_memory_limit_bytes"],
            "cpu_request_millicores": c["ran_with_cpu_request_millicores"],
        },
        "used": {"memory_peak_bytes": c["peak_memory_bytes"], "cpu_p95_millicores": c["cpu_p95_millicores"]},
        "oom_consecutive": c["oom_consecutive"],
        "below_peak": c["below_peak"],
        "throttled": c["throttled"],
    }
