"""The vectors V1-V7 of ``shared/spec/stage.md``, shared by the core and API tests.

Each: a request body, the stage container (CPU m, memory Mi), the total with background
containers, and every step's final limit in order (background steps included, at their own value).
"""

from __future__ import annotations

from typing import Any

D: dict[str, Any] = {}  # a step with the default limits


def step(cpu: str, memory: str, **extra: Any) -> dict[str, Any]:
    return {"cpu": cpu, "memory": memory, **extra}


VECTORS: list[dict[str, Any]] = [
    {  # V1: D ; D
        "id": "V1",
        "body": {"stage": [D, D]},
        "container": (500, 600),
        "with_background": (500, 600),
        "limits": [(400, 500), (400, 500)],
    },
    {  # V2: parallel(D, D)
        "id": "V2",
        "body": {"stage": [{"parallel": [D, D]}]},
        "container": (900, 1100),
        "with_background": (900, 1100),
        "limits": [(400, 500), (400, 500)],
    },
    {  # V3: parallel(D, D) ; D -- the sequential step gets the stage value (H5)
        "id": "V3",
        "body": {"stage": [{"parallel": [D, D]}, D]},
        "container": (900, 1100),
        "with_background": (900, 1100),
        "limits": [(400, 500), (400, 500), (800, 1000)],
    },
    {  # V4: parallel(1000m/500Mi, 2000m/3000Mi) ; 3500m/2000Mi
        "id": "V4",
        "body": {"stage": [{"parallel": [step("1000m", "500Mi"), step("2000m", "3000Mi")]}, step("3500m", "2000Mi")]},
        "container": (3600, 3600),
        "with_background": (3600, 3600),
        "limits": [(1250, 500), (2250, 3000), (3500, 3500)],
    },
    {  # V5: parallel(D, D) ; D ; group(D ; D)
        "id": "V5",
        "body": {"stage": [{"parallel": [D, D]}, D, {"group": [D, D]}]},
        "container": (900, 1100),
        "with_background": (900, 1100),
        "limits": [(400, 500), (400, 500), (800, 1000), (800, 1000), (800, 1000)],
    },
    {  # V6: background 3000m/900Mi + parallel(D, D) ; D
        "id": "V6",
        "body": {"stage": [step("3000m", "900Mi", background=True), {"parallel": [D, D]}, D]},
        "container": (900, 1100),
        "with_background": (3900, 2000),
        "limits": [(3000, 900), (400, 500), (400, 500), (800, 1000)],
    },
    {  # V7: D ; D with increase_default_resources
        "id": "V7",
        "body": {"stage": [D, D], "options": {"increase_default_resources": True}},
        "container": (1100, 3100),
        "with_background": (1100, 3100),
        "limits": [(1000, 3000), (1000, 3000)],
    },
]
