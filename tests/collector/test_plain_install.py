"""``ci-sizer collect`` as the README installs it: ``pip install .`` with no extras, in a venv of its own,
wrapping a real process and posting to a live sizer.

The wheel is built once per session from a copy of the checkout's sources; the venv gets the runtime
dependencies only. CI runs it with the rest of the suite (deselect with ``-m "not plain_install"``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ..live import LiveServer

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def run(*cmd: str | Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="session")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding a wheel of the checkout, installed without extras."""
    work = tmp_path_factory.mktemp("plain-install")
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "service", src / "service", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", work / "dist", src)
    venv = work / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", *sorted((work / "dist").glob("ci_sizer-*.whl")))
    return venv


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


@pytest.mark.plain_install
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
