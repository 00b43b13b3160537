"""What is posted: the run's identity (given, or read from the CI system's environment) and the
body of ``POST /api/v1/runs`` built from a measurement."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.collector.sampling import Measurement


@dataclass
class Identity:
    org: str
    repo: str
    workflow: str
    job: str
    run_id: str


def identity_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """What the CI system says about the job: GitHub Actions, GitLab, Buildkite, Jenkins."""
    g = env.get
    if g("GITHUB_ACTIONS") == "true":
        owner, _, repo = (g("GITHUB_REPOSITORY") or "/").partition("/")
        ref = g("GITHUB_WORKFLOW_REF", "")  # owner/repo/.github/workflows/ci.yml@refs/heads/main
        workflow = ref.split("@", 1)[0].split("/", 2)[2] if ref.count("/") >= 2 else g("GITHUB_WORKFLOW", "")
        return {
            "org": g("GITHUB_REPOSITORY_OWNER") or owner,
            "repo": repo,
            "workflow": workflow,
            "job": g("GITHUB_JOB", ""),
            "run_id": f"{g('GITHUB_RUN_ID', '')}-{g('GITHUB_RUN_ATTEMPT', '1')}",
        }
    if g("GITLAB_CI") == "true":
        return {
            "org": g("CI_PROJECT_NAMESPACE", ""),
            "repo": g("CI_PROJECT_NAME", ""),
            "workflow": g("CI_CONFIG_PATH") or ".gitlab-ci.yml",
            "job": g("CI_JOB_NAME", ""),
            "run_id": g("CI_JOB_ID", ""),
        }
    if g("BUILDKITE") == "true":
        return {
            "org": g("BUILDKITE_ORGANIZATION_SLUG", ""),
            "repo": g("BUILDKITE_PIPELINE_SLUG", ""),
            "workflow": "pipeline.yml",
            "job": g("BUILDKITE_STEP_KEY") or g("BUILDKITE_LABEL", ""),
            "run_id": f"{g('BUILDKITE_JOB_ID', '')}-{g('BUILDKITE_RETRY_COUNT', '0')}",
        }
    if g("JENKINS_URL"):
        parts = g("JOB_NAME", "").split("/")
        return {
            "org": parts[0] if len(parts) > 2 else "jenkins",
            "repo": parts[-2] if len(parts) > 1 else parts[0],
            "workflow": "Jenkinsfile",
            "job": g("STAGE_NAME") or parts[-1],
            "run_id": g("BUILD_TAG", ""),
        }
    return {}


def payload(
    identity: Identity, m: Measurement, container: str, growths: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": container,
        "cpu_samples_millicores": [round(v, 3) for v in m.cpu_samples_millicores],
        "memory_peak_bytes": m.memory_peak_bytes,
    }
    if m.memory_limit_bytes is not None:
        c["memory_limit_bytes"] = m.memory_limit_bytes
    if m.oom_kill_events is not None:
        c["oom_kill_events"] = m.oom_kill_events
    if growths:
        c["growths"] = growths  # --grow's events (service.growth)
    body: dict[str, Any] = {
        "org": identity.org,
        "repo": identity.repo,
        "workflow": identity.workflow,
        "job": identity.job,
        "run_id": identity.run_id,
        "started_at": m.started_at.isoformat().replace("+00:00", "Z"),
        "finished_at": (m.finished_at or datetime.now(UTC)).isoformat().replace("+00:00", "Z"),
        "containers": [c],
    }
    node = _node_memory()
    if node is not None:
        body["node_memory_bytes"] = node
    return body


def _node_memory() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None
