"""Log set-up for the daemons: readable lines for people, or one JSON object per line."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
from collections.abc import Iterator

from blueque.display import visible

#: Fields the daemons attach to task transition records (``extra=``).
TASK_FIELDS = ("event", "task_id", "queue", "pid", "attempt", "duration", "outcome",
               "process_end", "node", "ending")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in TASK_FIELDS:
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    """One line a record (an exception's traceback aside): control characters in the message
    (task ids, reasons, errors: anyone's text) written out as ``\\x0a``, ``\\x1b``
    (display.visible), so that none forges a line of the log or drives the terminal of
    whoever tails it."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return visible(super().formatMessage(record), newlines=False)


def configure(log_format: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # a library's warning (at the task module's import, say) is a log record too, so that
    # JSON logs stay one object per line
    logging.captureWarnings(log_format == "json")


class _LineLogger(io.TextIOBase):
    """A text stream whose every line becomes a log record."""

    def __init__(self, logger: logging.Logger, level: int) -> None:
        self._logger, self._level, self._partial = logger, level, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                self._logger.log(self._level, line)
        return len(text)

    def flush(self) -> None:
        if self._partial.strip():
            self._logger.log(self._level, self._partial)
        self._partial = ""


@contextlib.contextmanager
def printed_as_logs(name: str) -> Iterator[None]:
    """What is printed meanwhile (say by a task module at its import: a model loading) is
    logged by ``name``, a line a record, so that a JSON log stays one object per line."""
    out, err = _LineLogger(logging.getLogger(name), logging.INFO), _LineLogger(
        logging.getLogger(name), logging.WARNING)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        out.flush()
        err.flush()
