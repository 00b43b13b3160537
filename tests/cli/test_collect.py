"""``ci-sizer collect --flush``: a missing directory and a corrupt spool file are reported, with a
non-zero exit, and the good runs are still sent."""

from __future__ import annotations

from pathlib import Path

import httpx

from service import collector

from ..helpers import container, run
from ..live import LiveServer, free_port
from .entry import python_m


def test_flush_reports_a_missing_directory(tmp_path: Path) -> None:
    done = python_m("collect", "--flush", str(tmp_path / "nope"), "--url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert done.stderr.strip() == f"ci-sizer: error: --flush {tmp_path / 'nope'}: no such directory"


def test_flush_reports_a_corrupt_spool_file_and_still_sends_the_others(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    good = collector.spool(spool, run(1, container()))
    corrupt = spool / "run-0-corrupt.json"
    corrupt.write_text('{"org": "acme", "repo"')  # cut short, as by a full disk
    with LiveServer(f"sqlite:///{tmp_path / 'sizer.db'}") as server:
        done = python_m("collect", "--flush", str(spool), "--url", server.url)
        assert done.returncode == 1
        assert f"ci-sizer: {corrupt.name}: not a spooled run, left in place (JSONDecodeError:" in done.stderr
        assert f"sent {good.name}" in done.stderr
        assert "Traceback" not in done.stderr
        assert f"1 run(s) still spooled in {spool}" in done.stderr
        assert httpx.post(server.url + "/api/v1/runs", json=run(1, container())).json()["result"] == "duplicate"
    assert sorted(p.name for p in spool.iterdir()) == [corrupt.name]  # kept for a person to look at
