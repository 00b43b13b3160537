"""Every recipe of docs/integrations, run as its runner runs it (issues 17 and 32).

From each page the YAML and shell are taken as written, parsed (PyYAML, ``bash -n``), and run with
the shell, flags and environment that the runner itself uses, against five sizers: a live
``ci-sizer serve`` that answers, one that has never seen the job, one whose database is locked (a
degraded answer), a refused socket (down) and a socket that never answers (hanging). What the recipe
produced goes through the runner's own merge (tests/runner_pods.py: ``kubectl patch --local`` for the
strategic merges, Go's ``encoding/json`` for agent-stack-k8s' ``ParseJob``, models cited from the
source elsewhere), with a runner template that has a CPU limit and one that has none, with a patch of
the user's own and without. Every cell must give a pod the API server accepts (an image on every
container, unique names, valid quantities, no request above its limit); with the sizer down or
hanging it is the pod the runner builds without the sizer, and the log gives curl's status. The
identity each recipe asks for is the one the collector records from the same runner's environment.
The outputs the pages show are the ones produced here.

The cells only read the sizers, so the sizers are shared by the module and the recipes run side by
side in threads: the hanging cells wait their 2 s together.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import tomllib
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import asyncpg
import httpx
import pytest
import yaml
from sqlalchemy.engine import make_url

from .. import runner_pods as rp
from ..helpers import MIB, container, lock_exclusively, run
from ..http_stub import StubServer
from ..live import LiveServer, free_port

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations"
TOKEN = "sizer-secret-token-1234"
BLOCK = re.compile(r"<!-- test: ([\w-]+) -->\n```(\w*)\n(.*?)```", re.S)
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
CONTAINERS = [
    container("build", cpu=1755, mem=1800 * MIB),  # p95 1755m: a CPU request of 2106m (S9, buffer 20)
    container("helper", cpu=55, mem=90 * MIB),
    container("svc-postgres", cpu=240, mem=400 * MIB),
]
REQUEST = 2106  # the build container's CPU request in millicores, which the template limits are placed around
UNKNOWN = {"cpu": 500, "memory": 4 << 30}  # rule S7: a job never seen, and a degraded answer with nothing served
JOBS = {  # the identity each recipe asks for, which test_the_recipe_asks_for_what_the_collector_records checks
    "arc": ("acme", "web", ".github/workflows/ci.yml", "build"),
    "gitlab": ("acme/platform", "web", ".gitlab-ci.yml", "build"),
    "buildkite": ("acme", "web", "pipeline.yml", "build"),
    "jenkins": ("acme", "web", "Jenkinsfile", "build"),
    "tekton": ("acme", "web", "ci.yml", "build"),
    "argo": ("acme", "web", "ci.yml", "build"),
}

# --------------------------------------------------------------------------- what each runner sets
# GitHub Actions: actions/runner src/Runner.Worker/GitHubContext.cs (the github context's keys, as
# GITHUB_*), given to every script, the job-started hook included, by Handlers/ScriptHandler.cs; the
# job container also gets GITHUB_ACTIONS=true and CI=true (runner-container-hooks prepare-job.ts,
# createContainerSpec). A branch name may hold an "@".
GITHUB = {
    "GITHUB_REPOSITORY_OWNER": "acme",
    "GITHUB_REPOSITORY": "acme/web",
    "GITHUB_WORKFLOW_REF": "acme/web/.github/workflows/ci.yml@refs/heads/fix@2",
    "GITHUB_WORKFLOW": "CI",
    "GITHUB_JOB": "build",
    "GITHUB_RUN_ID": "4242",
    "GITHUB_RUN_ATTEMPT": "1",
}
# GitLab: app/models/project.rb predefined_project_variables (CI_PROJECT_NAMESPACE is the namespace's
# full path, CI_PROJECT_NAME the project's path, CI_CONFIG_PATH ci_config_path_or_default: the
# project's, the same in a parent pipeline and its child) and predefined_ci_server_variables
# (GITLAB_CI=true); each job has its own CI_JOB_NAME and CI_JOB_ID.
GITLAB = {
    "GITLAB_CI": "true",
    "CI": "true",
    "CI_PROJECT_NAMESPACE": "acme/platform",  # a nested group
    "CI_PROJECT_NAME": "web",
    "CI_CONFIG_PATH": ".gitlab-ci.yml",
}
GITLAB_SIZE = {**GITLAB, "CI_JOB_NAME": "size", "CI_JOB_ID": "1001"}
GITLAB_BUILD = {**GITLAB, "CI_JOB_NAME": "build", "CI_JOB_ID": "1002"}  # the child pipeline's job
# Buildkite: the job's environment from Buildkite (agent-stack-k8s scheduler.go reads its
# BUILDKITE_PIPELINE_SLUG, BUILDKITE_STEP_KEY and BUILDKITE_PLUGINS), BUILDKITE=true and CI=true from
# the agent; the upload step and the uploaded step are two jobs.
BUILDKITE = {"BUILDKITE": "true", "CI": "true", "BUILDKITE_ORGANIZATION_SLUG": "acme", "BUILDKITE_PIPELINE_SLUG": "web"}
BUILDKITE_UPLOAD = {**BUILDKITE, "BUILDKITE_STEP_KEY": "pipeline", "BUILDKITE_JOB_ID": "0190-aa"}
BUILDKITE_BUILD = {**BUILDKITE, "BUILDKITE_STEP_KEY": "build", "BUILDKITE_LABEL": ":hammer: build"}
BUILDKITE_BUILD |= {"BUILDKITE_JOB_ID": "0190-bb", "BUILDKITE_RETRY_COUNT": "0"}
# Jenkins: hudson/model/Job.getCharacteristicEnvVars (JOB_NAME: the full name, a multibranch job's
# "org folder/repo/branch"), Run.getCharacteristicEnvVars (BUILD_TAG), Run.getEnvironment
# (JENKINS_URL). STAGE_NAME only inside a stage body (pipeline-stage-step StageStepExecution: an
# EnvironmentExpander on the body), and the recipe's steps are not in one.
JENKINS = {
    "JENKINS_URL": "https://jenkins.example/",
    "JOB_NAME": "acme/web/main",
    "JOB_BASE_NAME": "main",
    "BRANCH_NAME": "main",
    "BUILD_NUMBER": "7",
    "BUILD_TAG": "jenkins-acme-web-main-7",
}
# Tekton and Argo put no CI identity in a container's environment (Argo: ARGO_* of the pod,
# workflow/common/common.go; Tekton: what the Task declares): the recipes give it on both sides.
ARGO = {"ARGO_TEMPLATE": "{}", "ARGO_NODE_ID": "build-x-1", "ARGO_POD_NAME": "build-x-build-1"}
TEKTON = {"HOME": "/tekton/home"}


def page(name: str) -> str:
    return (DOCS / name).read_text()


def blocks(text: str) -> dict[str, str]:
    return {m.group(1): m.group(3) for m in BLOCK.finditer(text)}


def run_shell(
    shell: list[str], script: str, cwd: Path, env: dict[str, str], *, check_syntax: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a recipe's shell as its runner does: the script in a file, given to ``shell``."""
    if check_syntax:
        assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0, script
    path = cwd / f"script-{uuid.uuid4().hex[:8]}.sh"
    path.write_text(script)
    full = {"PATH": os.environ["PATH"], "HOME": str(cwd), **env}
    return subprocess.run(
        [*shell, str(path)], cwd=cwd, env=full, capture_output=True, text=True, timeout=60, check=False
    )


