"""Whose job a pod runs (service/webhook/identity.py), from each runner's own pod (tests/webhook/pods.py,
shaped from the cited source), and the rule the collector records the same job under."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.collector.payload import identity_from_env
from service.keys import ScopeKey
from service.webhook.identity import (
    IdentityFileError,
    argo_step,
    container_env,
    identify,
    jenkins_job_name,
    load_rules,
)

from . import pods

NS = "ci"


@pytest.mark.parametrize(
    ("name", "pod", "key", "main"),
    [
        ("arc", pods.arc(), ScopeKey("acme", "web", ".github/workflows/ci.yml", "build"), "job"),
        ("gitlab", pods.gitlab(), ScopeKey("acme", "web", ".gitlab-ci.yml", "build"), "build"),
        ("buildkite", pods.buildkite(), ScopeKey("acme", "web", "pipeline.yml", "build"), "container-0"),
        ("jenkins", pods.jenkins(), ScopeKey("acme", "web", "Jenkinsfile", "main"), "jnlp"),
        ("tekton", pods.tekton(), ScopeKey(NS, "web-ci", "tekton", "build"), "step-build"),
        ("argo", pods.argo(), ScopeKey(NS, "web", "argo", "build"), "main"),
    ],
)
def test_each_runner_s_pod_names_its_job(name: str, pod: pods.Doc, key: ScopeKey, main: str) -> None:
    who = identify(pod, NS)
    assert who is not None
    assert (who.rule, who.key, who.main) == (name, key, main)


def test_the_env_runners_give_the_identity_the_collector_records() -> None:
    # one rule for both sides: what `ci-sizer collect` in the build container would post
    for pod, container in ((pods.gitlab(), "build"), (pods.arc(), "job")):
        recorded = identity_from_env(container_env(pod, container))
        who = identify(pod, NS)
        assert who is not None
        assert who.key == ScopeKey(recorded["org"], recorded["repo"], recorded["workflow"], recorded["job"])


def test_arc_without_the_github_variables_is_an_unknown_identity() -> None:
    # runner-container-hooks puts only the workflow's container.env (and GITHUB_ACTIONS, CI) on the job
    # container: without GITHUB_REPOSITORY/GITHUB_WORKFLOW_REF/GITHUB_JOB there, no job can be told
    assert identify(pods.arc(identity=False), NS) is None


def test_a_rule_that_matches_but_lacks_a_field_is_unknown() -> None:
    assert identify(pods.argo(repo=None), NS) is None  # Argo names no repository
    assert identify(pods.buildkite(step_key=""), NS) is None  # a step without a key


def test_a_pod_no_runner_made_is_unknown_unless_annotated() -> None:
    plain = pods.pod("p", {"app": "x"}, None, pods.client.V1PodSpec(containers=[pods.c("build", "alpine")]))
    assert identify(plain, NS) is None
    plain["metadata"]["annotations"] = {
        f"ci-sizer.io/{f}": v for f, v in zip(("org", "repo", "workflow", "job"), "abcd", strict=True)
    }
    who = identify(plain, NS)
    assert who is not None
    assert (who.key, who.rule, who.main) == (ScopeKey("a", "b", "c", "d"), "annotations", "build")


def test_annotations_win_field_by_field() -> None:
    pod = pods.tekton()
    pod["metadata"]["annotations"] |= {"ci-sizer.io/repo": "web", "ci-sizer.io/org": "acme"}
    who = identify(pod, NS)
    assert who is not None
    assert who.key == ScopeKey("acme", "web", "tekton", "build")


def test_tekton_lone_taskrun_and_container_names() -> None:
    who = identify(pods.tekton(pipeline=False), NS)
    assert who is not None
    assert who.key == ScopeKey(NS, "golang-build", "tekton", "golang-build")
    assert (who.recorded("step-test"), who.recorded("sidecar-postgres"), who.recorded("main")) == (
        "test",
        "postgres",
        "main",
    )


@pytest.mark.parametrize(
    ("node", "step"),
    [
        ("ci-x7k2p.build", "build"),
        ("ci-x7k2p[0].build", "build"),
        ("ci-x7k2p.main.build(1)", "build"),
        ("ci-x7k2p[0].test(0:linux.amd64)", "test"),
        ("ci-x7k2p", ""),
    ],
)
def test_argo_node_names(node: str, step: str) -> None:
    assert argo_step(node) == step


def test_jenkins_run_urls() -> None:
    assert jenkins_job_name("job/acme/job/web/job/main/42/") == "acme/web/main"
    assert jenkins_job_name("job/my%20folder/job/feature%2Fx/7/") == "my folder/feature/x"
    assert jenkins_job_name("") == ""


def test_names_the_sizer_would_refuse_are_unknown() -> None:
    pod = pods.gitlab()
    build = pod["spec"]["containers"][0]
    build["env"] = [
        e if e["name"] != "CI_JOB_NAME" else {"name": "CI_JOB_NAME", "value": "bad\x07name"} for e in build["env"]
    ]
    assert identify(pod, NS) is None


def test_an_operator_rule_comes_first(tmp_path: Path) -> None:
    path = tmp_path / "identity.yaml"
    path.write_text(
        """
