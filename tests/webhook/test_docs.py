"""docs/integrations/webhook.md says what the issue asks (three steps, the identity rule per runner with its
source, the webhook down, how to turn it off), and every runner page points to it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from service.webhook.identity import RUNNERS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations"
PAGES = {
    "arc": "github-actions-arc.md",
    "gitlab": "gitlab.md",
    "buildkite": "buildkite.md",
    "jenkins": "jenkins.md",
    "tekton": "tekton.md",
    "argo": "argo.md",
}


def test_every_runner_page_points_to_the_webhook() -> None:
    assert {r.name for r in RUNNERS} == set(PAGES)
    for page in [*PAGES.values(), "README.md"]:
        lines = [line for line in (DOCS / page).read_text().splitlines() if "(webhook.md" in line]
        assert lines, page


def test_the_page_says_what_the_issue_asks() -> None:
    text = (DOCS / "webhook.md").read_text()
    headings = re.findall(r"^##+ (.+)$", text, re.M)
    for wanted in (
        "Set up in three steps",
        "Which job a pod runs",
        "When the webhook is down",
        "Scope, and how to turn it off",
    ):
        assert wanted in headings, wanted
    for step in ("**1. Apply.**", "**2. Label**", "**3. Run a build.**"):
        assert step in text
    # each runner's identity rule names the source it comes from, and its main container
    for source in (
        "executors/kubernetes/kubernetes.go",
        "internal/controller/scheduler/scheduler.go",
        "packages/k8s/src/k8s/index.ts",
        "src/hooks/prepare-job.ts",
        "PodTemplateStepExecution.java",
        "pkg/pod/pod.go",
        "workflow/controller/workflowpod.go",
    ):
        assert source in text, source
    for runner in RUNNERS:
        assert f"| `{runner.main}` |" in text, runner.name
    # the anchor the runner pages link to exists
    assert "## Which job a pod runs" in text


def test_the_page_s_manifest_facts_are_the_manifests() -> None:
    text = (DOCS / "webhook.md").read_text()
    root = DOCS.parents[1] / "deploy" / "kubernetes" / "webhook" / "base"
    config = yaml.safe_load((root / "mutatingwebhookconfiguration.yaml").read_text())["webhooks"][0]
    assert f"`timeoutSeconds: {config['timeoutSeconds']}`" in text
    assert f"`failurePolicy: {config['failurePolicy']}`" in text
    deployment = yaml.safe_load((root / "deployment.yaml").read_text())
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert f"`--deadline-ms` ({env['CI_SIZER_WEBHOOK_DEADLINE_MS']})" in text
