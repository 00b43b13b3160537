"""The JSON patch (RFC 6902) that gives a pod its job's answer: only the containers the answer names,
with the rules every format keeps (``service/sizing/formats.py``, docs/integrations/README.md).

- The runner's main container is sized from the job's main recorded container (``formats.main_container``:
  ``build``, else the only one, else the first); any other container from the recorded container of its
  name (Tekton's ``step-NAME``/``sidecar-NAME`` from ``NAME``). A container the answer does not name
  keeps what the runner gave it.
- Sidecars: a native sidecar (an init container with ``restartPolicy: Always``, which runs beside the
  build) is sized like a container; a plain init container, which runs to completion before it, never is.
- ``fit_cpu`` (``service/sizing/fit.py``): the CPU limit the pod's container already has is the kept
  limit, so the CPU request written is never above it; the answer's own CPU limit is written only where
  it is enforced (rule S17). Memory request and limit are the answer's. Only ``cpu`` and ``memory`` are
  written: other resources (GPUs, ephemeral storage) and ``claims`` stay as they were.
- Growth (issue 40): a container whose answer may grow gets ``resizePolicy`` (``resize_policy()``), so
  that the guard can resize it in place; never on an init container (the API server refuses it there
  before Kubernetes 1.33) nor on a Windows pod.

Runner ceilings (``service/sizing/ceilings.py``) are applied by the sizer to the answer itself, before
it reaches the webhook.
"""

from __future__ import annotations

from typing import Any

from service.quantity import parse_cpu_millicores
from service.sizing.answer import Answer, Container
from service.sizing.fit import resize_policy
from service.sizing.formats import UNSEEN, main_container, resources
from service.webhook.identity import Identified, Pod


def merged_resources(current: dict[str, Any] | None, sized: Container) -> dict[str, Any]:
    """The container's ``resources`` with the answer's CPU and memory, everything else kept."""
    current = dict(current or {})
    limits = dict(current.get("limits") or {})
    kept = parse_cpu_millicores(str(limits["cpu"])) if "cpu" in limits else None
    written = resources(sized, kept)
    current["requests"] = {**(current.get("requests") or {}), **written["requests"]}
    current["limits"] = {**limits, **written["limits"]}
    return current


def plan(pod: Pod, answer: Answer, who: Identified) -> list[dict[str, Any]]:
    """The operations, in the order of the pod's containers; empty when the answer names none of them.
    A quantity the pod holds that does not parse raises ``QuantityError``."""
    recorded = [c for c in answer.containers if c.name != UNSEEN]
    if not recorded:
        return []
    main = main_container(recorded)
    by_name = {c.name: c for c in recorded}
    spec = pod.get("spec") or {}
    windows = ((spec.get("os") or {}).get("name")) == "windows"
    ops: list[dict[str, Any]] = []
    for field in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(field) or []):
            if field == "initContainers" and c.get("restartPolicy") != "Always":
                continue  # runs to completion before the build: not what was recorded
            name = str(c.get("name", ""))
            sized = main if name == who.main else by_name.get(who.recorded(name))
            if sized is None:
                continue
            where = f"/spec/{field}/{i}"
            ops.append(
                {"op": "add", "path": f"{where}/resources", "value": merged_resources(c.get("resources"), sized)}
            )
            if sized.grow is not None and field == "containers" and not windows:
                ops.append({"op": "add", "path": f"{where}/resizePolicy", "value": resize_policy()})
    return ops
