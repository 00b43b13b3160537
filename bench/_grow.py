"""Growth in the closed-loop replay (issue 40): ``bench/replay.py --grow [--grow-refused F]``.

What the growth guard (``ci-sizer collect --grow``) does to one replayed run, given the answer's
``grow`` block (rules G1-G5, docs/sizing.md) and the run's peak. The traces give a run's peak, not when
it came, so the guard is modelled as use rising to the peak: whenever use reaches ``threshold_percent``
of the limit in force, it asks for ``step_bytes`` more (never past ``max_bytes``), until the limit holds
the peak with the threshold's headroom, or the maximum is reached. A resize the cluster refuses
(``--grow-refused F``: each resize refused as ``Deferred`` with probability F, from a fixed seed) ends the
growing: the run is killed if its peak is above the limit in force. A run is killed when its peak is
above the limit in force at the end (the maximum, or the limit a refusal left).

Accounting (the issue's, which overstates the waste): a grown run reserves its grown size for its whole
duration (under ``guaranteed`` the request rises with the limit; ``burstable`` keeps its request); a
killed run's whole reservation is waste, as without growth. A run is posted with the limit it ended
with, its true peak (clipped at that limit when killed) and its growth events, as the guard reports it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: an answer's grow block as ``core.size_grow`` gives it: (max_bytes, threshold_percent, step_bytes);
#: max -1: the container must not grow (G1)
GrowBlock = tuple[int, int, int]
NO_GROW: GrowBlock = (-1, 0, 0)


class Refusals:
    """Which resizes the cluster refuses: each with probability ``fraction``, from a fixed seed, so a
    replay (and its live twin) sees the same refusals."""

    def __init__(self, fraction: float, seed: int = 40) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("--grow-refused is a fraction between 0 and 1")
        self.fraction = fraction
        self.rng = random.Random(seed)

    def __call__(self) -> bool:
        return self.fraction > 0 and self.rng.random() < self.fraction


@dataclass(frozen=True)
class Outcome:
    """One run under the guard: killed or not, the limit and request it ended with, its events
    ``(from_bytes, to_bytes, result)``."""

    killed: bool
    limit: int
    request: int
    events: tuple[tuple[int, int, str], ...] = ()

    @property
    def grew(self) -> bool:
        return any(result == "grown" for _, _, result in self.events)


def outcome(
    peak: int, limit: int, request: int, grow: GrowBlock, *, refuse: Refusals | None, guaranteed: bool
) -> Outcome:
    """The guard on one run (``refuse`` None: no guard, the run as before growth)."""
    most, threshold, step = grow
    if refuse is None or most <= limit:
        return Outcome(peak > limit, limit, request)
    events: list[tuple[int, int, str]] = []
    current = limit
    # grow while use would reach the threshold of the limit in force (100 x peak >= threshold x limit)
    while current < most and 100 * peak >= threshold * current:
        asked = min(current + step, most)
        if refuse():
            events.append((current, asked, "deferred"))
            break
        events.append((current, asked, "grown"))
        current = asked
    grown_request = current if guaranteed else request  # guaranteed: the request rises with the limit
    return Outcome(peak > current, current, grown_request, tuple(events))


@dataclass
class Counts:
    """What the guard did over a replay: runs grown, kills avoided (runs that grew past the limit they
    were given and were not killed), resizes asked and refused."""

    grown: int = 0
    avoided: int = 0
    resizes: int = 0
    refused: int = 0

    def add(self, o: Outcome, peak: int, first_limit: int) -> None:
        self.grown += o.grew
        self.avoided += o.grew and not o.killed and peak > first_limit
        self.resizes += len(o.events)
        self.refused += sum(result != "grown" for _, _, result in o.events)

    def row(self) -> dict[str, Any]:
        return {
            "runs_grown": self.grown,
            "kills_avoided": self.avoided,
            "resizes": self.resizes,
            "refused": self.refused,
        }


def render(title: str, rows: Sequence[dict[str, Any]], anchors: tuple[str, str]) -> list[str]:
    """The growth table: each row's kills, growths and wastes, against the better closed-loop anchor."""
    by = {r["policy"]: r for r in rows}
    krr, vpa = by[anchors[0]], by[anchors[1]]
    best_oom = min(krr["oom_killed"], vpa["oom_killed"]) or 1
    best_mem = min(krr["memory_waste_gib_h"], vpa["memory_waste_gib_h"]) or 1.0
    out = [
        f"{title} ({rows[0]['runs']} runs)",
        "",
        "| policy | growth | OOM-killed runs | runs grown | kills avoided | resizes (refused) | memory waste GiB-h "
        "| CPU waste core-h | OOM vs better anchor | memory vs lower anchor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        growth = r.get("growth", "off")
        grown = f"{r['runs_grown']}" if growth != "off" else "-"
        avoided = f"{r['kills_avoided']}" if growth != "off" else "-"
        resizes = f"{r['resizes']} ({r['refused']})" if growth != "off" else "-"
        out.append(
            f"| {r['policy']}{' (' + r['source'] + ')' if r.get('source') else ''} | {growth} | "
            f"{r['oom_killed']} ({r['oom_share']:.1%}) | {grown} | {avoided} | {resizes} | "
            f"{r['memory_waste_gib_h']:.2f} | {r['cpu_waste_core_h']:.2f} | {r['oom_killed'] / best_oom:.2f}x | "
            f"{r['memory_waste_gib_h'] / best_mem:.2f}x |"
        )
    out.append("")
    return out
