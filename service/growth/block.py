"""The answer's ``grow`` block for one container (docs/integrations/growth.md, the wire contract §1), and
where the guard learns it: a JSON answer the recipe saved (``--answer FILE``), else one GET of the JSON
answer from the sizer, bounded in time like the recipes' ``curl --max-time 2``.

Nothing here raises: a block that cannot be learnt is ``None`` and one line says why."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

PAGE = 4096
MIB = 1 << 20
#: the unknown phase's single entry (rule S6), and what a degraded answer may carry
UNSEEN = "*"


@dataclass(frozen=True)
class GrowBlock:
    """How far a run may grow: ``max_bytes`` at most, by ``step_bytes`` at least each time, when the
    working set reaches ``threshold_percent`` of the limit in force at that moment."""

    max_bytes: int
    threshold_percent: int
    step_bytes: int

    @classmethod
    def from_wire(cls, block: Mapping[str, Any]) -> GrowBlock:
        """The three numbers the guard reads (contract §1); ValueError names a field that is not one."""
        values = {k: block.get(k) for k in ("max_bytes", "threshold_percent", "step_bytes")}
        for key, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"grow.{key} is {value!r}, not a positive integer")
        if not 50 <= values["threshold_percent"] <= 99:  # type: ignore[operator]
            raise ValueError(f"grow.threshold_percent is {values['threshold_percent']}, not 50..99")
        # the kernel keeps limits in whole pages, rounded down: a maximum it could never reach
        # would be asked for again and again
        return cls(values["max_bytes"] // PAGE * PAGE, values["threshold_percent"], values["step_bytes"])  # type: ignore[operator,arg-type]

    def threshold_bytes(self, limit: int) -> int:
        return limit * self.threshold_percent // 100

    def next_target(self, use: int, limit: int) -> int | None:
        """The limit to ask for when ``use`` bytes are in use under ``limit``, or None (below the
        threshold, or at the maximum). At least one step, more when use already ran past the
        threshold of the next one, whole MiB, never past the maximum."""
        if limit >= self.max_bytes or use * 100 < limit * self.threshold_percent:
            return None
        target = limit + self.step_bytes
        while use * 100 >= target * self.threshold_percent and target < self.max_bytes:
            target += self.step_bytes
        return min(self.max_bytes, -(-target // MIB) * MIB)


@dataclass(frozen=True)
class Plan:
    """What the answer says for the guarded container: its grow block and the memory limit it starts at."""

    container: str  #: the answer's entry it came from (the container's name, or ``*``)
    block: GrowBlock
    limit_bytes: int | None


def plan_from_answer(answer: Any, container: str) -> tuple[Plan | None, str]:
    """The plan for ``container`` from a JSON answer: its own entry, else the unknown phase's ``*``
    entry. (None, why) when there is none, or its ``grow`` is null."""
    entries = answer.get("containers") if isinstance(answer, dict) else None
    if not isinstance(entries, list):
        return None, "the answer has no containers list (is it the JSON format?)"
    by_name = {e.get("name"): e for e in entries if isinstance(e, dict)}
    entry = by_name.get(container, by_name.get(UNSEEN))
    if entry is None:
        return None, f"the answer has no entry for container {container!r} (it has {sorted(map(str, by_name))})"
    if "grow" not in entry:
        return None, "the answer has no grow block (a sizer from before growth)"
    block = entry["grow"]
    if block is None:
        return None, f"the answer says {entry['name']!r} must not grow (grow: null)"
    if not isinstance(block, dict):
        return None, f"the answer's grow block for {entry['name']!r} is not an object"
    try:
        grow = GrowBlock.from_wire(block)
    except ValueError as exc:
        return None, f"the answer's {exc}"
    memory = entry.get("memory")
    limit = memory.get("limit_bytes") if isinstance(memory, dict) else None
    return Plan(entry["name"], grow, limit if isinstance(limit, int) and limit > 0 else None), ""


def sizing_url(base: str, org: str, repo: str, workflow: str, job: str) -> str:
    """The JSON answer's address: each name one percent-encoded path segment (rule O6: ``/`` is ``%2F``)."""
    segments = "/".join(quote(s, safe="") for s in (org, repo, workflow, job))
    return f"{base.rstrip('/')}/api/v1/sizing/{segments}"


def _get_json(url: str, token: str | None, timeout: float) -> Any:
    headers = {"Accept": "application/json", "User-Agent": "ci-sizer-collect"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
        return json.loads(r.read(1 << 20))


def fetch_answer(url: str, token: str | None, timeout: float) -> Any:
    """GET the JSON answer within ``timeout`` seconds whatever the server does (a socket timeout
    bounds each read, not a slow trickle nor name resolution): the request runs in a daemon thread
    that is left behind. Raises TimeoutError, OSError (URLError, HTTPError) or ValueError."""
    box: list[Any] = []

    def get() -> None:
        try:
            box.append((True, _get_json(url, token, timeout)))
        except Exception as exc:  # handed to the caller's thread
            box.append((False, exc))

    worker = threading.Thread(target=get, daemon=True)
    worker.start()
    worker.join(timeout)
    if not box:
        raise TimeoutError(f"no answer in {timeout:.1f}s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


def learn(
    *,
    answer_file: Path | None,
    url: str | None,
    token: str | None,
    names: tuple[str, str, str, str],
    container: str,
    timeout: float,
    say: Callable[[str], None],
) -> Plan | None:
    """The plan from ``answer_file`` when given, else from the sizer at ``url``; None (and one line)
    when neither gives one."""
    where = str(answer_file) if answer_file is not None else "the sizer"
    try:
        if answer_file is not None:
            answer = json.loads(answer_file.read_text())
        elif url:
            answer = fetch_answer(sizing_url(url, *names), token, timeout)
        else:
            say("ci-sizer: --grow needs --answer FILE or --url (CI_SIZER_URL); the build runs without growth")
            return None
    except urllib.error.HTTPError as exc:
        say(f"ci-sizer: growth is off: the sizer answered {exc.code} for the grow block; the build runs without growth")
        return None
    except (OSError, ValueError) as exc:  # TimeoutError, URLError, JSONDecodeError, UnicodeDecodeError
        say(
            f"ci-sizer: growth is off: no answer from {where} ({type(exc).__name__}: {exc}); the build runs without growth"
        )
        return None
    plan, why = plan_from_answer(answer, container)
    if plan is None:
        say(f"ci-sizer: growth is off: {why}; the build runs without growth")
    return plan