# --------------------------------------------------------------------------- the sizers


@dataclass
class Sizers:
    urls: dict[str, str]
    answers: dict[str, dict[str, Any]]  # runner -> the JSON answer of its job


def _locked(server_url: str, database: str) -> tuple[asyncio.AbstractEventLoop, asyncpg.Connection]:
    """From another connection, hold exclusive locks on the tables the sizing reads: its reads block,
    and past the sizing deadline it answers degraded (as tests/test_db_faults.py does)."""
    u = make_url(server_url)
    loop = asyncio.new_event_loop()

    async def take() -> asyncpg.Connection:
        conn = await asyncpg.connect(host=u.host, port=u.port or 5432, user=u.username, database=database)
        await lock_exclusively(conn)
        return conn

    return loop, loop.run_until_complete(take())


@pytest.fixture(scope="module")
def sizers(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Sizers]:
    """The five sizers, started side by side: answering (three runs of each recipe's job), never-seen,
    degraded (PostgreSQL with its tables locked: skipped without PostgreSQL), down and hanging."""
    base = tmp_path_factory.mktemp("sizers")
    answering = LiveServer(f"sqlite:///{base / 'answering.db'}")
    enforcing = LiveServer(f"sqlite:///{base / 'enforcing.db'}", "--cpu-sizing-mode", "enforce")
    empty = LiveServer(f"sqlite:///{base / 'empty.db'}")
    servers = [answering, enforcing, empty]
    degraded: LiveServer | None = None
    pg_server: Any = None
    db_name = f"ci_sizer_recipes_{uuid.uuid4().hex[:12]}"
    try:
        pg_server = request.getfixturevalue("postgres_server")
    except pytest.skip.Exception:
        pg_server = None
    if pg_server is not None:
        asyncio.run(_admin(pg_server.url, f'CREATE DATABASE "{db_name}"'))
        url = make_url(pg_server.url).set(database=db_name).render_as_string(hide_password=False)
        degraded = LiveServer(url)
        servers.append(degraded)
    lock: tuple[asyncio.AbstractEventLoop, asyncpg.Connection] | None = None
    hanging = socket.socket()
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.start(), servers))
        answers = {}
        for name, (org, repo, workflow, job) in JOBS.items():
            ident = {"org": org, "repo": repo, "workflow": workflow, "job": job}
            for n in range(3):
                for server in (answering, enforcing):
                    r = httpx.post(f"{server.url}/api/v1/runs", json=run(n, *CONTAINERS, job=ident), timeout=30)
                    assert r.status_code in (200, 201), r.text
            path = "/".join(quote(s, safe="") for s in (org, repo, workflow, job))
            answers[name] = httpx.get(f"{answering.url}/api/v1/sizing/{path}", timeout=30).json()
            assert answers[name]["meta"]["phase"] == "confident"
            build = next(c for c in answers[name]["containers"] if c["name"] == "build")
            assert build["cpu"]["request_millicores"] == REQUEST
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(64)  # the kernel accepts connections; nobody ever answers them
        urls = {
            "answering": answering.url,
            "enforcing": enforcing.url,  # --cpu-sizing-mode enforce: a CPU limit written too
            "never-seen": empty.url,
            "down": f"http://127.0.0.1:{free_port()}",  # nothing listens: connection refused
            "hanging": f"http://127.0.0.1:{hanging.getsockname()[1]}",
        }
        if degraded is not None:
            assert pg_server is not None
            lock = _locked(pg_server.url, db_name)
            urls["degraded"] = degraded.url
        yield Sizers(urls, answers)
    finally:
        if lock is not None:
            loop, conn = lock
            loop.run_until_complete(conn.close())
            loop.close()
        for s in servers:
            s.stop()
        hanging.close()
        if pg_server is not None:
            asyncio.run(_admin(pg_server.url, f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))


