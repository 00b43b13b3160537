"""The service's log lines (service/observability/logs.py): JSON, written in batches of whole lines no
larger than one atomic pipe write, warnings at once, everything on flush; a served request's access
line reaches stderr without any request after it."""

from __future__ import annotations

import io
import logging
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import orjson
from hypothesis import given
from hypothesis import strategies as st

from service.observability.logs import BATCH_BYTES, BatchedLineHandler, JsonFormatter, direct, json_line, timestamp

from ..live import LiveServer


class Writes(io.StringIO):
    """A stream that remembers each write it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


def _logger(stream: Writes) -> tuple[logging.Logger, BatchedLineHandler]:
    handler = BatchedLineHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"test.batched.{id(stream)}")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, handler


def test_info_lines_wait_for_a_batch_or_a_flush() -> None:
    stream = Writes()
    logger, handler = _logger(stream)
    for n in range(5):
        logger.info("request", extra={"http": {"n": n}})
    assert stream.writes == []  # nothing written per line
    handler.flush()
    assert len(stream.writes) == 1
    lines = stream.getvalue().splitlines()
    assert [orjson.loads(line)["http"]["n"] for line in lines] == list(range(5))


def test_a_warning_is_written_at_once_after_what_came_before() -> None:
    stream = Writes()
    logger, _ = _logger(stream)
    logger.info("first")
    logger.warning("second")
    assert [orjson.loads(line)["message"] for line in stream.getvalue().splitlines()] == ["first", "second"]


def test_batches_are_whole_lines_within_one_atomic_pipe_write() -> None:
    stream = Writes()
    logger, handler = _logger(stream)
    for n in range(400):
        logger.info("request %d", n, extra={"http": {"route": "/api/v1/sizing/{org}/{repo}/{workflow}/{job}"}})
    handler.flush()
    assert len(stream.writes) > 1
    for chunk in stream.writes:
        assert chunk.endswith("\n")
        assert len(chunk.encode()) <= BATCH_BYTES
    messages = [orjson.loads(line)["message"] for line in stream.getvalue().splitlines()]
    assert messages == [f"request {n}" for n in range(400)]


def test_a_served_requests_access_line_reaches_stderr_on_its_own(tmp_path: Path) -> None:
    # the served process flushes on a beat: one request and then silence still shows its line
    log = tmp_path / "serve.log"
    with LiveServer(f"sqlite+aiosqlite:///{tmp_path}/db.sqlite", "--log-level", "info", log=log) as server:
        assert httpx.get(f"{server.url}/api/v1/sizing/a/b/c/d", timeout=10).status_code == 200
        deadline = time.monotonic() + 5
        found: list[dict[str, object]] = []
        while time.monotonic() < deadline and not found:
            time.sleep(0.05)
            for line in log.read_text().splitlines():
                if line.startswith("{") and '"ci_sizer.access"' in line:
                    record = orjson.loads(line)
                    if record["http"]["route"] == "/api/v1/sizing/{org}/{repo}/{workflow}/{job}":  # type: ignore[index]
                        found.append(record)
        assert found, log.read_text()


def test_a_direct_access_line_is_the_line_logging_writes() -> None:
    # the service's own configuration: the access line built without a record (middleware) is the
    # same JSON, key for key and in the same order, as the record's through JsonFormatter
    stream = Writes()
    logger, handler = _logger(stream)
    http = {"method": "GET", "route": "/api/v1/sizing/{org}/{repo}/{workflow}/{job}", "status": 200, "duration_ms": 0.5}
    assert direct(logger) is handler
    handler.write(json_line(time.time(), "info", logger.name, "request", {"http": http}) + "\n")
    logger.info("request", extra={"http": http})
    handler.flush()
    built, logged = (orjson.loads(line) for line in stream.getvalue().splitlines())
    assert list(built) == list(logged) == ["ts", "level", "logger", "message", "http"]
    built.pop("ts")
    logged.pop("ts")
    assert built == logged


def test_direct_lines_only_where_logging_would_write_them_alone() -> None:
    stream = Writes()
    logger, handler = _logger(stream)
    assert direct(logger) is handler
    logger.setLevel(logging.WARNING)
    assert direct(logger) is None  # info is off
    logger.setLevel(logging.INFO)
    other = logging.StreamHandler(io.StringIO())
    logger.addHandler(other)
    assert direct(logger) is None  # another handler (a test's capture) sees every record
    logger.removeHandler(other)
    logger.addFilter(lambda record: True)
    assert direct(logger) is None  # a filter sees every record


@given(
    st.floats(min_value=0, max_value=4e9, allow_nan=False) | st.integers(0, 4_000_000_000).map(lambda s: s + 0.9999995)
)
def test_the_kept_second_gives_the_timestamp_datetime_gives(created: float) -> None:
    assert timestamp(created) == datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )
