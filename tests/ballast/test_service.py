"""The ballast formulas: bursts and replicas (SA2), the pod size, the zero hours, and the Helm
values checked against the cf-runtime chart's template."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from service.ballast import service as ballast

from ..helpers import MIB


def test_bursts_group_starts_within_the_delay() -> None:
    # delay 120: [0, 30, 119] | [120, 200] | [500] | [700, 701, 702]
    starts = [0, 30, 119, 120, 200, 500, 700, 701, 702]
    assert ballast.bursts(starts, 120) == [3, 2, 1, 3]
    # the most common size is 3 (twice); it covers every burst
    assert ballast.replicas([3, 2, 1, 3]) == (3, 1.0)
    # SA2: the smallest k whose share of bursts <= k reaches the coverage (default 0.9): shares are
    # 0.4 (1), 0.8 (4), 1.0 (9), so 0.9 needs 9 and 0.8 takes 4; the most common size (1 and 4 tie)
    # would cover 0.4 or 0.8 only
    assert ballast.replicas([1, 1, 4, 4, 9]) == (9, 1.0)
    assert ballast.replicas([1, 1, 4, 4, 9], 0.8) == (4, 0.8)
    assert ballast.replicas([1, 1, 4, 4, 9], 0.4) == (1, 0.4)
    # each choice with its share and cost: a pod of a quarter node held 100 h a week
    assert ballast.choices([1, 1, 4, 4, 9], 0.25, 100) == [
        {"replicas": 1, "covered_share": 0.4, "node_hours_per_week": 25.0},
        {"replicas": 4, "covered_share": 0.8, "node_hours_per_week": 100.0},
        {"replicas": 9, "covered_share": 1.0, "node_hours_per_week": 225.0},
    ]


def test_most_common_size_and_zero_hours() -> None:
    assert ballast.most_common_size([(1000, 2), (2000, 4), (1000, 2)]) == (1000, 2)
    assert ballast.most_common_size([(1000, 2), (2000, 4)]) == (2000, 4)  # tie: the larger
    monday = datetime(2026, 11, 16, 9, 30)  # a Monday
    free = ballast.zero_hours([monday, monday + timedelta(days=5, hours=1)])  # Mon 09, Sat 10
    assert "Mon 09" not in free
    assert "Sat 10" not in free
    assert len(free) == 7 * 24 - 2


# The chart's template lines that read ballast.dind (codefresh-io/venona,
# charts/cf-runtime/templates/_components/ballast/_deployment.yaml and templates/ballast/deployment.yaml)
CF_RUNTIME_BALLAST = Path(__file__).parent.parent / "fixtures" / "cf-runtime" / "ballast-deployment.tpl"


def render_ballast(entry: dict[str, Any]) -> tuple[Any, set[str]]:
    """The fixture rendered with ``entry`` as ``.Values``, as Helm does for the few constructs it uses
    (a missing value renders empty), and the keys the template reads."""
    text = re.sub(r"\{\{-? /\*.*?\*/ -?\}\}\n?", "", CF_RUNTIME_BALLAST.read_text(), flags=re.S)
    read = set(re.findall(r"\.Values\.(\w+)", text))
    cond = re.fullmatch(r"\{\{- if \.Values\.(\w+) \}\}\n(.*)\{\{- end \}\}\n", text, flags=re.S)
    assert cond is not None, "the fixture is one {{- if .Values.enabled }} block"
    if not entry.get(cond[1]):
        return None, read

    def to_yaml(m: re.Match[str]) -> str:
        dumped = yaml.safe_dump(entry.get(m[1]) or {}, default_flow_style=False).rstrip("\n")
        return "".join("\n" + " " * int(m[2]) + line for line in dumped.splitlines())

    body = re.sub(r"\s*\{\{- toYaml \.Values\.(\w+) \| nindent (\d+)\s*\}\}", to_yaml, cond[2])
    body = re.sub(r"\{\{ \.Values\.(\w+) \}\}", lambda m: str(entry.get(m[1], "")), body)
    return yaml.safe_load(body), read


def test_ballast_helm_values_set_the_keys_the_chart_reads() -> None:
    values = yaml.safe_load(ballast.helm_values(3, 3500, 7800 * MIB))
    entry = values["ballast"]["dind"]
    deployment, read = render_ballast(entry)
    assert set(entry) <= read, f"keys the chart never reads: {set(entry) - read}"
    assert deployment["spec"]["replicas"] == 3  # replicasCount: a replicaCount key would leave it unset (1 pod)
    wait = deployment["spec"]["template"]["spec"]["containers"][0]
    assert wait["resources"]["requests"] == {"cpu": "3500m", "memory": "7800Mi"}
    assert wait["resources"]["limits"] == wait["resources"]["requests"]
    # no builds, no ballast: the chart renders nothing
    off, _ = render_ballast(yaml.safe_load(ballast.helm_values(0, 0, 0))["ballast"]["dind"])
    assert off is None