async def _admin(url: str, sql: str) -> None:
    u = make_url(url)
    conn = await asyncpg.connect(host=u.host, port=u.port or 5432, user=u.username, database=u.database)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


# --------------------------------------------------------------------------- one cell


@dataclass(frozen=True)
class Cell:
    runner: str
    sizer: str  # answering, never-seen, degraded, down, hanging
    limit: str | None = None  # the CPU limit the runner's template gives the main container
    own: bool = False  # with a patch of the user's own

    @property
    def id(self) -> str:
        return f"{self.runner}-{self.sizer}-{'limit-' + self.limit if self.limit else 'no-limit'}-{'own' if self.own else 'plain'}"


@dataclass
class Outcome:
    artifact: str  # what the recipe hands the runner
    log: str  # the recipe's output to the job log (stdout and stderr)
    merged: rp.Pod  # the runner's pod with it
    unsized: rp.Pod  # the runner's pod without the sizer (the same template and patch)
    sized: dict[str, str]  # pod container -> the recorded container that sizes it
    extra: dict[str, Any] = field(default_factory=dict)


def kept(pod: rp.Pod, name: str) -> str:
    """The CPU limit the pod's container has without the sizer: what the user tells the recipe."""
    return rp.cpu_limit_of(pod, name) or ""


# ARC ---------------------------------------------------------------------------------------------
ARC_BASE = "/home/runner/pod-templates/job.json"
ARC_SHELL = ["bash", "--noprofile", "--norc", "-e", "-o", "pipefail"]  # actions/runner ScriptHandlerHelpers.cs
ARC_SERVICES = ("postgres:16",)


def arc_base(cell: Cell) -> dict[str, Any] | None:
    """The user's own template: labels, a nodeSelector, an env and a sidecar of theirs (own), and/or a
    CPU limit on $job (limit)."""
    if not cell.own and not cell.limit:
        return None
    job: dict[str, Any] = {"name": "$job"}
    doc: dict[str, Any] = {"spec": {"containers": [job]}}
    if cell.own:
        doc["metadata"] = {"labels": {"team": "web"}}
        doc["spec"]["nodeSelector"] = {"ci": "true"}
        job["env"] = [{"name": "GOFLAGS", "value": "-mod=mod"}]
        doc["spec"]["containers"].append({"name": "logs", "image": "busybox:1.36"})
    if cell.limit:
        job["resources"] = {"limits": {"cpu": cell.limit}}
    return doc


def arc(cell: Cell, url: str, tmp: Path) -> Outcome:
    if not rp.JQ and (cell.own or cell.limit):
        pytest.skip("jq is not installed: ARC's recipe merges a template of the user's own with it (apt install jq)")
    base = arc_base(cell)
    base_path = tmp / "pod-templates" / "job.json"
    base_path.parent.mkdir()
    if base is not None:
        base_path.write_text(json.dumps(base))
    script = blocks(page("github-actions-arc.md"))["recipe"]
    assert ARC_BASE in script
    template = tmp / "sizing" / "template.json"
    template.parent.mkdir()
    env = {"SIZER": url, "SIZER_TOKEN": TOKEN, **GITHUB, "ACTIONS_RUNNER_CONTAINER_HOOK_TEMPLATE": str(template)}
    p = run_shell(ARC_SHELL, script.replace(ARC_BASE, str(base_path)), tmp, env)
    assert p.returncode == 0, p.stderr  # a job-started hook that fails fails the job
    artifact = template.read_text()
    merged = rp.arc_pod(rp.arc_read_template(str(template)), ARC_SERVICES)
    unsized = rp.arc_pod(base, ARC_SERVICES)
    return Outcome(artifact, p.stdout + p.stderr, merged, unsized, {"job": "build", "postgres": "svc-postgres"})


# Argo --------------------------------------------------------------------------------------------
ARGO_OWN = json.dumps(  # the workflow's spec.podSpecPatch of the user's own: an env and a sidecar
    {
        "containers": [
            {"name": "main", "env": [{"name": "GOFLAGS", "value": "-mod=mod"}]},
            {"name": "redis", "image": "redis:7"},
        ]
    }
)


