"""Runner ceilings: answers clamped to per-org maxima and flagged (GitLab fails a job whose
overwrite variables exceed its runner's ``*_overwrite_max_allowed``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes.utils import parse_quantity

from ..helpers import GIB, JOB, MIB, container, post_runs, run, sizing, sizing_path

CEILINGS = """
[[ceilings]]
org = "acme"
cpu_limit = "1"
memory_limit = "2Gi"

[[ceilings]]
org = "*"
memory_request = "1Gi"
cpu_request = "2"
"""


def ceilings_file(tmp_path: Path) -> Path:
    path = tmp_path / "ceilings.toml"
    path.write_text(CEILINGS)
    return path


BIG = container("build", cpu=3000, mem=3 * GIB)
SMALL = container("helper", cpu=100, mem=100 * MIB)


async def test_answers_are_clamped_and_flagged(make_client: Any, tmp_path: Path) -> None:
    async with make_client(runner_ceilings_file=ceilings_file(tmp_path), cpu_sizing_mode="enforce") as client:
        await post_runs(client, *(run(n, BIG, SMALL) for n in range(3)))
        answer = await sizing(client)
        build, helper = answer["containers"]
        assert build["memory"]["limit"] == "2Gi"
        assert build["memory"]["limit_bytes"] == 2 * GIB
        assert build["memory"]["request_bytes"] == GIB  # "*" fills the gap acme leaves
        assert build["cpu"]["limit_millicores"] == 1000
        assert build["cpu"]["request_millicores"] <= build["cpu"]["limit_millicores"]  # never above its limit
        assert build["runner_ceiling"]["capped"] is True
        assert set(build["runner_ceiling"]["fields"]) >= {"memory.limit", "memory.request", "cpu.limit"}
        assert helper["runner_ceiling"] == {"capped": False, "fields": []}
        assert helper["memory"]["limit_bytes"] < 2 * GIB  # below the ceiling: untouched
        # and the GitLab variables stay within the runner's maxima
        variables = yaml.safe_load((await client.get(sizing_path(), params={"format": "gitlab"})).text)["variables"]
        assert parse_quantity(variables["KUBERNETES_MEMORY_LIMIT"]) <= 2 * GIB
        assert parse_quantity(variables["KUBERNETES_CPU_LIMIT"]) <= 1


async def test_other_orgs_get_the_default_and_pins_are_clamped_too(make_client: Any, tmp_path: Path) -> None:
    other = {**JOB, "org": "globex"}
    async with make_client(runner_ceilings_file=ceilings_file(tmp_path)) as client:
        await post_runs(client, *(run(n, BIG, job=other) for n in range(3)))
        r = await client.put("/api/v1/sizing/overrides/globex", json={"cpu_request": "8", "memory_limit": "64Gi"})
        assert r.status_code == 201, r.text
        build = (await sizing(client, other))["containers"][0]
        assert build["cpu"]["request_millicores"] == 2000  # the pin, lowered to the "*" ceiling
        assert build["memory"]["limit"] == "64Gi"  # no limit ceiling for globex
        assert build["memory"]["request_bytes"] == GIB
        assert build["runner_ceiling"]["capped"] is True


async def test_without_ceilings_nothing_changes(make_client: Any) -> None:
    async with make_client() as client:
        await post_runs(client, run(1, BIG))
        assert "runner_ceiling" not in (await sizing(client))["containers"][0]


def test_a_bad_ceilings_file_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "ceilings.toml"
    bad.write_text('[[ceilings]]\norg = "acme"\nmemory_limit = "lots"\n')
    done = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--database-url", f"sqlite:///{tmp_path / 'x.db'}",
         "--runner-ceilings-file", str(bad)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "ceilings file" in done.stderr
    assert "memory_limit" in done.stderr
    assert "Traceback" not in done.stderr
