"""Every recipe of docs/integrations, run as its runner would run it (issue 17, point 3).

From each page: the YAML and shell are parsed (PyYAML, ``bash -n``; GitLab script items must be
strings), the curl line runs against a live ``ci-sizer serve`` and against a refused and a hanging
socket, and what it produced is merged into a fixture pod of that runner (tests/runner_pods.py, with
the upstream source of each layout). Every case must give the runner valid input: the merged pod has
an image on every container and valid quantities, and with the sizer down or hanging it is the pod
the runner would have built without the sizer. The outputs the pages show are the ones produced here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import yaml

from .. import runner_pods as rp
from ..helpers import MIB, container, run
from ..live import LiveServer, free_port

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations"
TOKEN = "sizer-secret-token-1234"
BLOCK = re.compile(r"<!-- test: (\w+) -->\n```(\w*)\n(.*?)```", re.S)
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
CONTAINERS = [
    container("build", cpu=1755, mem=1800 * MIB),
    container("helper", cpu=55, mem=90 * MIB),
    container("svc-postgres", cpu=240, mem=400 * MIB),
]
JOBS = {  # the identity each recipe asks for
    "arc": ("acme", "web", ".github/workflows/ci.yml", "build"),
    "gitlab": ("acme/platform", "web", ".gitlab-ci.yml", "build"),
    "buildkite": ("acme", "web", "pipeline.yml", "build"),
    "jenkins": ("acme", "web", "Jenkinsfile", "build"),
    "tekton": ("acme", "web", "ci.yml", "build"),
    "argo": ("acme", "web", "ci.yml", "build"),
}
ENV = {  # what each runner sets for the job
    "GITHUB_REPOSITORY_OWNER": "acme",
    "GITHUB_REPOSITORY": "acme/web",
    "GITHUB_WORKFLOW_REF": "acme/web/.github/workflows/ci.yml@refs/heads/main",
    "GITHUB_JOB": "build",
    "CI_PROJECT_NAMESPACE": "acme/platform",  # a nested group
    "CI_PROJECT_NAME": "web",
    "CI_CONFIG_PATH": ".gitlab-ci.yml",
    "BUILDKITE_ORGANIZATION_SLUG": "acme",
    "BUILDKITE_PIPELINE_SLUG": "web",
}


def page(name: str) -> str:
    return (DOCS / name).read_text()


def blocks(text: str) -> dict[str, str]:
    return {m.group(1): m.group(3) for m in BLOCK.finditer(text)}


# --------------------------------------------------------------------------- the three sizers


@pytest.fixture(scope="module")
def answering(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, dict[str, Any]]]]:
    """A live sizer holding three runs of each recipe's job; with the JSON answer of each."""
    db = tmp_path_factory.mktemp("recipes") / "sizer.db"
    with LiveServer(f"sqlite:///{db}") as server:
        answers = {}
        for name, (org, repo, workflow, job) in JOBS.items():
            ident = {"org": org, "repo": repo, "workflow": workflow, "job": job}
            for n in range(3):
                r = httpx.post(f"{server.url}/api/v1/runs", json=run(n, *CONTAINERS, job=ident), timeout=30)
                assert r.status_code in (200, 201), r.text
            quoted = "/".join(quote(s, safe="") for s in (org, repo, workflow, job))
            answers[name] = httpx.get(f"{server.url}/api/v1/sizing/{quoted}", timeout=30).json()
            assert answers[name]["meta"]["phase"] == "confident"
        yield server.url, answers


@pytest.fixture(scope="module")
def hanging() -> Iterator[str]:
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def empty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A live sizer that has never seen any job."""
    with LiveServer(f"sqlite:///{tmp_path_factory.mktemp('empty') / 'sizer.db'}") as server:
        yield server.url


@pytest.fixture(params=["answering", "down", "hanging", "never-seen"])
def case(request: pytest.FixtureRequest, answering: Any, hanging: str, empty: str) -> tuple[str, str]:
    if request.param == "answering":
        return "answering", answering[0]
    if request.param == "never-seen":
        return "never-seen", empty
    if request.param == "down":
        return "down", f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    return "hanging", hanging


def sh(script: str, cwd: Path, sizer: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a recipe's shell as the runner does (POSIX sh), with the runner's variables."""
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0, script
    full = {"PATH": os.environ["PATH"], "HOME": str(cwd), "SIZER": sizer, "SIZER_TOKEN": TOKEN, **ENV, **env}
    return subprocess.run(
        ["sh", "-c", script], cwd=cwd, env=full, capture_output=True, text=True, timeout=30, check=False
    )


