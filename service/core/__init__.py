"""The sizing maths, compiled when possible.

``BACKEND`` is ``"cython"`` when the compiled ``_sizing`` extension imported, else ``"python"``
(the typed reference in ``_reference``). ``CI_SIZER_PURE_PYTHON=1`` forces the reference.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ._reference import (
    BACKGROUND,
    BACKTEST_FIELDS,
    BALANCED_ALLOCATION,
    BALANCED_ALLOCATION_CHANGE,
    DEFAULT_CPU_MILLICORES,
    DEFAULT_MEMORY_BYTES,
    GIB,
    GROUP,
    LARGEST_NODE,
    LEAST_ALLOCATED,
    LIMIT_AWARE,
    LOOP,
    MAX_BACKOFF_DOUBLINGS,
    MAX_BYTES,
    MIB,
    MOST_ALLOCATED,
    NON_CI,
    OOM_KILLED,
    OOM_NEAR_LIMIT,
    OOM_NONE,
    PARALLEL,
    PHASE_CONFIDENT,
    PHASE_LEARNING,
    PHASE_UNKNOWN,
    POLICY_CI_SIZER,
    POLICY_EFFICIENT,
    POLICY_FIXED,
    POLICY_KRR,
    POLICY_RECORDED,
    POLICY_VPA,
    PRIOR_EMPTY,
    REQUESTED_TO_CAPACITY_RATIO,
    RUN_CLEAN,
    RUN_KILLED,
    RUN_NEAR_LIMIT,
    SIZED_FIELDS,
    SMALLEST_NODE,
    STEP,
    Sized,
)

BACKEND: str

if TYPE_CHECKING:
    from ._reference import (
        analysed_runs,
        backtest_walk,
        ceil_tolerant,
        compose_stage,
        cpu_limit_for,
        memory_buffer_percent,
        memory_limit_for,
        prior_read,
        prior_update,
        score_nodes,
        six_stats,
        size_container,
        size_run,
    )

    BACKEND = "python"
else:
    try:
        if os.environ.get("CI_SIZER_PURE_PYTHON", "") not in ("", "0"):
            raise ImportError("CI_SIZER_PURE_PYTHON is set")
        from ._sizing import (
            analysed_runs,
            backtest_walk,
            ceil_tolerant,
            compose_stage,
            cpu_limit_for,
            memory_buffer_percent,
            memory_limit_for,
            prior_read,
            prior_update,
            score_nodes,
            six_stats,
            size_container,
            size_run,
        )

        BACKEND = "cython"
    except ImportError:
        from ._reference import (
            analysed_runs,
            backtest_walk,
            ceil_tolerant,
            compose_stage,
            cpu_limit_for,
            memory_buffer_percent,
            memory_limit_for,
            prior_read,
            prior_update,
            score_nodes,
            six_stats,
            size_container,
            size_run,
        )

        BACKEND = "python"

__all__ = [
    "BACKEND",
    "BACKGROUND",
    "BACKTEST_FIELDS",
    "BALANCED_ALLOCATION",
    "BALANCED_ALLOCATION_CHANGE",
    "DEFAULT_CPU_MILLICORES",
    "DEFAULT_MEMORY_BYTES",
    "GIB",
    "GROUP",
    "LARGEST_NODE",
    "LEAST_ALLOCATED",
    "LIMIT_AWARE",
    "LOOP",
    "MAX_BACKOFF_DOUBLINGS",
    "MAX_BYTES",
    "MIB",
    "MOST_ALLOCATED",
    "NON_CI",
    "OOM_KILLED",
    "OOM_NEAR_LIMIT",
    "OOM_NONE",
    "PARALLEL",
    "PHASE_CONFIDENT",
    "PHASE_LEARNING",
    "PHASE_UNKNOWN",
    "POLICY_CI_SIZER",
    "POLICY_EFFICIENT",
    "POLICY_FIXED",
    "POLICY_KRR",
    "POLICY_RECORDED",
    "POLICY_VPA",
    "PRIOR_EMPTY",
    "REQUESTED_TO_CAPACITY_RATIO",
    "RUN_CLEAN",
    "RUN_KILLED",
    "RUN_NEAR_LIMIT",
    "SIZED_FIELDS",
    "SMALLEST_NODE",
    "STEP",
    "Sized",
    "analysed_runs",
    "backtest_walk",
    "ceil_tolerant",
    "compose_stage",
    "cpu_limit_for",
    "memory_buffer_percent",
    "memory_limit_for",
    "prior_read",
    "prior_update",
    "score_nodes",
    "six_stats",
    "size_container",
    "size_run",
]