def argo(cell: Cell, url: str, tmp: Path) -> Outcome:
    wf = yaml.safe_load(blocks(page("argo.md"))["recipe"])
    templates = {t["name"]: t for t in wf["spec"]["templates"]}
    assert templates["build"]["podSpecPatch"] == "{{inputs.parameters.patch}}"
    [[_], [build_step]] = templates["main"]["steps"]
    assert build_step["arguments"]["parameters"][0]["value"] == "{{steps.size.outputs.result}}"
    size = templates["size"]["script"]
    assert size["command"] == ["sh"]  # Argo runs the source file with the command
    env = {e["name"]: e["value"] for e in size["env"] if "value" in e}
    resources = {"limits": {"cpu": cell.limit}} if cell.limit else None
    own = [ARGO_OWN] if cell.own else []
    unsized = rp.argo_apply(rp.argo_pod(resources), *own)
    env |= {"SIZER": url, "SIZER_TOKEN": TOKEN, "TEMPLATE_CPU_LIMIT": kept(unsized, "main"), **ARGO}
    p = run_shell(["sh"], size["source"], tmp, env)
    assert p.returncode == 0, p.stderr
    merged = rp.argo_apply(rp.argo_pod(resources), *own, p.stdout)  # the workflow's patch, then the template's
    return Outcome(p.stdout, p.stdout + p.stderr, merged, unsized, {"main": "build"})


# Buildkite ---------------------------------------------------------------------------------------
HEREDOC = re.compile(r"cat <<'YAML'\n(.*?)\nYAML\n", re.S)


def buildkite(cell: Cell, url: str, tmp: Path) -> Outcome:
    if rp.GO is None:
        pytest.skip("go is not installed: agent-stack-k8s' ParseJob loop runs in Go (apt install golang-go)")
    script = blocks(page("buildkite.md"))["recipe-own" if cell.own else "recipe"]
    controller = {"containers": [{"name": "container-0", "resources": {"limits": {"cpu": cell.limit}}}]}
    pod = rp.buildkite_pod(controller if cell.limit else None)  # the controller's pod-spec-patch, applied first
    if cell.own:  # the step as the user wrote it, without the sizing
        [step] = yaml.safe_load(HEREDOC.findall(script)[0])["steps"]
        unsized = rp.buildkite_apply(pod, rp.buildkite_parse_job(rp.buildkite_plugins(step)))
    else:
        unsized = pod
    env = {"SIZER": url, "SIZER_TOKEN": TOKEN, **BUILDKITE_UPLOAD, "TEMPLATE_CPU_LIMIT": kept(unsized, "container-0")}
    p = run_shell(["sh"], script, tmp, env)
    assert p.returncode == 0, p.stderr
    assert TOKEN not in p.stdout  # the uploaded pipeline carries no secret
    assert "$" not in p.stdout  # nor anything Buildkite would interpolate at upload time
    [step] = yaml.safe_load(p.stdout)["steps"]
    plugins = rp.buildkite_plugins(step)
    merged = rp.buildkite_apply(pod, rp.buildkite_parse_job(plugins))
    return Outcome(p.stdout, p.stdout + p.stderr, merged, unsized, {"container-0": "build"}, {"plugins": plugins})


# Jenkins -----------------------------------------------------------------------------------------
JENKINS_OWN = """apiVersion: v1
kind: Pod
spec:
  nodeSelector: {ci: "true"}
  containers:
  - name: redis
    image: redis:7
  - name: build
    env: [{name: GOFLAGS, value: -mod=mod}]
"""


def jenkins(cell: Cell, url: str, tmp: Path) -> Outcome:
    groovy = blocks(page("jenkins.md"))["recipe"]
    assert "def cpuLimit = ''" in groovy
    if cell.limit:  # as the user sets it: one value for the containerTemplate and the sizer
        groovy = groovy.replace("def cpuLimit = ''", f"def cpuLimit = '{cell.limit}'")
    first_node = groovy.index("node {")
    assert "sh(" not in groovy[:first_node]
    assert groovy.index("sh(") > first_node
    [script] = re.findall(r"script: '''(.*?)'''", groovy, re.S)
    [cpu_limit] = re.findall(r"def cpuLimit = '([^']*)'", groovy)
    assert 'withEnv(["TEMPLATE_CPU_LIMIT=${cpuLimit}"])' in groovy
    templates = [
        rp.jenkins_template(name, image, resourceLimitCpu=cpu_limit if "resourceLimitCpu: cpuLimit" in rest else "")
        for name, image, rest in re.findall(r"containerTemplate\(name: '([^']+)', image: '([^']+)'([^)]*)\)", groovy)
    ]
    assert templates
    own = [JENKINS_OWN] if cell.own else []
    unsized = rp.jenkins_apply(templates, own)
    env = {"SIZER": url, "SIZER_TOKEN": TOKEN, "TEMPLATE_CPU_LIMIT": cpu_limit, **JENKINS}
    p = run_shell(["sh", "-xe"], script, tmp, env)  # durable-task BourneShellScript: '<shell>' -xe
    assert p.returncode == 0, p.stderr
    merged = rp.jenkins_apply(templates, [*own, p.stdout])  # the outer podTemplate's yaml, then the sizing's
    return Outcome(p.stdout, p.stdout + p.stderr, merged, unsized, {"build": "build"})


# Tekton ------------------------------------------------------------------------------------------


