"""A shutdown that ends within the pod's grace period, whatever the database or a task does.

Kubernetes sends one SIGTERM, waits ``terminationGracePeriodSeconds`` (30 s in
deploy/kubernetes/base/deployment.yaml), then kills. A stop has three phases, each bounded here:

1. uvicorn drains: it stops accepting, closes idle connections and lets requests in flight
   finish, for at most ``DRAIN_SECONDS`` (its ``timeout_graceful_shutdown``; an ingest that waits
   on a slow database gives up at ``CI_SIZER_INGEST_TIMEOUT_SECONDS``, 10 s by default, too);
2. the app's lifespan stops its background tasks and writes what it holds (``stop_tasks``,
   ``bounded``), within ``SHUTDOWN_SECONDS`` in all;
3. the interpreter exits (it joins worker threads and the default executor's, without a bound).

A process that ``ci-sizer serve`` runs also arms ``exit_after`` when phase 2 starts: should phases
2 and 3 together outlast ``SHUTDOWN_SECONDS + EXIT_SECONDS`` (a task that ignores its
cancellation, a thread that does not return), the process says so in the log and ends itself, so
Kubernetes never has to kill it, and the supervisor of several workers, which waits for each,
ends too. ``DRAIN_SECONDS + SHUTDOWN_SECONDS + EXIT_SECONDS`` stays under the grace period
(tests/observability/test_shutdown.py reads it from the Deployment).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Collection
from typing import Any

log = logging.getLogger("ci_sizer.shutdown")

#: uvicorn's ``timeout_graceful_shutdown``: requests in flight get this long to finish
DRAIN_SECONDS = 10.0
#: the lifespan's own shutdown: background tasks stopped, the last writes, the pools closed
SHUTDOWN_SECONDS = 10.0
#: what the interpreter's exit may take after that before the process ends itself
EXIT_SECONDS = 5.0
#: of SHUTDOWN_SECONDS: background tasks to end once cancelled
TASKS_SECONDS = 2.0
#: of SHUTDOWN_SECONDS: the last fleet totals and retention pass
WRITES_SECONDS = 3.0
#: of SHUTDOWN_SECONDS: each of the connection pools to close
CLOSE_SECONDS = 2.5
#: the exit status of a process that ended itself past its shutdown budget
OVERRUN_EXIT_STATUS = 70


def uvicorn_settings() -> dict[str, Any]:
    """What ``ci-sizer serve`` gives uvicorn to bound phase 1."""
    return {"timeout_graceful_shutdown": DRAIN_SECONDS}


async def stop_tasks(tasks: Collection[asyncio.Task[Any]], seconds: float = TASKS_SECONDS) -> set[asyncio.Task[Any]]:
    """Cancel ``tasks`` and wait at most ``seconds`` for them to end; those still running (a task
    that swallowed its cancellation) are logged by name and returned, left behind rather than
    waited for. A task that ended with an error is logged too."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return set()
    done, pending = await asyncio.wait(tasks, timeout=seconds)
    for task in done:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("background task %s ended with %s: %s", task.get_name(), type(exc).__name__, exc)
    for task in pending:  # one that swallowed its cancellation, or still closing a connection to a hung database
        log.warning(
            "background task %s did not stop within %gs of its cancellation; the shutdown goes on without it",
            task.get_name(),
            seconds,
        )
    return pending


async def bounded(step: Awaitable[object], seconds: float, what: str) -> bool:
    """``await step`` for at most ``seconds``; past that it is cancelled, logged, and the shutdown
    goes on. Whether it finished."""
    try:
        async with asyncio.timeout(seconds):
            await step
    except TimeoutError:
        log.warning("shutdown: %s did not finish within %gs; going on without it", what, seconds)
        return False
    return True


def exit_after(seconds: float, flush: Any = None) -> threading.Timer:
    """End the process (``os._exit``) if it still runs ``seconds`` from now: a daemon timer thread,
    which neither a blocked event loop nor the interpreter's join of other threads holds up.
    ``flush`` (the log's) is called first, after the line that says why."""

    def overrun() -> None:
        log.error("shutdown did not finish within %gs: the process ends itself", seconds)
        if flush is not None:
            flush()
        os._exit(OVERRUN_EXIT_STATUS)

    timer = threading.Timer(seconds, overrun)
    timer.daemon = True
    timer.name = "ci-sizer-shutdown-deadline"
    timer.start()
    return timer
