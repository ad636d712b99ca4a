"""Log set-up for the daemons: readable lines for people, or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys

#: Fields the daemons attach to task transition records (``extra=``).
TASK_FIELDS = ("event", "task_id", "queue", "pid", "attempt", "duration", "outcome", "node",
               "ending")


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


def configure(log_format: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # a library's warning (at the task module's import, say) is a log record too, so that
    # JSON logs stay one object per line
    logging.captureWarnings(log_format == "json")