def tekton(cell: Cell, url: str, tmp: Path) -> Outcome:
    script = blocks(page("tekton.md"))["recipe-own" if cell.own else "recipe"]
    step: dict[str, Any] = {"name": "build", "image": "golang:1.23"}
    if cell.limit:
        step["computeResources"] = {"limits": {"cpu": cell.limit}}
    task = {"steps": [step], "sidecars": [{"name": "postgres", "image": "postgres:16"}]}
    mine = yaml.safe_load(HEREDOC.findall(script)[0])["spec"]  # the TaskRun as the user writes it
    unsized = rp.tekton_apply(task, mine, v1=True)
    limit = kept(unsized, "step-build")
    env = {"SIZER": url, "SIZER_TOKEN": TOKEN, "TEMPLATE_CPU_LIMIT": f"step-build={limit}" if limit else "", **TEKTON}
    p = run_shell(["sh"], script, tmp, env)
    assert p.returncode == 0, p.stderr
    artifact = (tmp / "taskrun.yaml").read_text()
    taskrun = yaml.safe_load(artifact)
    assert taskrun["apiVersion"] == "tekton.dev/v1"
    assert taskrun["kind"] == "TaskRun"
    merged = rp.tekton_apply(task, taskrun["spec"], v1=True)
    return Outcome(
        artifact, p.stdout + p.stderr, merged, unsized, {"step-build": "build", "sidecar-postgres": "svc-postgres"}
    )


# GitLab ------------------------------------------------------------------------------------------


def gitlab(cell: Cell, url: str, tmp: Path) -> Outcome:
    b = blocks(page("gitlab.md"))
    config = dict(tomllib.loads(b["config"])["runners"][0]["kubernetes"])
    ci = yaml.safe_load(b["recipe"])
    assert config["cpu_limit"] == ci["size"]["variables"]["TEMPLATE_CPU_LIMIT"]  # the page's own pairing
    if cell.limit:
        config["cpu_limit"] = cell.limit
    else:
        del config["cpu_limit"]
    job_variables = {"KUBERNETES_CPU_LIMIT": "3"} if cell.own else {}  # the build job's own, which win
    items = ci["size"]["script"]
    assert all(isinstance(item, str) for item in items), items  # GitLab: script items are strings
    assert ci["build"]["trigger"]["include"][0] == {"artifact": "sizing.yml", "job": "size"}
    assert "sizing.yml" in ci["size"]["artifacts"]["paths"]
    unsized = rp.gitlab_apply({}, config, job_variables=job_variables)
    env = {**ci["size"]["variables"], "TEMPLATE_CPU_LIMIT": kept(unsized, "build")}
    env |= {"SIZER": url, "SIZER_TOKEN": TOKEN, **GITLAB_SIZE}
    p = run_shell(["sh", "-e"], "\n".join(items), tmp, env)  # the job's script, each line under errexit
    assert p.returncode == 0, p.stdout + p.stderr
    artifact = (tmp / "sizing.yml").read_text()
    variables = yaml.safe_load(artifact)["variables"]
    merged = rp.gitlab_apply(variables, config, job_variables=job_variables)
    return Outcome(artifact, p.stdout + p.stderr, merged, unsized, {"build": "build"})


RUNNERS: dict[str, tuple[str, Callable[[Cell, str, Path], Outcome]]] = {
    "arc": ("github-actions-arc.md", arc),
    "gitlab": ("gitlab.md", gitlab),
    "buildkite": ("buildkite.md", buildkite),
    "jenkins": ("jenkins.md", jenkins),
    "tekton": ("tekton.md", tekton),
    "argo": ("argo.md", argo),
}
YAML_MARKED = {"gitlab", "buildkite", "jenkins", "tekton"}  # a degraded answer's first-line comment reaches them
SIZER_STATES = ["answering", "never-seen", "degraded", "down", "hanging"]
MATRIX = [
    Cell(runner, sizer, limit, own)
    for runner in RUNNERS
    for sizer in SIZER_STATES
    for limit in (None, "1")  # "1": below the build container's request of 2106m, the case that was rejected
    for own in (False, True)
]
LIMITS = {"below": "1", "equal": "2106m", "above": "4"}
AROUND = [Cell(runner, "answering", value) for runner in RUNNERS for value in LIMITS.values()]
ENFORCED = [Cell(runner, "enforcing", limit) for runner in RUNNERS for limit in (None, "1")]


def outcome_of(cell: Cell, sizers: Sizers, tmp: Path) -> Outcome | BaseException:
    """The cell's outcome, or what it raised (handed to the cell's own test, which raises it). A sizer
    that should answer but let the recipe's curl time out (exit 28 after 2 s: a machine too busy to
    serve a cached answer in time) did not give the cell its premise, so the cell runs again, twice at
    most; its assertions are unchanged."""
    if cell.sizer not in sizers.urls:
        return pytest.skip.Exception("no PostgreSQL: the degraded sizer is a PostgreSQL one with its tables locked")
    found: Outcome | BaseException = AssertionError("not run")
    for attempt in range(3):
        (tmp / str(attempt)).mkdir()
        try:
            found = RUNNERS[cell.runner][1](cell, sizers.urls[cell.sizer], tmp / str(attempt))
        except BaseException as exc:
            return exc
        if cell.sizer in ("down", "hanging") or "curl exit 28)" not in found.log:
            break
    return found


