"""Conventions of grafana/dashboards/*.json (issue 39, item 4): every panel has a unit; a rate and a
count never share an axis; a table is an instant query; the grid has no empty rows; and each
figure is aggregated across replicas as docs/observability.md says (item 2).

Field names are Grafana's own: units from packages/grafana-data/src/valueFormats/categories.ts,
the query's ``instant``, ``range`` and ``format`` from packages/grafana-prometheus/src/dataquery.ts,
the ``byFrameRefID`` matcher from packages/grafana-data/src/transformations/matchers/ids.ts and the
axis placements from packages/grafana-schema/src/common/common.gen.ts (grafana/grafana)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

#: Grafana's "Throughput" units: per second, or per minute
RATE_UNITS = {"cps", "ops", "reqps", "rps", "wps", "iops", "cpm", "opm", "rpm", "wpm"}
#: the ranges Grafana fills in, given a value so that a query parses as PromQL
_GRAFANA_VARIABLES = re.compile(r"\$__(rate_interval|interval|range)\b")


def dashboards(repo_root: Path) -> list[tuple[str, dict[str, Any]]]:
    found = sorted((repo_root / "grafana" / "dashboards").glob("*.json"))
    assert found
    return [(path.name, json.loads(path.read_text())) for path in found]


def _panels(repo_root: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, dashboard in dashboards(repo_root):
        for panel in dashboard["panels"]:
            yield f"{name}: panel {panel['id']} {panel['title']!r}", panel


def _parse(expr: str) -> Any:
    return promql_parser.parse(_GRAFANA_VARIABLES.sub("1m", expr))


def kind(expr: str) -> str:
    """``rate``: a per-second rate of counters (``rate()`` under aggregations); ``level``: a gauge's
    value or a count (``increase()``), aggregated; ``other``: ratios, quantiles and the rest."""
    node = _parse(expr)
    while isinstance(node, promql_parser.AggregateExpr):
        node = node.expr
    if isinstance(node, promql_parser.Call):
        name = node.func.name
        return "rate" if name in ("rate", "irate") else "level" if name == "increase" else "other"
    return "level" if isinstance(node, promql_parser.VectorSelector) else "other"


def effective(panel: dict[str, Any], ref: str, prop: str, default: Any = None) -> Any:
    """A field property of one query's series: its ``byFrameRefID`` override, else the panel's default."""
    config = panel.get("fieldConfig", {})
    value = config.get("defaults", {})
    for part in prop.split("."):
        value = value.get(part, {}) if isinstance(value, dict) else {}
    found = value if value != {} else default
    for override in config.get("overrides", []):
        if override["matcher"] == {"id": "byFrameRefID", "options": ref}:
            for p in override["properties"]:
                if p["id"] == prop:
                    found = p["value"]
    return found


def test_the_kind_of_a_query_is_read_right() -> None:
    assert kind("sum by (route) (rate(x_total[$__rate_interval]))") == "rate"
    assert kind("max by (kind) (ci_sizer_fleet_cpu_cores)") == "level"
    assert kind("sum by (kind, result) (increase(x_total[$__rate_interval]))") == "level"
    assert kind("sum(rate(a_total[1m])) / sum(rate(b_total[1m]))") == "other"
    assert kind("histogram_quantile(0.99, sum by (le) (rate(x_bucket[1m])))") == "other"


def test_every_panel_has_a_unit(repo_root: Path) -> None:
    for where, panel in _panels(repo_root):
        assert panel.get("fieldConfig", {}).get("defaults", {}).get("unit"), where


def test_a_rate_and_a_count_never_share_an_axis(repo_root: Path) -> None:
    """A per-second rate reads in a throughput unit, a gauge or a count in another; when one panel
    shows both, they have their own units and their own axes (the second one on the right)."""
    for where, panel in _panels(repo_root):
        if panel["type"] != "timeseries":
            continue
        axes: dict[tuple[str, str], set[str]] = {}
        for target in panel["targets"]:
            ref, what = target["refId"], kind(target["expr"])
            unit = effective(panel, ref, "unit")
            if what == "rate":
                assert unit in RATE_UNITS, (where, ref, unit)
            elif what == "level":
                assert unit not in RATE_UNITS, (where, ref, unit)
            placement = effective(panel, ref, "custom.axisPlacement", "auto")
            axes.setdefault((unit, placement), set()).add(what)
        placements = [placement for _, placement in axes]
        assert len(placements) == len(set(placements)) or len(axes) == 1, (where, axes)
        for kinds in axes.values():
            assert not {"rate", "level"} <= kinds, (where, axes)


def test_tables_are_instant_queries(repo_root: Path) -> None:
    # one row per series, now: not a row per timestamp of the dashboard's range
    tables = [(where, panel) for where, panel in _panels(repo_root) if panel["type"] == "table"]
    assert tables
    for where, panel in tables:
        for target in panel["targets"]:
            assert target.get("instant") is True, where
            assert target.get("range") is False, where
            assert target.get("format") == "table", where


def test_the_grid_has_no_empty_rows_and_no_overlaps(repo_root: Path) -> None:
    for name, dashboard in dashboards(repo_root):
        cells: dict[tuple[int, int], int] = {}
        for panel in dashboard["panels"]:
            g = panel["gridPos"]
            assert 0 <= g["x"], (name, panel["id"])
            assert g["x"] + g["w"] <= 24, (name, panel["id"])
            for y in range(g["y"], g["y"] + g["h"]):
                for x in range(g["x"], g["x"] + g["w"]):
                    assert (x, y) not in cells, (name, panel["id"], "overlaps", cells[(x, y)])
                    cells[(x, y)] = panel["id"]
        bottom = max(y for _, y in cells) + 1
        empty = [y for y in range(bottom) if not any((x, y) in cells for x in range(24))]
        assert empty == [], (name, empty)


def aggregations(expr: str) -> Iterator[tuple[str, str]]:
    """(metric, aggregation) for each gauge the expression aggregates as it is (no function between)."""

    def walk(node: Any) -> Iterator[tuple[str, str]]:
        if isinstance(node, promql_parser.AggregateExpr):
            inner = node.expr
            while isinstance(inner, promql_parser.ParenExpr):
                inner = inner.expr
            if isinstance(inner, promql_parser.VectorSelector) and inner.name:
                yield inner.name, str(node.op).lower()
            yield from walk(node.expr)
        elif isinstance(node, promql_parser.BinaryExpr):
            yield from walk(node.lhs)
            yield from walk(node.rhs)
        elif isinstance(node, promql_parser.Call):
            for arg in node.args:
                yield from walk(arg)
        elif isinstance(node, promql_parser.ParenExpr):
            yield from walk(node.expr)

    yield from walk(_parse(expr))


def documented_aggregation(repo_root: Path) -> dict[str, str]:
    """docs/observability.md's table "Across replicas": each gauge, and how the dashboard and the
    alerts aggregate it across replicas (the first word of that column)."""
    text = (repo_root / "docs" / "observability.md").read_text()
    section = text.split("### Across replicas", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`ci_sizer_"):
            continue
        how = re.match(r"`(\w+)", cells[1])
        assert how, line
        for metric in re.findall(r"`(ci_sizer_\w+)`", cells[0]):
            out[metric] = how.group(1)
    return out


def test_fleet_figures_are_aggregated_as_documented(repo_root: Path) -> None:
    documented = documented_aggregation(repo_root)
    # the figures every replica reads from the one database are taken once (issue 39, item 2)
    for figure in (
        "ci_sizer_fleet_cpu_cores",
        "ci_sizer_fleet_memory_bytes",
        "ci_sizer_fleet_jobs",
        "ci_sizer_overrides",
    ):
        assert documented[figure] == "max", figure
    rules = yaml.safe_load((repo_root / "prometheus/rules/ci-sizer.yml").read_text())
    exprs = [(f"rule {r['alert']}", r["expr"]) for g in rules["groups"] for r in g["rules"]]
    exprs += [(where, t["expr"]) for where, panel in _panels(repo_root) for t in panel["targets"]]
    seen = set()
    for where, expr in exprs:
        for metric, how in aggregations(expr):
            if metric in documented:
                assert how == documented[metric], (where, metric, how, documented[metric])
                seen.add(metric)
    assert {"ci_sizer_fleet_cpu_cores", "ci_sizer_fleet_memory_bytes", "ci_sizer_overrides"} <= seen


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("sum by (kind) (ci_sizer_fleet_cpu_cores)", {("ci_sizer_fleet_cpu_cores", "sum")}),
        ("max(a{kind='x'}) / clamp_min(max(b), 1)", {("a", "max"), ("b", "max")}),
        ("sum(rate(c_total[1m]))", set()),
    ],
)
def test_aggregations_are_read_right(expr: str, expected: set[tuple[str, str]]) -> None:
    assert set(aggregations(expr)) == expected
