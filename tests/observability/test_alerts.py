"""The alerting rules (prometheus/rules/ci-sizer.yml): valid (``promtool check rules``), unit-tested
(``promtool test rules`` on prometheus/tests/ci-sizer.test.yml), reading only exported metrics,
wired into Prometheus, compose and the Kubernetes deployment, and documented.

promtool comes with Debian's ``prometheus`` package, which ``.ci/run`` installs when it is absent.
Without it these tests skip, loudly, on a developer's machine; under CI (``CI`` set, as CI runs
``.ci/run``) they fail instead, so the rules are never merged untested."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .test_metrics import _exported_series, _metric_names

RULES = Path("prometheus/rules/ci-sizer.yml")
RULE_TESTS = Path("prometheus/tests/ci-sizer.test.yml")


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = (
            "promtool not found: install Debian's prometheus package "
            "(apt-get install --no-install-recommends prometheus); the alert rules were NOT checked"
        )
        if os.environ.get("CI", "") not in ("", "0", "false"):
            pytest.fail(message + " (CI must check them: .ci/run installs it)")
        pytest.skip(message)
    return found


def _rules(repo_root: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load((repo_root / RULES).read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_check_rules(promtool: str, repo_root: Path) -> None:
    out = subprocess.run([promtool, "check", "rules", str(RULES)], cwd=repo_root, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(_rules(repo_root))} rules found" in out.stdout


def test_promtool_test_rules(promtool: str, repo_root: Path) -> None:
    out = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], cwd=repo_root, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_test_rules_catches_a_wrong_threshold(promtool: str, repo_root: Path, tmp_path: Path) -> None:
    # the unit tests can fail: the same tests against rules with a loosened threshold do
    text = (repo_root / RULES).read_text()
    assert text.count("> 0.05") == 2
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules" / RULES.name).write_text(text.replace("> 0.05", "> 0.5"))
    shutil.copy(repo_root / RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    out = subprocess.run(
        [promtool, "test", "rules", f"tests/{RULE_TESTS.name}"], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode != 0
    assert "CiSizerDegradedAnswers" in out.stdout + out.stderr
    assert "CiSizerIngestUnavailable" in out.stdout + out.stderr


def test_the_issue_s_alerts_are_there(repo_root: Path) -> None:
    names = {rule["alert"] for rule in _rules(repo_root)}
    assert {
        "CiSizerDegradedAnswers",
        "CiSizerIngestUnavailable",
        "CiSizerSizingSlow",
        "CiSizerChangeFeedDown",
        "CiSizerRetentionBacklog",
        "CiSizerDatabaseNotReady",
        "CiSizerAnalysesFailing",
    } <= names


def test_every_alert_is_unit_tested_firing_and_quiet(repo_root: Path) -> None:
    doc = yaml.safe_load((repo_root / RULE_TESTS).read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in doc["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in _rules(repo_root)}
    assert firing == names
    assert quiet == names


def test_every_rule_reads_exported_metrics(repo_root: Path) -> None:
    exported = _exported_series() | {"up"}  # up: Prometheus' own, per target
    for rule in _rules(repo_root):
        names = _metric_names(rule["expr"])  # raises ValueError on a PromQL syntax error
        assert names, rule["alert"]
        assert names <= exported, (rule["alert"], names - exported)
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["runbook"] == f"docs/observability.md#{rule['alert'].lower()}"


def test_every_alert_has_a_runbook_section(repo_root: Path) -> None:
    doc = (repo_root / "docs" / "observability.md").read_text()
    for rule in _rules(repo_root):
        assert f"\n#### {rule['alert']}\n" in doc, rule["alert"]


def test_rules_are_wired_into_prometheus_and_compose(repo_root: Path) -> None:
    prom = yaml.safe_load((repo_root / "prometheus/prometheus.yml").read_text())
    assert prom["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    compose = yaml.safe_load((repo_root / "docker-compose.yml").read_text())
    assert "./prometheus/rules:/etc/prometheus/rules:ro" in compose["services"]["prometheus"]["volumes"]
    # what the glob loads is rules only (the unit tests live in prometheus/tests)
    assert sorted(p.name for p in (repo_root / "prometheus/rules").glob("*.yml")) == [RULES.name]


def test_kubernetes_prometheusrule_holds_the_same_rules(repo_root: Path) -> None:
    rule = yaml.safe_load((repo_root / "deploy/kubernetes/base/prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == yaml.safe_load((repo_root / RULES).read_text())["groups"]
