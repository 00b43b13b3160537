"""Sending a run: one POST bounded in time whatever the server does, retries with backoff within
``--timeout`` in all, the spool a run goes to when the sizer is unreachable, and ``--flush``."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _post_once(url: str, data: bytes, headers: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """One POST: (status, the start of the body), or (None, why it was not answered)."""
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read(300).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(300).decode("utf-8", "replace")
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return None, f"no answer in {timeout:.1f}s"
        return None, reason if isinstance(reason, str) else type(reason).__name__
    except TimeoutError:
        return None, f"no answer in {timeout:.1f}s"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return None, type(exc).__name__


def _post(url: str, data: bytes, headers: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """``_post_once`` that gives up after ``timeout`` seconds whatever the server does (a socket
    timeout bounds each read, not a slow trickle nor name resolution): the request runs in a daemon
    thread that is left behind."""
    answer: list[tuple[int | None, str]] = []
    worker = threading.Thread(target=lambda: answer.append(_post_once(url, data, headers, timeout)), daemon=True)
    worker.start()
    worker.join(timeout)
    return answer[0] if answer else (None, f"no answer in {timeout:.1f}s")


def send(
    url: str,
    token: str | None,
    body: dict[str, Any],
    *,
    retries: int,
    backoff: float,
    timeout: float,
    say: Callable[[str], None],
) -> bool | None:
    """Post a run, for at most ``timeout`` seconds in all, retries and their waits included.
    True: stored (201/200). False: refused for good (4xx: retrying cannot help). None: not reached
    (network, 5xx, 429) before the retries or the time ran out."""
    headers = {"Content-Type": "application/json", "User-Agent": "ci-sizer-collect"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode()
    deadline = time.monotonic() + timeout
    delay = backoff
    for attempt in range(retries + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        status, text = _post(url.rstrip("/") + "/api/v1/runs", data, headers, left)
        if status in (200, 201):
            return True
        if status is not None and status < 500 and status != 429:
            say(f"ci-sizer: the sizer refused the run ({status}): {text}")
            return False
        reason = f"HTTP {status}" if status is not None else text
        left = deadline - time.monotonic()
        if attempt < retries and left > 0:
            say(f"ci-sizer: posting the run failed ({reason}); retrying in {min(delay, left):.1f}s")
            time.sleep(min(delay, left))
            delay *= 2
        else:
            say(f"ci-sizer: posting the run failed ({reason})")
            break
    return None


def spool(directory: Path, body: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"run-{uuid.uuid4().hex}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)  # a spooled file is whole or absent
    return path


def flush(directory: Path, url: str, token: str | None, *, timeout: float, say: Callable[[str], None]) -> int:
    """Send every spooled run (each for at most ``timeout`` seconds); a sent (or refused) one is
    removed. Returns how many remain (an unreadable file is reported and kept). A missing directory
    is a ``ValueError``."""
    if not directory.is_dir():
        raise ValueError(f"--flush {directory}: no such directory")
    remaining = 0
    for path in sorted(directory.glob("run-*.json")):
        try:
            body = json.loads(path.read_text())
        except (OSError, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError
            say(f"ci-sizer: {path.name}: not a spooled run, left in place ({type(exc).__name__}: {exc})")
            remaining += 1
            continue
        outcome = send(url, token, body, retries=0, backoff=0, timeout=timeout, say=say)
        if outcome is None:
            remaining += 1
            continue
        path.unlink()
        say(f"ci-sizer: {'sent' if outcome else 'dropped (refused)'} {path.name}")
    return remaining