@pytest.fixture(scope="module")
def outcomes(sizers: Sizers, tmp_path_factory: pytest.TempPathFactory) -> dict[Cell, Outcome | BaseException]:
    cells = list(dict.fromkeys(MATRIX + AROUND + ENFORCED))
    dirs = {cell: tmp_path_factory.mktemp(cell.id) for cell in cells}
    with ThreadPoolExecutor(6) as pool:
        results = pool.map(lambda cell: outcome_of(cell, sizers, dirs[cell]), cells)
        return dict(zip(cells, results, strict=True))


def get(outcomes: dict[Cell, Outcome | BaseException], cell: Cell) -> Outcome:
    found = outcomes[cell]
    if isinstance(found, BaseException):
        raise found
    return found


def resources_of(pod: rp.Pod, name: str) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == name).get("resources") or {}


def millicores(q: str) -> int:
    return int(rp.parse_quantity(q) * 1000)


# --------------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("cell", MATRIX, ids=lambda c: c.id)
def test_every_cell_gives_a_pod_the_api_server_accepts(
    cell: Cell, outcomes: dict[Cell, Outcome | BaseException], sizers: Sizers
) -> None:
    out = get(outcomes, cell)
    rp.check_pod(out.unsized)  # the runner's pod without the sizer, with the same template and patch
    rp.check_pod(out.merged)  # an image on every container, unique names, valid quantities, requests <= limits
    names = [c["name"] for c in out.merged["containers"]]
    assert names == [c["name"] for c in out.unsized["containers"]]  # nothing added, nothing lost
    assert "*" not in out.artifact
    if cell.sizer in ("down", "hanging"):
        assert out.merged == out.unsized  # a no-op: the pod the runner builds without the sizer
        status = 7 if cell.sizer == "down" else 28  # curl: refused at once, or nothing within --max-time 2
        assert f"curl exit {status})" in out.log, out.log
        return
    main = next(pod for pod, recorded in out.sized.items() if recorded == "build")
    res = resources_of(out.merged, main)
    limit = rp.cpu_limit_of(out.unsized, main)
    if cell.sizer == "answering":
        answer = {c["name"]: c for c in sizers.answers[cell.runner]["containers"]}
        for pod, recorded in out.sized.items():
            got = resources_of(out.merged, pod)
            keep = rp.cpu_limit_of(out.unsized, pod)
            want = answer[recorded]["cpu"]["request_millicores"]
            assert millicores(got["requests"]["cpu"]) == min(want, millicores(keep) if keep else want)
            assert rp.parse_quantity(got["requests"]["memory"]) == answer[recorded]["memory"]["request_bytes"]
    else:  # never seen, or degraded with nothing served: the main container at the unknown-phase defaults
        assert millicores(res["requests"]["cpu"]) == min(UNKNOWN["cpu"], millicores(limit) if limit else UNKNOWN["cpu"])
        assert rp.parse_quantity(res["requests"]["memory"]) == UNKNOWN["memory"]
        if cell.sizer == "degraded" and cell.runner in YAML_MARKED:
            assert "# ci-sizer: degraded answer" in out.artifact  # the answer says so, where the format can
    if limit:
        assert rp.cpu_limit_of(out.merged, main) == limit  # observe mode: the template's limit stays


@pytest.mark.parametrize("cell", AROUND, ids=lambda c: c.id)
def test_a_cpu_limit_in_the_template_below_equal_or_above_the_request(
    cell: Cell, outcomes: dict[Cell, Outcome | BaseException]
) -> None:
    # issue 32, 1: Argo's main with limits.cpu "1" and a request of 2106m was a pod the API server rejects
    out = get(outcomes, cell)
    rp.check_pod(out.merged)
    main = next(pod for pod, recorded in out.sized.items() if recorded == "build")
    res = resources_of(out.merged, main)
    assert cell.limit is not None
    assert millicores(res["requests"]["cpu"]) == min(REQUEST, millicores(cell.limit))
    assert rp.cpu_limit_of(out.merged, main) == cell.limit


@pytest.mark.parametrize("cell", ENFORCED, ids=lambda c: c.id)
def test_enforce_mode_whichever_cpu_limit_the_runner_keeps(
    cell: Cell, outcomes: dict[Cell, Outcome | BaseException], sizers: Sizers
) -> None:
    # the answer writes its CPU limit (2500m) as well: Argo, Buildkite, Tekton, ARC and GitLab (its page's
    # config.toml allows the overwrite) replace the template's with it, Jenkins' containerTemplate keeps
    # its own (as GitLab's config.toml would without cpu_limit_overwrite_max_allowed): the request is
    # within either
    out = get(outcomes, cell)
    rp.check_pod(out.merged)
    main = next(pod for pod, recorded in out.sized.items() if recorded == "build")
    res = resources_of(out.merged, main)
    build = next(c for c in sizers.answers[cell.runner]["containers"] if c["name"] == "build")
    assert build["cpu"]["enforced"] is False  # the observe-mode answer; this sizer enforces
    kept_by_runner = cell.limit is not None and cell.runner == "jenkins"
    assert rp.cpu_limit_of(out.merged, main) == (cell.limit if kept_by_runner else "2500m")
    assert millicores(res["requests"]["cpu"]) == min(REQUEST, millicores(cell.limit) if cell.limit else REQUEST)


def test_the_pages_show_what_the_recipes_produce(outcomes: dict[Cell, Outcome | BaseException]) -> None:
    for runner, (doc, _) in RUNNERS.items():
        shown = blocks(page(doc))
        for sizer, tag in (("answering", "answering"), ("down", "down"), ("hanging", "down")):
            out = get(outcomes, Cell(runner, sizer))
            assert out.artifact == shown[tag], f"{doc} shows another {sizer} output; it is:\n{out.artifact}"


