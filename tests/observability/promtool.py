"""Alerting rules evaluated by ``promtool test rules`` on series taken from real scrapes of the
service: what it exported before a fault (healthy) and while a fault lasted, replayed minute by
minute, so that an alert is shown firing, and quiet, on the series the service really exports
(the ``promtool`` fixture: conftest.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from .test_metrics import _metric_names

RULES = Path("prometheus/rules/ci-sizer.yml")
Snapshot = dict[tuple[str, tuple[tuple[str, str], ...]], float]
#: the labels Prometheus adds to every series it scrapes from the service
TARGET = {"job": "ci-sizer", "instance": "ci-sizer-0:8080"}
_CUMULATIVE = ("_total", "_bucket", "_count", "_sum")


def rule(repo_root: Path, alert: str) -> dict[str, Any]:
    doc = yaml.safe_load((repo_root / RULES).read_text())
    (found,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == alert]
    return dict(found)


def _series(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted({**dict(labels), **TARGET}.items()))
    return f"{name}{{{inner}}}"


def replay(before: Snapshot, during: Snapshot, names: set[str], minutes: int) -> list[dict[str, str]]:
    """promtool input series, one sample a minute, of the series named ``names``: the values of
    ``before``, then ``minutes`` minutes in which each counter (``_total``, histogram buckets, ...)
    rises every minute by what it rose from ``before`` to ``during``, and each gauge holds its
    value in ``during``: the spell the two scrapes bracket, lasting that long."""
    out = []
    for (name, labels), value in sorted(during.items()):
        family = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
        if name not in names and family not in names:
            continue
        start = before.get((name, labels), 0.0 if name.endswith(_CUMULATIVE) else value)
        if name.endswith(_CUMULATIVE):
            values = f"{start:g}+{value - start:g}x{minutes}"
        else:
            values = f"{start:g} {value:g}x{minutes}"
        out.append({"series": _series(name, labels), "values": values})
    return out


def series_of(repo_root: Path, alert: str) -> set[str]:
    """The metric names the alert's expression reads (histograms by family: ``..._bucket``)."""
    return {n.removesuffix("_bucket") for n in _metric_names(rule(repo_root, alert)["expr"])}


def evaluate(
    promtool: str,
    repo_root: Path,
    tmp_path: Path,
    alert: str,
    input_series: list[dict[str, str]],
    *,
    eval_time: str,
    exp_labels: list[dict[str, str]],
) -> None:
    """``promtool test rules``: at ``eval_time`` the alert fires with exactly these label sets (none:
    quiet). The rules file is the project's with its annotations left out (they quote the value;
    prometheus/tests/ci-sizer.test.yml tests them on hand-written series)."""
    doc = yaml.safe_load((repo_root / RULES).read_text())
    for group in doc["groups"]:
        for r in group["rules"]:
            r.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc))
    case = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": input_series,
                "alert_rule_test": [
                    {
                        "eval_time": eval_time,
                        "alertname": alert,
                        "exp_alerts": [{"exp_labels": {**rule(repo_root, alert)["labels"], **e}} for e in exp_labels],
                    }
                ],
            }
        ],
    }
    (tmp_path / "case.yml").write_text(yaml.safe_dump(case))
    out = subprocess.run([promtool, "test", "rules", "case.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr + yaml.safe_dump(input_series)
