"""The backtest's report as text: the fleet table with the frontier marked, and the riskiest jobs."""

from __future__ import annotations

from typing import Any


def render(result: dict[str, Any], *, jobs: int = 10) -> str:
    """The fleet table (``*`` marks the frontier) and the riskiest jobs under the first policy."""
    from service.console import table

    rows = []
    for r in result["policies"]:
        mark = ("M" if r["frontier"]["memory"] else "") + ("C" if r["frontier"]["cpu"] else "")
        throttle = "-" if r["throttle_share"] is None else f"{r['throttled_runs']} ({r['throttle_share']:.1%})"
        memory = r["runs_scored"] > 0
        rows.append(
            [
                r["label"],
                mark,
                f"{r['oom_risk_runs']} ({r['oom_risk_share']:.1%})" if memory else "-",
                throttle,
                f"{r['cpu_waste_core_hours']:.1f}" if r["cpu_request_core_hours"] else "-",
                f"{r['memory_waste_gib_hours']:.1f}" if memory else "-",
            ]
        )
    container_runs = result.get("container_runs", result["runs"])  # reports stored before issue 34
    head = (
        f"{result['runs']} runs of {result['jobs']} jobs ({result['containers']} containers, {container_runs} "
        "container-runs; OOM risk and throttling count container-runs, both out of the container-runs scored)"
    )
    out = [
        head,
        "",
        table(
            ["policy", "frontier", "OOM risk runs", "throttled runs", "CPU waste core-h", "memory waste GiB-h"],
            rows,
            right=(2, 3, 4, 5),
        ),
        "",
        "frontier: M = no other policy has both fewer OOM-risk runs and less memory waste; C = the same for "
        "throttled runs and CPU waste. Baselines are approximations of other right-sizers, not their code.",
    ]
    if jobs and result["per_job"]:
        first = result["policies"][0]["label"]
        worst = sorted(result["per_job"], key=lambda j: -j["policies"][0]["oom_risk_runs"])[:jobs]
        job_rows = [
            [
                "/".join((j["org"], j["repo"], j["workflow"], j["job"])),
                j["policies"][0]["runs_scored"],
                j["policies"][0]["oom_risk_runs"],
                f"{j['policies'][0]['memory_waste_gib_hours']:.1f}",
            ]
            for j in worst
        ]
        out += [
            "",
            f"riskiest jobs under {first}:",
            table(["job", "container-runs", "OOM risk", "memory waste GiB-h"], job_rows, right=(1, 2, 3)),
        ]
    return "\n".join(out)
