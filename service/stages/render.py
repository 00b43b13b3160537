"""The ``ci-sizer stage`` table: a stage answer (``POST /api/v1/stages:compute``) as text."""

from __future__ import annotations

from typing import Any


def render(answer: dict[str, Any]) -> str:
    """The answer as the ``ci-sizer stage`` table."""
    from service.console import table

    rows = []
    for s in answer["steps"]:
        src = s["source"]
        where = src["cpu"] if src["cpu"] == src["memory"] else f"cpu {src['cpu']}, memory {src['memory']}"
        if src.get("note"):
            where += f" ({src['note']})"
        rows.append(
            [
                s["name"] if s.get("iteration") is None else f"{s['name']} [{s['iteration']}]",
                "background" if s["background"] else "step",
                s["own"]["cpu"],
                s["own"]["memory"],
                s["cpu"]["request"],
                s["cpu"]["limit"],
                s["memory"]["request"],
                s["memory"]["limit"],
                where,
            ]
        )
    for n in answer.get("non_ci_steps", []):
        name = n["name"] if n.get("iteration") is None else f"{n['name']} [{n['iteration']}]"
        rows.append([name, "non-CI", "", "", "", "", "", "", "no container"])
    for c in answer.get("init_containers", []):
        rows.append(
            [
                c["name"],
                "init",
                "",
                "",
                c["cpu"]["request"],
                c["cpu"]["limit"],
                c["memory"]["request"],
                c["memory"]["limit"],
                "",
            ]
        )
    sc = answer["stage_container"]
    rows.append(
        [
            "stage container",
            "add-on",
            "",
            "",
            sc["cpu"]["request"],
            sc["cpu"]["limit"],
            sc["memory"]["request"],
            sc["memory"]["limit"],
            "",
        ]
    )
    headers = ["item", "kind", "own cpu", "own memory", "cpu req", "cpu limit", "mem req", "mem limit", "source"]
    out = [table(headers, rows, right=(2, 3, 4, 5, 6, 7))]
    pod, bg = answer["pod"], answer["total_with_background"]
    out.append("")
    out.append(f"stage with background: {bg['cpu']} CPU, {bg['memory']} memory")
    out.append(f"pod request (scheduling): {pod['request']['cpu']} CPU, {pod['request']['memory']} memory")
    out.append(f"pod limits (sum): {pod['limit']['cpu']} CPU, {pod['limit']['memory']} memory")
    for loop in answer.get("loops", []):
        where = "" if loop.get("iteration") is None else f" [{loop['iteration']}]"
        out.append(
            f"loop {loop['name']}{where}: {loop['copies']} copies, {loop['max_concurrency']} at once: "
            f"{loop['request']['cpu']} CPU, {loop['request']['memory']} memory"
        )
    out.append(f"CPU: {answer['decided_by']['cpu']['explanation']}")
    out.append(f"memory: {answer['decided_by']['memory']['explanation']}")
    if answer["degraded"]:
        out.append("degraded: the sizer's database failed or was slow; some steps took the defaults")
    return "\n".join(out)
