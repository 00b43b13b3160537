"""The suite's own scheduling (issue 36): tests/conftest.py's ``long_first`` starts each xdist worker on
its share of the modules holding long tests, keeps a module's tests together, and lists every test once."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from .conftest import long_first

TOOL = Path(__file__).resolve().parent / "tools" / "processes.py"


def ids(module: str, n: int) -> list[str]:
    return [f"{module}::t{i}" for i in range(n)]


def test_each_worker_starts_with_its_share_of_the_long_modules() -> None:
    # file order puts the two long modules last: one worker would get both, after the others' runs
    nodeids = ids("a.py", 8) + ids("b.py", 8) + ids("long1.py", 2) + ids("long2.py", 2)
    known = {"long1.py::t0": 30.0, "long2.py::t1": 20.0, "long2.py::t0": 5.0}
    order = long_first(nodeids, known, workers=2)
    assert sorted(order) == list(range(len(nodeids)))
    first, second = [nodeids[i] for i in order[:10]], [nodeids[i] for i in order[10:]]  # worksteal's runs: 10, 10
    assert first[:2] == ["long1.py::t0", "long1.py::t1"]  # the longest module opens one run, whole
    assert second[:2] == ["long2.py::t0", "long2.py::t1"]  # the next opens the other, in its own order
    # the other tests keep their order
    assert [n for n in first + second if not n.startswith("long")] == ids("a.py", 8) + ids("b.py", 8)


def test_the_longest_go_to_the_run_with_the_least() -> None:
    nodeids = ids("x.py", 1) + ids("y.py", 1) + ids("z.py", 1) + ids("s.py", 9)
    known = {"x.py::t0": 30.0, "y.py::t0": 20.0, "z.py::t0": 15.0}
    order = long_first(nodeids, known, workers=2)
    runs = [nodeids[i] for i in order[:6]], [nodeids[i] for i in order[6:]]
    assert runs[0][0] == "x.py::t0"
    assert runs[1][:2] == ["y.py::t0", "z.py::t0"]  # 20 + 15 against 30


def test_a_module_larger_than_the_room_left_in_a_run_stays_in_its_place() -> None:
    # two runs of 6: "huge" (7 tests, the longest) fits in neither and keeps its place among the other tests;
    # "big" (5) opens the first run
    nodeids = ids("huge.py", 7) + ids("big.py", 5)
    known = {"big.py::t0": 10.0, "huge.py::t0": 30.0}
    order = long_first(nodeids, known, workers=2)
    assert sorted(order) == list(range(12))
    assert [nodeids[i] for i in order] == ids("big.py", 5) + ids("huge.py", 7)


def test_more_long_modules_than_a_run_holds_still_lists_each_test_once() -> None:
    nodeids = [f"m{i}.py::t" for i in range(5)]
    known = {n: float(i + 1) for i, n in enumerate(nodeids)}
    order = long_first(nodeids, known, workers=4)
    assert sorted(order) == list(range(5))
    assert order[0] == 4  # the longest first


def test_no_long_tests_keeps_the_order() -> None:
    assert long_first(["a::x", "a::y", "b::z"], {}, workers=3) == [0, 1, 2]


def counts(stderr: str) -> dict[str, int]:
    """tests/tools/processes.py's table: "[CPU-s] processes  kind" a line."""
    found = (re.match(r"\s*(?:[\d.]+\s+)?(\d+)  (\S.*)$", line) for line in stderr.splitlines())
    return {m[2]: int(m[1]) for m in found if m}


def run_tool(*command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), "--", *command], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


def test_processes_counts_each_kind_of_python_process(tmp_path: Path) -> None:
    # tests/tools/processes.py (issue 36): every Python process the command starts is noted and counted by
    # kind, paths and ports left out (with CPU-seconds beside, where process accounting is at hand)
    script = (
        "import subprocess, sys\n"
        "for _ in range(2):\n"
        "    subprocess.run([sys.executable, '-m', 'service', 'migrate', '--help'], capture_output=True, check=True)\n"
        "subprocess.run([sys.executable, '-m', 'service', 'token', 'create', '--help'], capture_output=True, check=True)\n"
    )
    done = run_tool(sys.executable, "-c", script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert counts(done.stderr).get("ci-sizer migrate") == 2, done.stderr
    assert counts(done.stderr).get("ci-sizer token create") == 1, done.stderr


def test_a_run_inside_another_leaves_the_outer_one_whole(tmp_path: Path) -> None:
    # ``processes.py -- python -m pytest`` runs the test above, a run inside a run: the outer one still notes
    # the inner one's processes, and keeps the kernel's one accounting file (the inner run would have
    # switched it off for the rest of the outer one)
    inner = "import subprocess, sys; subprocess.run([sys.executable, '-m', 'service', 'migrate', '--help'])"
    done = run_tool(sys.executable, str(TOOL), "--", sys.executable, "-c", inner, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "a run inside another leaves it to the outer one" in done.stderr
    inner_table, outer_table = done.stderr.split("processes  kind")[1:]  # the inner run prints first
    assert counts(inner_table).get("ci-sizer migrate") == 1, done.stderr
    assert counts(outer_table).get("ci-sizer migrate") == 1, done.stderr


def test_a_process_s_kind_leaves_out_paths_and_ports() -> None:
    spec = importlib.util.spec_from_file_location("processes", TOOL)
    assert spec is not None
    assert spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    kind = tool.kind

    assert kind(["/v/bin/python", "-m", "service", "serve", "--port", "4711", "--database-url", "sqlite:///x"]) == (
        "ci-sizer serve"
    )
    assert kind(["/v/bin/ci-sizer", "webhook", "serve", "--port", "1"]) == "ci-sizer webhook serve"
    assert kind(["/v/bin/ci-sizer", "token", "--help"]) == "ci-sizer token"  # no subcommand: the CI tier runs it
    assert kind(["/v/bin/python", "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"]) == "pytest: xdist worker"
    assert kind(["/v/bin/python", "/r/bench/replay.py", "--data", "/d"]) == "script replay.py"
