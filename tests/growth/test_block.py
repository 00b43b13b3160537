"""The grow block (the wire contract §1): what the guard reads of it, the limit it asks for, and how it
learns it (a saved answer, or one bounded GET from the sizer, up, down or hanging)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.growth.block import GrowBlock, fetch_answer, learn, plan_from_answer, sizing_url

from .conftest import Sizer
from .helpers import MIB, answer_file

BLOCK = {"max": "1Gi", "max_bytes": 1 << 30, "threshold_percent": 80, "step": "128Mi", "step_bytes": 128 * MIB}


def test_the_three_numbers_are_read_and_checked() -> None:
    assert GrowBlock.from_wire(BLOCK) == GrowBlock(1 << 30, 80, 128 * MIB)
    # a maximum the kernel could not hold (it keeps whole pages) is the page below it
    assert GrowBlock.from_wire({**BLOCK, "max_bytes": (1 << 30) + 100}).max_bytes == 1 << 30
    for key, bad in [("max_bytes", -1), ("step_bytes", 0), ("threshold_percent", 49), ("threshold_percent", 100),
                     ("max_bytes", "1Gi"), ("step_bytes", True), ("threshold_percent", 80.0)]:  # fmt: skip
        with pytest.raises(ValueError, match=f"grow.{key}"):
            GrowBlock.from_wire({**BLOCK, key: bad})


def test_the_limit_asked_for() -> None:
    b = GrowBlock(1 << 30, 80, 128 * MIB)
    limit = 256 * MIB
    assert b.next_target(204 * MIB, limit) is None  # below 80 % of the limit in force
    assert b.next_target(205 * MIB, limit) == 384 * MIB  # at it: one step
    assert b.next_target(320 * MIB, limit) == 512 * MIB  # already past the next step's threshold: two
    assert b.next_target(5 << 30, limit) == 1 << 30  # never past the maximum
    assert b.next_target(1 << 30, 1 << 30) is None  # at the maximum: nothing more to ask
    # a step that is not whole MiB is rounded up to one that is
    assert GrowBlock(1 << 30, 90, 100 * 1000 * 1000).next_target(250 * MIB, limit) == 352 * MIB


def _answer(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"containers": list(containers)}


def _entry(name: str, grow: Any = BLOCK, limit: int = 256 * MIB) -> dict[str, Any]:
    return {"name": name, "memory": {"limit_bytes": limit}, "grow": grow}


def test_the_plan_for_a_container() -> None:
    plan, _ = plan_from_answer(_answer(_entry("build"), _entry("svc-postgres", None)), "build")
    assert plan is not None
    assert (plan.container, plan.block.max_bytes, plan.limit_bytes) == ("build", 1 << 30, 256 * MIB)
    # a job never seen: the unknown phase's single entry (rule S6), and a degraded answer's, serve any name
    plan, _ = plan_from_answer(_answer(_entry("*", limit=4 << 30, grow={**BLOCK, "max_bytes": 8 << 30})), "build")
    assert plan is not None
    assert plan.container == "*"
    # what turns growth off, each said
    for answer, why in [
        (_answer(_entry("svc-postgres", None)), "must not grow (grow: null)"),
        (_answer({"name": "build", "memory": {"limit_bytes": 1}}), "no grow block (a sizer from before growth)"),
        (_answer(_entry("job")), "no entry for container 'build'"),
        (_answer(_entry("build", {**BLOCK, "step_bytes": -5})), "grow.step_bytes"),
        ({"containers": "x"}, "no containers list"),
        ("KUBERNETES_MEMORY_LIMIT: 2Gi", "no containers list"),
    ]:
        plan, said = plan_from_answer(answer, "svc-postgres" if "postgres" in json.dumps(answer) else "build")
        assert plan is None
        assert why in said


def test_the_answer_s_address_encodes_each_name_as_one_segment() -> None:
    # rule O6: a "/" inside a name is %2F, so that GitLab's nested namespaces stay one segment
    assert sizing_url("http://sizer:8080/", "acme/platform", "web", ".gitlab-ci.yml", "build 1/2") == (
        "http://sizer:8080/api/v1/sizing/acme%2Fplatform/web/.gitlab-ci.yml/build%201%2F2"
    )


def test_the_answer_is_fetched_from_a_live_sizer(sizer: Sizer) -> None:
    names = ("acme/platform", "web", "ci.yml", "grow-fetch")
    answer = fetch_answer(sizing_url(sizer.url, *names), None, 10)
    assert (answer["org"], answer["job"]) == ("acme/platform", "grow-fetch")
    assert answer == httpx.get(sizer.url + "/api/v1/sizing/acme%2Fplatform/web/ci.yml/grow-fetch").json()


def test_a_saved_answer_is_read_without_the_sizer(tmp_path: Path) -> None:
    said: list[str] = []
    path = answer_file(tmp_path / "answer.json", limit=256 * MIB, max_bytes=1 << 30, threshold=85, step=64 * MIB)
    plan = learn(answer_file=path, url="http://127.0.0.1:9", token=None, names=("a", "b", "c", "d"),
                 container="build", timeout=1, say=said.append)  # fmt: skip
    assert plan is not None
    assert plan.block == GrowBlock(1 << 30, 85, 64 * MIB)
    assert said == []
    (tmp_path / "bad.json").write_text("{")
    assert learn(answer_file=tmp_path / "bad.json", url=None, token=None, names=("a", "b", "c", "d"),
                 container="build", timeout=1, say=said.append) is None  # fmt: skip
    assert said == [f"ci-sizer: growth is off: no answer from {tmp_path / 'bad.json'} (JSONDecodeError: "
                    "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); "
                    "the build runs without growth"]  # fmt: skip


def test_a_sizer_down_or_hanging_turns_growth_off_within_the_timeout() -> None:
    # down: the connection is refused at once; hanging: it is accepted and never answered, and the
    # time bound (not a socket read) ends the wait
    names = ("a", "b", "c", "d")
    with socket.socket() as down:
        down.bind(("127.0.0.1", 0))
        port = down.getsockname()[1]
    said: list[str] = []
    assert learn(answer_file=None, url=f"http://127.0.0.1:{port}", token=None, names=names, container="build",
                 timeout=5, say=said.append) is None  # fmt: skip
    assert "Connection refused" in said[0]
    with socket.socket() as hanging:
        hanging.bind(("127.0.0.1", 0))
        hanging.listen()
        said.clear()
        assert learn(answer_file=None, url=f"http://127.0.0.1:{hanging.getsockname()[1]}", token=None,
                     names=names, container="build", timeout=0.5, say=said.append) is None  # fmt: skip
    # (whichever of the bound and the socket's read timeout, both 0.5 s, ends it first)
    assert len(said) == 1
    assert said[0].startswith("ci-sizer: growth is off: no answer from the sizer (TimeoutError: ")
    assert said[0].endswith("the build runs without growth")


def test_auto_in_a_pod_without_its_name_is_off(tmp_path: Path) -> None:
    # in a pod (the service host is set) the actuator is Kubernetes; without the downward API's pod name
    # it cannot know which pod to resize: one line, and the build runs
    from ..collector.helpers import IDENTITY, collect

    path = answer_file(tmp_path / "answer.json", limit=256 * MIB, max_bytes=1 << 30, threshold=85, step=64 * MIB)
    done = collect(*IDENTITY, "--spool-dir", str(tmp_path / "spool"), "--grow", "--answer", str(path),
                   "--", "sh", "-c", "exit 6", env={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "CI_SIZER_POD_NAME": ""})  # fmt: skip
    assert done.returncode == 6
    assert done.stderr.splitlines()[0] == (
        "ci-sizer: growth is off: in a Kubernetes pod without CI_SIZER_POD_NAME (set it from the downward API); "
        "the build runs without growth"
    )
