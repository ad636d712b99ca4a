"""A task's ``history`` as its readers see it (PROTOCOL.md 3.2): the entries its field holds,
and, for a finished task, the last ending as its own fields say it (finish.lua writes no entry
for it: the hash holds nothing twice). ``Task.history``, `blueque show` and the dashboard's
task page read it here; lua/lib/history.lua is the scripts' twin (``cut``, ``current_entry``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from blueque.protocol import HISTORY_ERROR_BYTES
from blueque.statuses import CANCELLED, COMPLETE, FINISHED_STATUSES, finish_time


def readable_history(raw: str | None) -> list[dict[str, Any]]:
    """The ``history`` field of a task hash (PROTOCOL.md 3.2): a JSON list of how each run
    ended, oldest first ({attempt, outcome, at, node, pid, started, error, eta, was}). Entries
    that are not JSON objects are left out, and a field that is not a JSON list reads as no
    history: a display never fails on it."""
    try:
        entries = json.loads(raw) if raw else []
    except ValueError:
        return []
    if not isinstance(entries, list):
        return []
    return [entry for entry in entries if isinstance(entry, dict)]


def task_history(data: Mapping[str, str]) -> list[dict[str, Any]]:
    """A task's history (PROTOCOL.md 3.2): its field's entries, then, for a finished task,
    the last ending as its fields say it (finish.lua writes no entry for it: its hash holds
    nothing twice) unless the field ends with that ending already (written by another
    script, or before issue 29)."""
    history = readable_history(data.get("history"))
    current = current_entry(data)
    if current is not None and not _is_ending(history[-1] if history else None, current):
        history.append(current)
    return history


def current_entry(data: Mapping[str, str]) -> dict[str, Any] | None:
    """A finished task's last ending as its fields say it (the history entry finish.lua does
    not write; lua/lib/history.lua's ``current_entry`` is its twin); None for a task that
    has not finished, or that no stamp counted a run of (1.0.1's)."""
    status, attempt = data.get("status"), _number(data.get("attempts"), int)
    if status not in FINISHED_STATUSES or attempt is None:
        return None
    outcome = status if status == COMPLETE or not data.get("cancelled") else CANCELLED
    entry = {"attempt": attempt, "outcome": outcome,
             "at": _number(finish_time(data), float), "node": data.get("node"),
             "pid": _number(data.get("pid"), int),
             "started": _number(data.get("started_at"), float),
             "error": None if outcome == COMPLETE else cut_error(data.get("error"))}
    return {key: value for key, value in entry.items() if value is not None}


def _is_ending(entry: dict[str, Any] | None, current: dict[str, Any]) -> bool:
    """Whether a history entry is the ending ``current`` (from the fields) says: the same
    attempt and outcome, at the same time (the entry's ``at`` is kept to 0.1 ms)."""
    if entry is None or str(entry.get("attempt")) != str(current["attempt"]):
        return False
    at, when = entry.get("at"), current.get("at")
    return (entry.get("outcome") == current["outcome"] and isinstance(at, (int, float))
            and when is not None and abs(at - when) < 0.001)


def _number(raw: str | None, kind: type[int] | type[float]) -> int | float | None:
    try:
        return kind(raw) if raw else None
    except ValueError:
        return None


def cut_error(text: str | None) -> str | None:
    """An error as a history entry keeps it (lua/lib/history.lua's ``cut``): its first
    HISTORY_ERROR_BYTES bytes, cut between UTF-8 characters, then ``...``; None for none."""
    if not text:
        return None
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= HISTORY_ERROR_BYTES:
        return text
    end = HISTORY_ERROR_BYTES
    while end > 0 and 0x80 <= data[end] < 0xC0:
        end -= 1
    return data[:end].decode("utf-8", "replace") + "..."
