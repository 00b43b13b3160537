"""JSON log lines: one object per record, with any structured ``extra`` merged in.

The service writes its lines in batches (``BatchedLineHandler``): one access line per request
written and flushed on its own was a system call per request, about a sixth of a request's CPU on
the build path. Warnings and errors are written at once, the rest within ``FLUSH_SECONDS`` (the
service flushes on that beat, and at exit).
"""

from __future__ import annotations

import logging
import select
from datetime import UTC, datetime
from typing import TextIO

import orjson

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


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
        if self._size + len(line) > BATCH_BYTES:
            self._write()
        self._lines.append(line)
        self._size += len(line)
        if record.levelno >= logging.WARNING:
            self._write()

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


def flush() -> None:
    """Write what the root logger's handlers hold (the service calls it every ``FLUSH_SECONDS``)."""
    for handler in logging.getLogger().handlers:
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