# --------------------------------------------------------------------------- the identity (issue 32, 2)


def recorder() -> StubServer:
    """An HTTP server that records what it is sent: 404 for a GET (the recipe falls back), 201 for a POST."""
    return StubServer(lambda method, path, body: (404, {}) if method == "GET" else (201, {}))


def collect_command(runner: str) -> tuple[list[str], dict[str, str]]:
    """The page's ``ci-sizer collect`` command line (what runs in the build) and the build's environment."""
    text = " ".join(page(RUNNERS[runner][0]).split())
    if runner == "argo":
        wf = yaml.safe_load(blocks(page("argo.md"))["recipe"])
        build = next(t for t in wf["spec"]["templates"] if t["name"] == "build")
        argv = [a.replace("{{workflow.uid}}", "0b6e7c5e-argo") for a in build["container"]["command"]]
        return argv, ARGO
    found = re.findall(r"ci-sizer collect [^`'\n]*?-- (?:make build|mvn -B verify)", text)
    assert found, runner
    argv = shlex.split(found[-1].replace('"$(context.taskRun.uid)"', "0b6e7c5e-tekton"))
    env = {
        "arc": {**GITHUB, "GITHUB_ACTIONS": "true", "CI": "true"},
        "gitlab": GITLAB_BUILD,
        "buildkite": BUILDKITE_BUILD,
        "jenkins": JENKINS,
        "tekton": TEKTON,
    }[runner]
    return argv, env


