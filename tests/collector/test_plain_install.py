"""``ci-sizer collect`` as the README installs it: ``pip install .`` with no extras, in a venv of its own,
wrapping a real process and posting to a live sizer.

The wheel is built once per test run (the xdist workers share it) from a copy of the checkout's sources;
the venv gets the runtime dependencies only. The two tests that use it are in the CI tier (``pytest -m ci``; the README names it).
The import checks below are fast and always run: the collect command, and every module of
``service.collector``, load the standard library and the package only."""

from __future__ import annotations

import fcntl
import json
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import service.collector

from ..live import LiveServer
from .helpers import IDENTITY

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def run(*cmd: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="session")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding a wheel of the checkout, installed without extras: built once per test run, by
    the first xdist worker to need it (the others wait on a lock in the run's shared temporary folder)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # each worker's basetemp is a folder of the run's
    work = shared / "plain-install"
    with (shared / "plain-install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        venv = work / "venv"
        if not (work / "ready").exists():
            shutil.rmtree(work, ignore_errors=True)
            _build_plain_venv(work, venv)
            (work / "ready").touch()
    return venv


def _build_plain_venv(work: Path, venv: Path) -> None:
    src = work / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "service", src / "service", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    # the compiled core unoptimised and without debug information (CFLAGS comes after Python's own -O3 -g):
    # half the compile's time, the longest part of this fixture; the collector never imports the core, and
    # the wheel is otherwise the one pip builds for a user
    run(
        sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", work / "dist", src,
        env={**os.environ, "CFLAGS": f"{os.environ.get('CFLAGS', '')} -O0 -g0".strip()},
    )  # fmt: skip
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", *sorted((work / "dist").glob("ci_sizer-*.whl")))


# Allocates and touches 64 MiB, burns CPU for a second, reports its own resident set at the end.
BUILD = r"""
import sys, time
blob = bytearray(64 * 2**20)
for i in range(0, len(blob), 4096):
    blob[i] = 1
end = time.time() + 1.0
while time.time() < end:
    pass
rss = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmRSS:"))
open(sys.argv[1], "w").write(str(rss))
sys.exit(5)
"""


@pytest.mark.ci
def test_collect_from_a_plain_install_posts_a_real_build(plain_venv: Path, tmp_path: Path) -> None:
    python = plain_venv / "bin" / "python"
    # the venv is what `pip install .` gives: no test extras for the collector to lean on
    extras = run(python, "-c", "import importlib.util as u; print([m for m in ('httpx', 'pytest') if u.find_spec(m)])")
    assert json.loads(extras.stdout.replace("'", '"')) == []
    script, report = tmp_path / "build.py", tmp_path / "rss"
    script.write_text(BUILD)
    # nothing of the checkout or of the test venv on the path; no CI variables to pick identity from
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "CI_SIZER_"))}
    with LiveServer(f"sqlite:///{tmp_path / 'sizer.db'}") as server:
        done = subprocess.run(
            [plain_venv / "bin" / "ci-sizer", "collect", "--url", server.url, "--org", "acme", "--repo", "web",
             "--workflow", "ci.yml", "--job", "build", "--run-id", "plain-1", "--interval", "0.2",
             "--", python, script, report],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
        )  # fmt: skip
        assert done.returncode == 5, done.stderr  # the build's exit code
        assert "Traceback" not in done.stderr
        assert "posted run plain-1" in done.stderr
        answer = httpx.get(server.url + "/api/v1/sizing/acme/web/ci.yml/build").json()
    assert answer["meta"]["clean_samples"] == 1
    observed = answer["containers"][0]["observed"]
    assert observed["memory_bytes"] == pytest.approx(int(report.read_text()), rel=0.15)
    assert observed["memory_bytes"] > 64 * MIB


# --------------------------------------------------------------------------- the plain install's imports


def _top_modules(code: str) -> set[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code + "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_collect_imports_only_the_standard_library(tmp_path: Path) -> None:
    # `pip install .` has no test extras (httpx) and a build image may trim the rest: the collect
    # command, CLI entry point included, imports the standard library and the package only
    baseline = _top_modules("")
    spool = str(tmp_path / "spool")
    loaded = _top_modules(
        "import sys\nfrom service.cli import main\n"
        f"assert main(['collect', *{list(IDENTITY)!r}, '--spool-dir', {spool!r}, '--interval', '0.1', "
        "'--', sys.executable, '-c', 'import time; time.sleep(0.3)']) == 0"
    )
    foreign = loaded - baseline - set(sys.stdlib_module_names) - {"service"}
    assert not foreign, f"collect imports {sorted(foreign)}"
    assert list((tmp_path / "spool").glob("run-*.json")), "the command was measured and its run spooled"


def test_every_collector_module_imports_only_the_standard_library() -> None:
    # the package's modules one by one, so that a module the collect path above does not reach yet is
    # held to the same rule
    names = [m.name for m in pkgutil.iter_modules(service.collector.__path__, "service.collector.")]
    assert {"service.collector.sources", "service.collector.command"} <= set(names)
    loaded = _top_modules("import importlib\n" + "".join(f"importlib.import_module({n!r})\n" for n in names))
    foreign = loaded - _top_modules("") - set(sys.stdlib_module_names) - {"service"}
    assert not foreign, f"service.collector imports {sorted(foreign)}"


@pytest.mark.ci
def test_grow_without_the_kubernetes_extra_says_so_and_the_build_runs(plain_venv: Path, tmp_path: Path) -> None:
    # `pip install .` has no `grow` extra: in a pod, --grow says so in one line and the build runs (and
    # is measured and spooled) as it would have without it
    python = plain_venv / "bin" / "python"
    script, report = tmp_path / "build.py", tmp_path / "rss"
    script.write_text(BUILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "CI_SIZER_"))}
    env["CI_SIZER_POD_NAME"] = "runner-abc"  # the downward API's pod name: growth picks Kubernetes
    spool = tmp_path / "spool"
    done = subprocess.run(
        [plain_venv / "bin" / "ci-sizer", "collect", *IDENTITY, "--run-id", "plain-grow", "--interval", "0.2",
         "--spool-dir", spool, "--grow", "--", python, script, report],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert "Traceback" not in done.stderr
    growth = [line for line in done.stderr.splitlines() if "growth" in line]
    assert growth == [
        "ci-sizer: growth is off: the Kubernetes client is not installed (pip install 'ci-sizer[grow]'); "
        "the build runs without growth"
    ]
    (spooled,) = spool.glob("run-*.json")
    container = json.loads(spooled.read_text())["containers"][0]
    assert "growths" not in container
    assert container["memory_peak_bytes"] > 64 * MIB


def test_the_growth_package_imports_only_the_standard_library() -> None:
    # the guard runs in the collector: its modules load the standard library and the package only (the
    # Kubernetes client is imported inside its actuator, when that actuator is used)
    import service.growth

    names = [m.name for m in pkgutil.iter_modules(service.growth.__path__, "service.growth.")]
    assert {"service.growth.guard", "service.growth.kube", "service.growth.local"} <= set(names)
    loaded = _top_modules("import importlib\n" + "".join(f"importlib.import_module({n!r})\n" for n in names))
    foreign = loaded - _top_modules("") - set(sys.stdlib_module_names) - {"service"}
    assert not foreign, f"service.growth imports {sorted(foreign)}"