identities:
  - name: in-house
    match: {labels: {app: ci-job}, namespaces: [ci]}
    main: runner
    org: {value: acme}
    repo: {label: ci.example.com/repo}
    workflow: {annotation: ci.example.com/pipeline}
    job: {env: JOB_NAME}
  - name: gitlab-by-namespace
    match: {labels: {project.runner.gitlab.com/id: "*"}}
    org: {namespace: true}
    repo: {label: project.runner.gitlab.com/name}
    workflow: {value: gitlab}
    job: {env: CI_JOB_NAME}
"""
    )
    rules = load_rules(path)
    mine = pods.pod(
        "p",
        {"app": "ci-job", "ci.example.com/repo": "web"},
        {"ci.example.com/pipeline": "release"},
        pods.client.V1PodSpec(
            containers=[pods.c("runner", "alpine", env=pods.env(JOB_NAME="package")), pods.c("cache", "redis")]
        ),
    )
    who = identify(mine, "ci", rules)
    assert who is not None
    assert (who.rule, who.key, who.main) == ("in-house", ScopeKey("acme", "web", "release", "package"), "runner")
    assert identify(mine, "other", rules) is None  # the rule's namespaces: nothing else matches this pod
    who = identify(pods.gitlab(), "team-a", rules)  # an operator's rule before the built-in one
    assert who is not None
    assert (who.rule, who.key, who.main) == (
        "gitlab-by-namespace",
        ScopeKey("team-a", "web", "gitlab", "build"),
        "build",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "identities: [{name: x, match: {}, org: {value: a}, repo: {value: b}, workflow: {value: c}, job: {value: d}}]",
            "match needs",
        ),
        (
            "identities: [{name: x, match: {labels: {a: b}}, org: {value: a, label: b}, repo: {value: b}, workflow: {value: c}, job: {value: d}}]",
            "exactly one",
        ),
        (
            "identities: [{name: x, match: {labels: {a: b}}, org: {value: a}, repo: {value: b}, workflow: {value: c}}]",
            "job",
        ),
        (
            "identities: [{name: x, match: {labels: {a: b}}, org: {value: a}, repo: {value: b}, workflow: {value: c}, job: {value: d}}, {name: x, match: {labels: {a: b}}, org: {value: a}, repo: {value: b}, workflow: {value: c}, job: {value: d}}]",
            "twice",
        ),
        ("identities: [", "does not parse"),
    ],
)
def test_a_bad_identity_file_says_why(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "identity.yaml"
    path.write_text(text)
    with pytest.raises(IdentityFileError, match=message):
        load_rules(path)
