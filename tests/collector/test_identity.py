"""The run's identity as each CI system gives it in the environment."""

from __future__ import annotations

import pytest

from service.collector import payload


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/web", "GITHUB_REPOSITORY_OWNER": "acme",
             "GITHUB_WORKFLOW_REF": "acme/web/.github/workflows/ci.yml@refs/heads/main", "GITHUB_JOB": "build",
             "GITHUB_RUN_ID": "99", "GITHUB_RUN_ATTEMPT": "2"},
            ("acme", "web", ".github/workflows/ci.yml", "build", "99-2"),
        ),
        (
            {"GITLAB_CI": "true", "CI_PROJECT_NAMESPACE": "acme/platform", "CI_PROJECT_NAME": "web",
             "CI_JOB_NAME": "test 1/3", "CI_JOB_ID": "555"},
            ("acme/platform", "web", ".gitlab-ci.yml", "test 1/3", "555"),
        ),
        (
            {"BUILDKITE": "true", "BUILDKITE_ORGANIZATION_SLUG": "acme", "BUILDKITE_PIPELINE_SLUG": "web",
             "BUILDKITE_STEP_KEY": "build", "BUILDKITE_JOB_ID": "0190-ab", "BUILDKITE_RETRY_COUNT": "1"},
            ("acme", "web", "pipeline.yml", "build", "0190-ab-1"),
        ),
        (
            {"JENKINS_URL": "https://ci", "JOB_NAME": "acme/web/main", "STAGE_NAME": "Build",
             "BUILD_TAG": "jenkins-acme-web-main-12"},
            ("acme", "web", "Jenkinsfile", "Build", "jenkins-acme-web-main-12"),
        ),
        (  # a branch may hold an "@": the workflow path ends at the ref's first one (so does the ARC recipe's)
            {"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/web", "GITHUB_REPOSITORY_OWNER": "acme",
             "GITHUB_WORKFLOW_REF": "acme/web/.github/workflows/ci.yml@refs/heads/fix@2", "GITHUB_JOB": "build",
             "GITHUB_RUN_ID": "99", "GITHUB_RUN_ATTEMPT": "1"},
            ("acme", "web", ".github/workflows/ci.yml", "build", "99-1"),
        ),
        (  # outside a stage body there is no STAGE_NAME (pipeline-stage-step StageStepExecution): the job is
           # the last part of JOB_NAME, a multibranch job's branch; the Jenkins recipe gives --job (issue 32, 2)
            {"JENKINS_URL": "https://ci", "JOB_NAME": "acme/web/main", "BUILD_TAG": "jenkins-acme-web-main-12"},
            ("acme", "web", "Jenkinsfile", "main", "jenkins-acme-web-main-12"),
        ),
    ],
)  # fmt: skip
def test_identity_from_ci_environments(env: dict[str, str], expected: tuple[str, ...]) -> None:
    found = payload.identity_from_env(env)
    assert (found["org"], found["repo"], found["workflow"], found["job"], found["run_id"]) == expected
