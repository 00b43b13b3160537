"""JSON log lines: one object per record, with any structured ``extra`` merged in.

The service writes its lines in batches (``BatchedLineHandler``): one access line per request
written and flushed on its own was a system call per request, about a sixth of a request's CPU on
the build path. Warnings and errors are written at once, the rest within ``FLUSH_SECONDS`` (the
service flushes on that beat, and at exit).
"""

from __future__ import annotations

import logging
import math
import select
from datetime import UTC, datetime
from typing import TextIO

import orjson

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


_second: list[object] = [None, ""]  # the last whole second formatted, and its text


def timestamp(created: float) -> str:
    """``created`` as RFC 3339 UTC to the millisecond (``2026-11-20T10:07:12.345Z``); the text of the
    second is kept, since every line of a second shares it."""
    fraction, whole = math.modf(created)
    micros = round(fraction * 1e6)  # as datetime.fromtimestamp rounds (half to even)
    second = int(whole) + micros // 1_000_000
    if _second[0] != second:
        _second[0], _second[1] = second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{_second[1]}.{micros % 1_000_000 // 1000:03d}Z"


def json_line(created: float, level: str, logger: str, message: str, extra: dict[str, object]) -> str:
    """One record as its JSON line (without the newline): the one place its shape is written."""
    out: dict[str, object] = {
        "ts": timestamp(created),
        "level": level,
        "logger": logger,
        "message": message,
        **extra,
    }
    return orjson.dumps(out, default=str).decode()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = {key: value for key, value in record.__dict__.items() if key not in _STANDARD}
        if record.exc_info:
            extra["exception"] = self.formatException(record.exc_info)
        return json_line(record.created, record.levelname.lower(), record.name, record.getMessage(), extra)


#: the longest an info line waits in a batch
FLUSH_SECONDS = 0.25
#: a batch is written whole when it reaches this size: at most one pipe buffer's atomic write, so that
#: the lines of several workers sharing one stderr pipe never interleave within a line
BATCH_BYTES = select.PIPE_BUF


class BatchedLineHandler(logging.Handler):
    """Formats each record at once and writes lines to ``stream`` in batches of whole lines: when a
    batch reaches ``BATCH_BYTES``, for a warning or worse, and on ``flush()``."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self._lines: list[str] = []
        self._size = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        self._append(line)
        if record.levelno >= logging.WARNING:
            self._write()

    def write(self, line: str) -> None:
        """A line already formatted (``direct``), batched as an info record's."""
        self.acquire()
        try:
            self._append(line)
        finally:
            self.release()

    def _append(self, line: str) -> None:
        """Add a line to the batch, first writing the batch if the line would take it past BATCH_BYTES."""
        if self._size + len(line) > BATCH_BYTES:
            self._write()
        self._lines.append(line)
        self._size += len(line)

    def flush(self) -> None:
        self.acquire()
        try:
            self._write()
        finally:
            self.release()

    def _write(self) -> None:
        if not self._lines:
            return
        lines, self._lines, self._size = self._lines, [], 0
        try:
            self.stream.write("".join(lines))
            self.stream.flush()
        except Exception:
            pass  # as logging does: a log line that cannot be written is not the service's failure


def direct(logger: logging.Logger, level: int = logging.INFO) -> BatchedLineHandler | None:
    """The service's own handler when ``logger``'s records at ``level`` go to it alone, formatted by
    ``JsonFormatter``, with no filter on the way (the configuration ``configure(batched=True)`` makes):
    a line built with ``json_line`` and given to its ``write`` is then what logging would have written,
    without a record made and formatted (about a tenth of a request's CPU on the build path). None
    otherwise (another configuration, a test capturing records): log as usual."""
    if not logger.isEnabledFor(level):
        return None
    found: BatchedLineHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if (
                found is not None
                or type(handler) is not BatchedLineHandler
                or handler.filters
                or level < handler.level
                or type(handler.formatter) is not JsonFormatter
            ):
                return None
            found = handler
        current = current.parent if current.propagate else None
    return found


def flush() -> None:
    """Write the lines the root logger's batching handlers hold (the service calls it every
    ``FLUSH_SECONDS``); other handlers are left to flush as they do."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, BatchedLineHandler):
            handler.flush()


def configure(level: str, *, batched: bool = False) -> None:
    """JSON lines on stderr at ``level``; ``batched`` for the service (which flushes on a beat), else
    each line written at once (a command's lines stay in order with what it prints)."""
    import sys

    handler = BatchedLineHandler(sys.stderr) if batched else logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    # what JsonFormatter never shows, not gathered per record (the logging HOWTO's "Optimization")
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
