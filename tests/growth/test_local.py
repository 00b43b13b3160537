"""``ci-sizer collect --grow`` with the local actuator, on real cgroup v1 memory cgroups and a real kernel:
the same build, allocating and touching memory step by step to about 600 MiB under a 256 MiB limit, is
killed by the kernel without the guard and finishes with it; a burst that outruns the watcher is killed
and reported as ``too_late``. Each run goes to a live sizer, through a hop that keeps what was posted."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..collector.helpers import IDENTITY, collect
from .conftest import Sizer
from .helpers import (
    MIB,
    Recorder,
    allocate,
    answer_file,
    cgroup_parent,
    enter,
    identity,
    job_growths,
    limited,
    oom_kills,
    stored_container,
    stored_events,
)

LIMIT, MAX, STEP = 256 * MIB, 1024 * MIB, 128 * MIB


@pytest.fixture
def recorder(sizer: Sizer) -> Recorder:
    return Recorder(sizer.url)


def _growth_lines(stderr: str) -> list[tuple[int, int, str]]:
    return [
        (int(a) * MIB, int(b or a) * MIB, result)
        for a, b, result in re.findall(r"ci-sizer: growth \(\w+\): (\d+) MiB(?: -> (\d+) MiB)?: (\w+)", stderr)
    ]


def test_without_grow_the_kernel_kills_the_build(tmp_path: Path, sizer: Sizer, recorder: Recorder) -> None:
    command, _ = allocate(tmp_path, 600, rate=300)
    with limited("nogrow", LIMIT) as cg:
        done = collect("--url", recorder.url, *IDENTITY, "--run-id", "nogrow-1", "--interval", "0.2",
                       "--", *enter(cg), *command)  # fmt: skip
        assert oom_kills(cg) == 1  # the kernel's OOM event, in the cgroup's own count
    assert done.returncode == 137, done.stderr  # SIGKILL, as the shell reports it
    assert "growth" not in done.stderr
    stored = stored_container(sizer.database, "nogrow-1")
    # killed at the limit (the process tree's proportional set counts its share of shared pages too)
    assert stored["memory_peak_bytes"] == pytest.approx(LIMIT, rel=0.15)


def test_with_grow_the_build_finishes_and_the_run_has_its_true_peak_and_steps(
    tmp_path: Path, sizer: Sizer, recorder: Recorder
) -> None:
    cgroup_parent()
    command, report = allocate(tmp_path, 600, rate=300)
    answer = answer_file(tmp_path / "answer.json", limit=LIMIT, max_bytes=MAX, threshold=80, step=STEP)
    done = collect("--url", recorder.url, *identity("grow"), "--interval", "0.2",
                   "--grow", "--grow-with", "cgroup", "--answer", str(answer), "--", *command)  # fmt: skip
    assert done.returncode == 0, done.stderr
    peak = int(report.read_text())  # what the build says it held
    assert peak > 600 * MIB
    # the steps: from the answer's limit, a step at a time, each when the working set reached 80 % of the
    # limit in force, until the build fit (600 MiB and more is over 80 % of 640 MiB: one more, to 768)
    steps = [(LIMIT + i * STEP, LIMIT + (i + 1) * STEP, "grown") for i in range(4)]
    assert _growth_lines(done.stderr) == steps
    posted = recorder.last_container()
    assert [(g["from_bytes"], g["to_bytes"], g["result"]) for g in posted["growths"]] == steps
    assert posted["growths"][0]["at"] >= recorder.posted[0]["started_at"][:19]
    assert len(recorder.posted) == 1  # taken as it was (a sizer from before growth would have refused it)
    assert stored_events(sizer.url, "grow") == steps  # the live sizer's growth API
    counts = job_growths(sizer.url, "grow")
    assert (counts["runs_grown"], counts["kills_avoided"], counts["runs_too_late"]) == (1, 1, 0)
    stored = stored_container(sizer.database, "grow-1")
    assert stored["memory_limit_bytes"] == LIMIT + 4 * STEP  # the limit it ended with
    assert stored["memory_peak_bytes"] == pytest.approx(peak, rel=0.1)  # its true peak, never killed
    assert stored["oom_kill_events"] == 0
    # the build's cgroup is gone with the build
    made = re.search(r"growth on \(cgroup, cgroup (\S+)\)", done.stderr)
    assert made is not None
    assert Path(made.group(1)).parent == cgroup_parent()
    assert not Path(made.group(1)).exists()


def test_a_burst_that_outruns_the_watcher_is_killed_and_reported_too_late(
    tmp_path: Path, sizer: Sizer, recorder: Recorder
) -> None:
    cgroup_parent()
    # 600 MiB faulted in by one mmap, against a watcher that polls every 0.1 s (cgroup v1's threshold
    # notification off: polling alone, as on cgroup v2 and in pods) with 5 % of headroom before the limit
    command, _ = allocate(tmp_path, 600, rate=0, chunk=600)
    answer = answer_file(tmp_path / "answer.json", limit=LIMIT, max_bytes=MAX, threshold=95, step=32 * MIB)
    done = collect("--url", recorder.url, *identity("burst"), "--interval", "0.2",
                   "--grow", "--grow-with", "cgroup", "--no-grow-notify", "--grow-poll", "0.1",
                   "--answer", str(answer), "--", *command)  # fmt: skip
    assert done.returncode == 137, done.stderr
    growths = recorder.last_container()["growths"]
    late = [g for g in growths if g["result"] == "too_late"]
    assert len(late) == 1, growths
    # killed at the limit in force then; nothing was being asked (a cgroup write never waits)
    assert late[0]["from_bytes"] == late[0]["to_bytes"] <= MAX
    assert all(g["result"] in ("grown", "too_late") for g in growths)
    assert stored_events(sizer.url, "burst") == [(g["from_bytes"], g["to_bytes"], g["result"]) for g in growths]
    counts = job_growths(sizer.url, "burst")
    assert (counts["runs_too_late"], counts["kills_avoided"]) == (1, 0)
    stored = stored_container(sizer.database, "burst-1")
    assert stored["oom_kill_events"] == 1
    assert stored["memory_limit_bytes"] == late[0]["from_bytes"]


def test_a_parent_that_cannot_hold_the_build_leaves_it_unguarded(tmp_path: Path) -> None:
    # not a cgroup at all: one line, and the build runs (and exits) as it would have without --grow
    cgroup_parent()
    answer = answer_file(tmp_path / "answer.json", limit=LIMIT, max_bytes=MAX, threshold=80, step=STEP)
    done = collect(*IDENTITY, "--spool-dir", str(tmp_path / "spool"), "--grow", "--grow-with", "cgroup",
                   "--grow-cgroup-parent", str(tmp_path), "--answer", str(answer),
                   "--", sys.executable, "-c", "import sys; sys.exit(3)")  # fmt: skip
    assert done.returncode == 3
    lines = [line for line in done.stderr.splitlines() if "growth" in line]
    assert len(lines) == 1
    assert lines[0].startswith(f"ci-sizer: growth is off: no cgroup for the build below {tmp_path}")
    assert "Traceback" not in done.stderr


def test_the_grow_block_comes_from_the_live_sizer(tmp_path: Path, sizer: Sizer, recorder: Recorder) -> None:
    # no --answer: the collector GETs the JSON answer; a job never seen has the unknown phase's entry
    cgroup_parent()
    answer = httpx.get(f"{sizer.url}/api/v1/sizing/acme/web/ci.yml/from-sizer").json()
    (entry,) = answer["containers"]
    grow, limit = entry["grow"], entry["memory"]["limit_bytes"]
    command, _ = allocate(tmp_path, 64, rate=0, hold=0.3)
    done = collect("--url", recorder.url, *identity("from-sizer"), "--interval", "0.1", "--grow", "--grow-with",
                   "cgroup", "--", *command)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        f"limit {limit // MIB} MiB, up to {grow['max_bytes'] // MIB} MiB by {grow['step_bytes'] // MIB} MiB "
        f"at {grow['threshold_percent']}%"
    ) in done.stderr
    assert "growths" not in recorder.last_container()  # 64 MiB is far below the threshold: nothing to grow
    assert stored_container(sizer.database, "from-sizer-1")["memory_limit_bytes"] == limit  # the build's own cgroup


def test_a_sizer_from_before_growth_still_gets_the_run(tmp_path: Path) -> None:
    # it refuses the unknown field as the service did before growth (422 naming it): the run is posted
    # again without its events, and stored
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bodies: list[dict[str, Any]] = []

    class OldSizer(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            refused = "growths" in body["containers"][0]
            problem = {
                "status": 422,
                "errors": [{"field": "body/containers/0/growths", "message": "Extra inputs are not permitted"}],
            }
            data = json.dumps(problem if refused else {"result": "created"}).encode()
            self.send_response(422 if refused else 201)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), OldSizer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cgroup_parent()
    command, _ = allocate(tmp_path, 300, rate=300)
    answer = answer_file(tmp_path / "answer.json", limit=LIMIT, max_bytes=MAX, threshold=80, step=STEP)
    try:
        done = collect("--url", f"http://127.0.0.1:{server.server_address[1]}", *identity("old-sizer"),
                       "--interval", "0.2", "--grow", "--grow-with", "cgroup", "--answer", str(answer),
                       "--", *command)  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    assert [("growths" in b["containers"][0]) for b in bodies] == [True, False]
    assert "posting the run again without its growth events" in done.stderr
    assert "posted run old-sizer-1" in done.stderr
