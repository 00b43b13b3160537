"""Placement advice (``shared/spec/placement.md``): Concourse filter chains (P1-P6, PC1-PC8 in
``placement.chains``) or Kubernetes node scoring (P7-P10 in ``placement.scoring``), for one pod or
step whose totals ``placement.pods`` counts.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from typing import Any

from service.placement.chains import run_chain, run_chain_head, run_chain_v70
from service.placement.pods import describe_pod, pod_totals
from service.placement.schemas import PlacementAdvise, PlacementPod
from service.placement.scoring import Columns, extended_names, score, scorers_of


def advise(
    body: PlacementAdvise, pod: PlacementPod, pod_info: dict[str, Any], *, scorer: Callable[..., Any] | None = None
) -> dict[str, Any]:
    """The reply of ``POST /api/v1/placement:advise``; ``pod`` is the step's pod (the job's
    recommended containers when the step referenced one), ``pod_info`` where it came from."""
    seed = body.seed if body.seed is not None else secrets.randbelow(2**63)
    rng = random.Random(seed)
    totals = pod_totals(pod, placing=True)
    out: dict[str, Any] = {"seed": seed, "pod": describe_pod(totals, **pod_info)}
    if body.chain is not None:
        run = {"doc": run_chain, "v7.0": run_chain_v70, "head": run_chain_head}[body.chain.generation]
        out.update(run(body.nodes, body.pod, body.chain, rng))
    else:
        scorers = scorers_of(body)
        out["profile"] = [s.model_dump() for s in scorers]
        columns = Columns.of(body.nodes, extended_names(totals, scorers))
        out.update(score(body.nodes, columns, totals, scorers, rng, top=body.top, scorer=scorer))
    return out
