"""Large ingest bodies, parsed and reduced in a worker process.

A run may carry up to 64 x 100,000 CPU samples. Parsing such a body (orjson), validating it
(pydantic) and reducing its samples to the six stats (rule I2) are each one long call that holds
the interpreter lock, so a worker thread would not free the event loop: a 9 MB body stalled every
other request for most of half a second. From ``MIN_BYTES`` on, the body goes to a worker
process instead, which answers with the same document in which each valid run's samples are
replaced by their six stats. The route then validates that small document as it would any run
posted with stats: the answer, the stored run and its content hash (computed from the stats) are
the same as if the samples had been reduced in the route.

A body that is not valid is judged in the worker too, as the route would judge it (orjson, then the
standard library's parser for what orjson refuses, as FastAPI does, then the model): the worker
answers its errors (``Invalid``), a batch's bad runs each by its index, and the route answers them
without parsing the body again on the event loop. The worker is started at the first large body, and
again after it dies (a crash, an out-of-memory kill): one body is retried in the new worker, and only
if that one dies too is the body parsed on the loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from service.runs.schemas import RunCreate, RunsBatchCreate
from service.wire import STAT_NAMES

log = logging.getLogger("ci_sizer.runs")

#: Bodies from this size on are parsed and reduced in the worker process.
MIN_BYTES = 256 * 1024


@dataclass(frozen=True)
class Invalid:
    """What is wrong with a body or a batch's run, as pydantic reports it (``loc`` relative to it)."""

    errors: list[dict[str, Any]]


def invalid_of(exc: ValidationError) -> Invalid:
    return Invalid(
        [
            {"loc": e["loc"], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_context=False, include_input=False)
        ]
    )


def _parsed(body: bytes) -> Any:
    """The body's JSON as the route parses it: orjson, else the standard library (``NaN``, integers past
    64 bits), else an ``Invalid`` as FastAPI reports a body that is no JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        pos = exc.pos if isinstance(exc, json.JSONDecodeError) else exc.start
        return Invalid([{"loc": (pos,), "msg": "JSON decode error", "type": "json_invalid"}])


def _reduced(raw: Any, *, whole: bool = False) -> Any:
    """``raw`` with each container's samples replaced by their stats, if it is a valid run; else its
    errors (``Invalid``). ``whole``: the run is the whole body, validated as FastAPI validates a body
    (a body that is no object says so in FastAPI's words); else a batch's item, as the route does."""
    try:
        run = RunCreate.model_validate(raw, from_attributes=whole or None)
    except ValidationError as exc:
        return invalid_of(exc)
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
    """In the worker: the parsed run with its samples reduced, or its errors (``Invalid``)."""
    raw = _parsed(body)
    return raw if isinstance(raw, Invalid) else _reduced(raw, whole=True)


def reduce_batch(body: bytes) -> Any:
    """In the worker: the parsed batch with the samples of each valid run reduced and each invalid run
    replaced by its errors (``Invalid``, answered by its index), or the batch's own errors."""
    raw = _parsed(body)
    if isinstance(raw, Invalid):
        return raw
    try:
        RunsBatchCreate.model_validate(raw, from_attributes=True)
    except ValidationError as exc:
        return invalid_of(exc)
    return raw | {"runs": [_reduced(item) for item in raw["runs"]]}


def _pid() -> int:
    return os.getpid()


class Reducer:
    """One worker process, started at the first large body and stopped with the app; started again
    when it died."""

    def __init__(self) -> None:
        self._executor: ProcessPoolExecutor | None = None

    def _started(self) -> ProcessPoolExecutor:
        if self._executor is None:
            # spawn: a fresh interpreter, never a fork of a process with running threads
            self._executor = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._executor

    async def run(self, reduce: Any, body: bytes) -> Any:
        """``reduce(body)`` in the worker; a worker that died is replaced and the body tried once more."""
        loop = asyncio.get_running_loop()
        executor = self._started()
        try:
            return await loop.run_in_executor(executor, reduce, body)
        except BrokenProcessPool:
            log.warning("the worker that parses large bodies died; starting another one")
            if self._executor is executor:
                executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
        return await loop.run_in_executor(self._started(), reduce, body)

    @property
    def running(self) -> bool:
        """Whether a worker was started (and not stopped)."""
        return self._executor is not None

    async def pid(self) -> int:
        """The worker's process id (it is started if it was not)."""
        return int(await asyncio.get_running_loop().run_in_executor(self._started(), _pid))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def errors_of(invalid: Invalid, prefix: tuple[Any, ...]) -> list[dict[str, Any]]:
    """``invalid``'s errors with their ``loc`` under ``prefix`` (``("body",)``, ``("body", "runs", 3)``)."""
    return [{**e, "loc": (*prefix, *e["loc"])} for e in invalid.errors]