# --------------------------------------------------------------------------- per runner


@dataclass
class Outcome:
    artifact: str  # what the recipe hands to the runner
    merged: rp.Pod  # the runner's pod with it applied
    unsized: rp.Pod  # the runner's pod without the sizer
    sized: dict[str, str]  # pod container -> recorded container that must size it when answering


def arc(text: str, tmp: Path, sizer: str) -> Outcome:
    script = blocks(text)["recipe"]
    template = tmp / "sizing" / "template.yaml"
    p = sh(script, tmp, sizer, ACTIONS_RUNNER_CONTAINER_HOOK_TEMPLATE=str(template))
    assert p.returncode == 0, p.stderr  # a hook that fails would fail the job
    artifact = template.read_text()
    pod = rp.arc_pod(services=("postgres:16",))
    return Outcome(artifact, rp.arc_apply(pod, artifact), pod, {"job": "build", "postgres": "svc-postgres"})


def gitlab(text: str, tmp: Path, sizer: str) -> Outcome:
    b = blocks(text)
    config = tomllib.loads(b["config"])["runners"][0]["kubernetes"]
    ci = yaml.safe_load(b["recipe"])
    items = ci["size"]["script"]
    assert all(isinstance(item, str) for item in items), items  # GitLab: script items are strings
    assert ci["build"]["trigger"]["include"][0] == {"artifact": "sizing.yml", "job": "size"}
    assert "sizing.yml" in ci["size"]["artifacts"]["paths"]
    p = sh("\n".join(items), tmp, sizer)
    assert p.returncode == 0, p.stdout + p.stderr
    artifact = (tmp / "sizing.yml").read_text()
    variables = yaml.safe_load(artifact)["variables"]
    return Outcome(artifact, rp.gitlab_apply(variables, config), rp.gitlab_apply({}, config), {"build": "build"})


def buildkite(text: str, tmp: Path, sizer: str) -> Outcome:
    p = sh(blocks(text)["recipe"], tmp, sizer)
    assert p.returncode == 0, p.stderr
    assert TOKEN not in p.stdout  # the uploaded pipeline carries no secret
    assert "$" not in p.stdout  # nor anything Buildkite would interpolate at upload time
    pipeline = yaml.safe_load(p.stdout)
    [step] = pipeline["steps"]
    plugin: dict[str, Any] = {}
    for entry in step["plugins"]:  # the controller unmarshals every kubernetes entry into one config
        assert set(entry) == {"kubernetes"}, entry
        plugin.update(entry["kubernetes"] or {})
    pod = rp.buildkite_pod()
    return Outcome(p.stdout, rp.buildkite_apply(pod, plugin), pod, {"container-0": "build"})


def jenkins(text: str, tmp: Path, sizer: str) -> Outcome:
    groovy = blocks(text)["recipe"]
    first_node = groovy.index("node {")
    assert "sh(" not in groovy[:first_node]
    assert groovy.index("sh(") > first_node
    [script] = re.findall(r"script: '''(.*?)'''", groovy, re.S)
    templates = tuple(re.findall(r"containerTemplate\(name: '([^']+)', image: '([^']+)'", groovy))
    assert templates
    p = sh(script, tmp, sizer)
    assert p.returncode == 0, p.stderr
    pod = rp.jenkins_apply(rp.jenkins_pod(templates), "")
    return Outcome(p.stdout, rp.jenkins_apply(rp.jenkins_pod(templates), p.stdout), pod, {"build": "build"})