def recorded_identity(runner: str, tmp: Path, server: StubServer) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(what the recipe's GET asks for, what the collector posts), both against ``server``."""
    RUNNERS[runner][1](Cell(runner, "answering"), server.url, tmp / "recipe")
    argv, env = collect_command(runner)
    assert argv[:2] == ["ci-sizer", "collect"], argv
    command = [*argv[2 : argv.index("--")], "--interval", "0.2", "--", "sh", "-c", "sleep 0.7"]
    full = {"PATH": os.environ["PATH"], "HOME": str(tmp), "CI_SIZER_URL": server.url, **env}
    p = subprocess.run(
        [sys.executable, "-m", "service", "collect", *command], env=full, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    gets = [path for method, path, _ in server.requests if method == "GET"]
    posts = [json.loads(body) for method, _, body in server.requests if method == "POST"]
    assert len(gets) == 1, server.requests
    assert len(posts) == 1, (server.requests, p.stderr)
    segments = urlsplit(gets[0]).path.removeprefix("/api/v1/sizing/").split("/")
    asked = tuple(unquote(s) for s in segments)
    recorded = tuple(posts[0][k] for k in ("org", "repo", "workflow", "job"))
    return asked, recorded


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_the_recipe_asks_for_what_the_collector_records(runner: str, tmp_path: Path) -> None:
    # the Jenkins recipe asked for acme/web/Jenkinsfile/build while the collector, outside any stage,
    # recorded acme/web/Jenkinsfile/main: the job never learned
    if runner == "buildkite" and rp.GO is None:
        pytest.skip("go is not installed: agent-stack-k8s' ParseJob loop runs in Go (apt install golang-go)")
    (tmp_path / "recipe").mkdir()
    server = recorder()
    try:
        asked, recorded = recorded_identity(runner, tmp_path, server)
    finally:
        server.close()
    assert asked == recorded
    assert asked == JOBS[runner]  # the identity the answering sizer holds runs for


# --------------------------------------------------------------------------- Buildkite (issue 32, 3 and 5)

needs_go = pytest.mark.skipif(
    rp.GO is None, reason="go is not installed: agent-stack-k8s' ParseJob loop runs in Go (apt install golang-go)"
)


@needs_go
def test_a_second_kubernetes_entry_overwrites_the_first_as_parsejob_decodes_it() -> None:
    # what the page used to advise, through the real decode: the sizing as an entry of its own
    own = {"podSpecPatch": {"containers": [{"name": "container-0", "env": [{"name": "A", "value": "1"}]},
                                           {"name": "redis", "image": "redis:7"}]}}  # fmt: skip
    sizing = {"podSpecPatch": {"containers": [{"name": "container-0", "resources": {"requests": {"cpu": "2106m"}}}]}}
    plugin = rp.buildkite_parse_job(rp.buildkite_plugins({"plugins": [{"kubernetes": own}, {"kubernetes": sizing}]}))
    assert plugin is not None
    assert [c["name"] for c in plugin["podSpecPatch"]["containers"]] == ["container-0"]  # redis is gone
    dind = {"podSpecPatch": {"containers": [{"name": "dind", "image": "docker:27-dind"}]}}
    plugin = rp.buildkite_parse_job(rp.buildkite_plugins({"plugins": [{"kubernetes": dind}, {"kubernetes": sizing}]}))
    assert plugin is not None
    [merged] = plugin["podSpecPatch"]["containers"]
    assert (merged["name"], merged["image"]) == ("container-0", "docker:27-dind")  # filled into the old element


@needs_go
@pytest.mark.parametrize("sizer", SIZER_STATES)
def test_buildkite_keeps_your_own_containers_in_the_one_entry(
    sizer: str, outcomes: dict[Cell, Outcome | BaseException]
) -> None:
    out = get(outcomes, Cell("buildkite", sizer, None, own=True))
    plugins = json.loads(out.extra["plugins"])
    assert [list(p) for p in plugins] == [[rp.K8S_PLUGIN]]  # one kubernetes entry
    containers = {c["name"]: c for c in out.merged["containers"]}
    assert containers["redis"]["image"] == "redis:7"  # the user's sidecar is there
    assert containers["container-0"]["image"] == "buildkite/agent:3"  # and the command container is itself
    assert {"name": "GOFLAGS", "value": "-mod=mod"} in containers["container-0"]["env"]
    if sizer not in ("down", "hanging"):
        assert "requests" in containers["container-0"]["resources"]


@needs_go
@pytest.mark.parametrize("sizer", ["down", "hanging"])
def test_buildkite_fallback_runs_on_a_controller_that_prohibits_the_plugin(
    sizer: str, outcomes: dict[Cell, Outcome | BaseException]
) -> None:
    # prohibit-kubernetes-plugin fails a step with any kubernetes entry, an empty one included
    out = get(outcomes, Cell("buildkite", sizer))
    assert rp.buildkite_parse_job(out.extra["plugins"], prohibit=True) is None
    with pytest.raises(rp.Rejected, match="prohibited"):
        rp.buildkite_parse_job(rp.buildkite_plugins({"plugins": [{"kubernetes": {}}]}), prohibit=True)


# --------------------------------------------------------------------------- ARC (issue 32, 4)


def arc_hook(
    tmp: Path, sizer: str, template_env: str | None, *, as_runner: bool = False
) -> subprocess.CompletedProcess[str]:
    script = tmp / "job-started.sh"
    script.write_text(blocks(page("github-actions-arc.md"))["recipe"].replace(ARC_BASE, str(tmp / "none.json")))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "SIZER": sizer, "SIZER_TOKEN": TOKEN, **GITHUB}
    if template_env is not None:
        env["ACTIONS_RUNNER_CONTAINER_HOOK_TEMPLATE"] = template_env
    # as the runner user of ARC's image (actions/runner images/Dockerfile: uid 1001), for whom a folder
    # it cannot write is one (the tests run as root, who writes anywhere)
    prefix = ["setpriv", "--reuid=1001", "--regid=1001", "--clear-groups"] if as_runner else []
    return subprocess.run(
        [*prefix, *ARC_SHELL, str(script)], cwd=tmp, env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def runner_dir() -> Iterator[Path]:
    """A folder the runner user (uid 1001) can read: pytest's own are root's alone."""
    path = Path(tempfile.mkdtemp(prefix="ci-sizer-arc-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("case", ["unset", "read-only folder", "missing folder"])
def test_the_arc_hook_never_fails_the_job_while_the_sizer_is_down(case: str, runner_dir: Path) -> None:
    # issue 32, 4: the hook exited 1, and the runner failed the job (actions/runner JobExtension.cs: the
    # job-started hook is a pre-job step, and "Initialize containers" runs only on success())
    down = f"http://127.0.0.1:{free_port()}"
    if case == "unset":
        p = arc_hook(runner_dir, down, None)
        assert "not set" in p.stderr
    elif case == "read-only folder":  # a ConfigMap mounted where the template goes
        folder = runner_dir / "templates"
        folder.mkdir(mode=0o555)
        p = arc_hook(runner_dir, down, str(folder / "template.json"), as_runner=os.geteuid() == 0)
        assert "cannot write" in p.stderr
        assert not (folder / "template.json").exists()
    else:
        p = arc_hook(runner_dir, down, str(runner_dir / "nowhere" / "template.json"))
        assert "cannot write" in p.stderr
    assert p.returncode == 0, p.stderr  # a job-started hook's exit status is the job's fate
    if case != "unset":
        assert "curl exit 7)" in p.stderr


def test_two_services_of_one_image_share_a_name_in_the_released_hooks() -> None:
    # issue 32, 4: the "-0"/"-1" suffixes exist only on runner-container-hooks' main after v0.8.1
    for version in ("v0.7.0", "v0.8.1"):
        pod = rp.arc_pod({}, ("postgres:16", "postgres:15"), version)
        assert [c["name"] for c in pod["containers"]] == ["job", "postgres", "postgres"]
        with pytest.raises(rp.Rejected, match="Duplicate value"):
            rp.check_pod(pod)
    pod = rp.arc_pod({}, ("postgres:16", "postgres:15"), "main")
    assert [c["name"] for c in pod["containers"]] == ["job", "postgres-0", "postgres-1"]
    text = page("github-actions-arc.md") + page("README.md")
    assert "`-0`, `-1` when two share a name" not in text  # what the pages used to promise
    assert "v0.7.0" in page("github-actions-arc.md")
    assert "v0.8.1" in page("github-actions-arc.md")


# --------------------------------------------------------------------------- the pages themselves


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
    assert {doc for doc, _ in RUNNERS.values()} == {p.name for p in DOCS.glob("*.md")} - {
        "README.md",
        "growth.md",
        "webhook.md",
    }
    for doc, _ in RUNNERS.values():
        assert {"recipe", "answering", "down"} <= set(blocks(page(doc))), doc
