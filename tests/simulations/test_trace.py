"""Synthetic traces: their weekly shape, and the ballast sized from them (SA2)."""

from __future__ import annotations

from service import simulations as simulate
from service.ballast import service as ballast


def test_synthetic_trace_shape() -> None:
    # a week at 1000 a day: about 7000 builds, weekdays busier than weekends, afternoons than nights
    builds = simulate.synthetic(days=7, builds_per_day=1000, seed=1, bursts_per_day=0)
    assert 6300 < len(builds) < 7700
    day = [0] * 7
    hour = [0] * 24
    for x in builds:
        day[int(x.start // 86400)] += 1
        hour[int(x.start % 86400 // 3600)] += 1
    assert min(day[:5]) > 3 * max(day[5:])
    assert hour[14] > 5 * hour[3]
    assert all(x.duration >= 30 for x in builds)


def test_sa2_auto_ballast_covers_the_bursts_of_the_synthetic_week() -> None:
    # the figure: on the synthetic week the most common burst (1 build) covers about a quarter
    # of the bursts; coverage 0.9 takes the smallest count that covers 90 %
    builds = simulate.synthetic(days=7, builds_per_day=1500, seed=0)
    groups = ballast.bursts((x.start for x in builds), 120)
    mode = max(set(groups), key=lambda k: (groups.count(k), k))
    mode_share = sum(g <= mode for g in groups) / len(groups)
    auto = simulate.auto_ballast(builds, 120)
    share = sum(g <= auto.replicas for g in groups) / len(groups)
    assert mode_share < 0.5 <= 0.9 <= share
    assert sum(g <= auto.replicas - 1 for g in groups) / len(groups) < 0.9  # the smallest such count
    assert auto.priority == -1_000_000
    assert ballast.replicas([]) == (0, 1.0)