def tekton(text: str, tmp: Path, sizer: str) -> Outcome:
    p = sh(blocks(text)["recipe"], tmp, sizer)
    assert p.returncode == 0, p.stderr
    artifact = (tmp / "taskrun.yaml").read_text()
    taskrun = yaml.safe_load(artifact)
    assert taskrun["apiVersion"] == "tekton.dev/v1"
    spec = {k: v for k, v in taskrun["spec"].items() if k != "taskRef"}
    steps, sidecars = ("build",), ("postgres",)  # the Task the recipe runs
    merged = rp.tekton_apply(steps, sidecars, spec, v1=True)
    return Outcome(
        artifact,
        merged,
        rp.tekton_apply(steps, sidecars, {}, v1=True),
        {"step-build": "build", "sidecar-postgres": "svc-postgres"},
    )


def argo(text: str, tmp: Path, sizer: str) -> Outcome:
    wf = yaml.safe_load(blocks(text)["recipe"])
    templates = {t["name"]: t for t in wf["spec"]["templates"]}
    assert templates["build"]["podSpecPatch"] == "{{inputs.parameters.patch}}"
    [[_], [build_step]] = templates["main"]["steps"]
    assert build_step["arguments"]["parameters"][0]["value"] == "{{steps.size.outputs.result}}"
    p = sh(templates["size"]["script"]["source"], tmp, sizer)
    assert p.returncode == 0, p.stderr
    pod = rp.argo_pod()
    return Outcome(p.stdout, rp.argo_apply(pod, p.stdout), pod, {"main": "build"})


RUNNERS: dict[str, tuple[str, Callable[[str, Path, str], Outcome]]] = {
    "arc": ("github-actions-arc.md", arc),
    "gitlab": ("gitlab.md", gitlab),
    "buildkite": ("buildkite.md", buildkite),
    "jenkins": ("jenkins.md", jenkins),
    "tekton": ("tekton.md", tekton),
    "argo": ("argo.md", argo),
}


def resources_of(pod: rp.Pod, name: str) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == name).get("resources") or {}


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_the_recipe_gives_the_runner_valid_input(
    runner: str, case: tuple[str, str], answering: Any, tmp_path: Path
) -> None:
    which, sizer = case
    doc, recipe = RUNNERS[runner]
    text = page(doc)
    out = recipe(text, tmp_path, sizer)
    rp.check_pod(out.merged)  # an image on every container, valid quantities, requests within limits
    rp.check_pod(out.unsized)
    if which == "never-seen":  # the main container at the unknown-phase defaults, the others untouched
        assert "*" not in out.artifact
        assert [c["name"] for c in out.merged["containers"]] == [c["name"] for c in out.unsized["containers"]]
        main = next(pod_name for pod_name, recorded in out.sized.items() if recorded == "build")
        assert resources_of(out.merged, main)["requests"] == {"cpu": "500m", "memory": "4Gi"}
        return
    shown = blocks(text)["answering" if which == "answering" else "down"]
    assert out.artifact == shown, f"{doc} shows another {which} output; it is:\n{out.artifact}"
    if which == "answering":
        answer = {c["name"]: c for c in answering[1][runner]["containers"]}
        for pod_name, recorded in out.sized.items():
            res = resources_of(out.merged, pod_name)
            assert rp.parse_quantity(res["requests"]["memory"]) == answer[recorded]["memory"]["request_bytes"]
            assert rp.parse_quantity(res["requests"]["cpu"]) * 1000 == answer[recorded]["cpu"]["request_millicores"]
        assert [c["name"] for c in out.merged["containers"]] == [c["name"] for c in out.unsized["containers"]]
    else:
        assert out.merged == out.unsized  # a no-op: the pod the runner builds without the sizer


@pytest.mark.parametrize("doc", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_yaml_and_shell_block_parses(doc: str) -> None:
    text = page(doc)
    for lang, body in FENCE.findall(text):
        if lang == "yaml" and body.strip():
            yaml.safe_load(body)
        elif lang == "sh":
            p = subprocess.run(["bash", "-n"], input=body, text=True, capture_output=True, check=False)
            assert p.returncode == 0, f"{doc}: {p.stderr}"
        elif lang == "toml":
            tomllib.loads(body)
        elif lang == "json" and body.strip():
            json.loads(body)


def test_every_recipe_page_is_tested() -> None:
    assert {doc for doc, _ in RUNNERS.values()} == {p.name for p in DOCS.glob("*.md")} - {"README.md", "growth.md"}
    for doc, _ in RUNNERS.values():
        assert {"recipe", "answering", "down"} <= set(blocks(page(doc))), doc
