"""Large ingest bodies, parsed and reduced in a worker process.

A run may carry up to 64 x 100,000 CPU samples. Parsing such a body (orjson), validating it
(pydantic) and reducing its samples to the six stats (rule I2) are each one long call that holds
the interpreter lock, so a worker thread would not free the event loop: a 9 MB body stalled every
other request for most of half a second. From ``MIN_BYTES`` on, the body goes to a worker
process instead, which answers with the same document in which each valid run's samples are
replaced by their six stats. The route then validates that small document as it would any run
posted with stats: the answer, the stored run and its content hash (computed from the stats) are
the same as if the samples had been reduced in the route. A body the worker cannot parse, or a
single run that does not validate, is left to the route's own parsing, so every error answer
stays what it was.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import orjson
from pydantic import ValidationError

from service.runs.schemas import RunCreate
from service.wire import STAT_NAMES

#: Bodies from this size on are parsed and reduced in the worker process.
MIN_BYTES = 256 * 1024


def _reduced(raw: Any) -> Any:
    """``raw`` with each container's samples replaced by their stats, if it is a valid run; else
    ``raw`` as it is (its errors are answered on the loop)."""
    if not isinstance(raw, dict):
        return raw
    try:
        run = RunCreate.model_validate(raw)
    except ValidationError:
        return raw
    from service.runs.service import reduce_cpu

    containers = []
    for c, valid in zip(raw["containers"], run.containers, strict=True):
        if valid.cpu_samples_millicores is None:
            containers.append(c)
            continue
        stats = dict(zip(STAT_NAMES, reduce_cpu(valid), strict=True))
        containers.append(
            {k: v for k, v in c.items() if k != "cpu_samples_millicores"} | {"cpu_stats_millicores": stats}
        )
    return raw | {"containers": containers}


def reduce_run(body: bytes) -> Any:
    """In the worker: the parsed run with its samples reduced, or ``None`` when the body does not
    parse or is not a valid run (the route then parses it itself and answers its error)."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    reduced = _reduced(raw)
    return None if reduced is raw else reduced


def reduce_batch(body: bytes) -> Any:
    """In the worker: the parsed batch with the samples of each valid run reduced (an invalid run
    stays as it was, to be answered by index), or ``None`` when the body does not parse."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(raw, dict) and isinstance(raw.get("runs"), list):
        return raw | {"runs": [_reduced(item) for item in raw["runs"]]}
    return raw


class Reducer:
    """One worker process, started at the first large body and stopped with the app."""

    def __init__(self) -> None:
        self._executor: ProcessPoolExecutor | None = None

    async def run(self, reduce: Any, body: bytes) -> Any:
        if self._executor is None:
            # spawn: a fresh interpreter, never a fork of a process with running threads
            self._executor = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return await asyncio.get_running_loop().run_in_executor(self._executor, reduce, body)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
