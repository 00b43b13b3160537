"""``bench/replay.py --grow`` (issue 40): the growth guard's model (bench/_grow.py) worked by hand, and the
live closed loop with growth (servers answering grow blocks, runs posted with their growth events) giving
exactly the offline figures, grow blocks included, on SQLite and PostgreSQL. The traces are the synthetic
ones of tests/test_replay_bench.py (the real data never enters the repository)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import _grow

from .test_replay_bench import live_setup, replay

MIB = 1 << 20
GIB = 1 << 30
BLOCK = (4 * GIB, 90, 256 * MIB)  # a 1Gi limit's grow block (rules G3-G5)


def test_a_run_above_its_limit_within_the_maximum_is_grown_not_killed() -> None:
    o = _grow.outcome(1500 * MIB, GIB, GIB, BLOCK, refuse=_grow.Refusals(0.0), guaranteed=True)
    # 1Gi -> 1.25Gi -> 1.5Gi -> 1.75Gi: grown while use reaches 90 % of the limit in force
    assert (o.killed, o.limit, o.request) == (False, 1792 * MIB, 1792 * MIB)
    assert o.events == (
        (GIB, 1280 * MIB, "grown"),
        (1280 * MIB, 1536 * MIB, "grown"),
        (1536 * MIB, 1792 * MIB, "grown"),
    )
    # burstable keeps its request: only the limit grows
    b = _grow.outcome(1500 * MIB, GIB, 700 * MIB, BLOCK, refuse=_grow.Refusals(0.0), guaranteed=False)
    assert (b.killed, b.limit, b.request) == (False, 1792 * MIB, 700 * MIB)


def test_past_the_maximum_or_refused_is_killed_without_the_guard_as_before() -> None:
    over = _grow.outcome(5 * GIB, GIB, GIB, BLOCK, refuse=_grow.Refusals(0.0), guaranteed=True)
    assert (over.killed, over.limit, len(over.events)) == (True, 4 * GIB, 12)
    refused = _grow.outcome(1500 * MIB, GIB, GIB, BLOCK, refuse=_grow.Refusals(1.0), guaranteed=True)
    assert (refused.killed, refused.limit, refused.events) == (True, GIB, ((GIB, 1280 * MIB, "deferred"),))
    # crossing the threshold with a refused resize, under the limit: not killed
    near = _grow.outcome(950 * MIB, GIB, GIB, BLOCK, refuse=_grow.Refusals(1.0), guaranteed=True)
    assert (near.killed, near.grew) == (False, False)
    # no guard, or no grow block (G1): the run as before growth
    for grow, refuse in ((BLOCK, None), (_grow.NO_GROW, _grow.Refusals(0.0))):
        assert _grow.outcome(1500 * MIB, GIB, GIB, grow, refuse=refuse, guaranteed=True) == _grow.Outcome(
            True, GIB, GIB
        )
    # under the threshold: nothing happens
    assert _grow.outcome(900 * MIB, GIB, GIB, BLOCK, refuse=_grow.Refusals(0.0), guaranteed=True).events == ()


def test_refusals_are_a_fixed_fraction_from_a_fixed_seed() -> None:
    a, b = _grow.Refusals(0.1), _grow.Refusals(0.1)
    draws = [a() for _ in range(10_000)]
    assert draws == [b() for _ in range(10_000)]
    assert 900 <= sum(draws) <= 1100
    with pytest.raises(ValueError, match="fraction"):
        _grow.Refusals(1.5)


@pytest.mark.ci  # the CI tier (README): the public traces replayed through a live server
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_grow_live_equals_offline(tmp_path: Path, database: str, request: pytest.FixtureRequest) -> None:
    on, data, md = live_setup(tmp_path, database, request)
    args = ("--grow", "--grow-refused", "0.25", "--data", str(data))
    live = replay(*on, *args, "--check-offline", "--results-md", str(md), "--results", str(tmp_path / "live.json"))
    assert live.returncode == 0, live.stdout + live.stderr
    offline = replay("--offline", *args, "--results", str(tmp_path / "offline.json"))
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert "check-offline: live == offline" in live.stdout

    figures = ("runs", "oom_killed", "memory_waste_gib_h", "runs_grown", "kills_avoided", "resizes", "refused")
    live_rows = {r["policy"]: r for r in json.loads((tmp_path / "live.json").read_text())["rows"]}
    offline_rows = {r["policy"]: r for r in json.loads((tmp_path / "offline.json").read_text())["rows"]}
    assert set(live_rows) == set(offline_rows)
    for label, row in live_rows.items():
        if row["source"].startswith("live"):
            served = "growth" if label.startswith("growth policy") else label.split(" ")[0]
            assert row["source"] == f"live, meta.policy {served}", row
            assert {f: row[f] for f in figures} == {f: offline_rows[label][f] for f in figures}, label
    # growth does something here: runs grow, kills are avoided, some resizes are refused
    grown = live_rows["efficient (guaranteed) + growth"]
    assert grown["runs_grown"] > 0
    assert grown["kills_avoided"] > 0
    assert grown["oom_killed"] < live_rows["efficient (guaranteed)"]["oom_killed"]
    assert live_rows["efficient (guaranteed) + growth, 25% refused"]["refused"] > 0
    text = md.read_text()
    assert "## Other bench\n\nkept as it is\n" in text
    assert "## Replay with growth (issue 40)" in text
    assert "| efficient (guaranteed) + growth (live" in text
