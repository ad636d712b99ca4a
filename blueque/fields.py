"""What each field of Blueque's hashes holds: text, a whole number, a number, or a time (Unix
seconds). Redis keeps every value as a string; `blueque ... --json` and the pages that show
times read this table, the one place that knows a field's type (the twin of the type columns of
PROTOCOL.md §3 and §6's listener info table, which ``tests/test_protocol_doc.py`` compares).

A task's options come from ``policy.OPTION_TYPES``, which says how they are validated and
stored; the other fields are listed here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal

from blueque.policy import OPTION_TYPES, field_float

#: text: a string as it is; int: a whole number; number: any number; time: Unix seconds;
#: json: a JSON document (the ``history`` list, a listener's ``task_memory``).
Kind = Literal["text", "int", "number", "time", "json"]

#: The task hash ``blueque_task_[task id]`` (PROTOCOL.md §3). Fields other tools add are text.
TASK_FIELDS: dict[str, Kind] = {
    "status": "text",
    "queue": "text",
    "parameters": "text",
    "result": "text",
    "error": "text",
    "node": "text",
    "pid": "int",
    "created": "time",
    "updated": "time",
    "eta": "time",
    "reclaimed_node": "text",
    "attempts": "int",
    "started_at": "time",
    "finished_at": "time",
    "pid_created": "time",
    "progress": "number",
    "progress_message": "text",
    "cancelled": "time",
    "cancel_requested": "time",
    **{name: "int" if kind is int else "number" for name, kind in OPTION_TYPES.items()},
    "traceback": "text",
    "cancel_reason": "text",
    "last_error": "text",
    "retried": "int",
    "retried_at": "time",
    "preemptions": "int",
    "preempted_at": "time",
    "preempted_reason": "text",
    "history": "json",
    "after": "json",
    "after_any": "int",
    "concurrency_key": "text",
    "requires": "json",
}

#: A listener's info hash ``blueque_listener_[listener id]`` (PROTOCOL.md §6, Registration).
LISTENER_FIELDS: dict[str, Kind] = {
    "host": "text",
    "node": "text",
    "pid": "int",
    "pid_created": "time",
    "queues": "text",
    "concurrency": "int",
    "interval": "number",
    "started": "time",
    "renewed": "time",
    "busy": "int",
    "renewal_seconds": "number",
    "exclusive": "int",
    "preempting_until": "time",
    "task_memory": "json",
    "spool_error": "text",
    "left": "time",
    "resources": "json",
}

#: A task's times, which people read as dates (`blueque show`, the dashboard's task page).
TIME_FIELDS = tuple(name for name, kind in TASK_FIELDS.items() if kind == "time")

#: Where typed() puts the raw text of values that are not of their field's type.
CORRUPT = "corrupt"


def typed(fields: Mapping[str, str], kinds: Mapping[str, Kind] = TASK_FIELDS
          ) -> dict[str, object]:
    """The fields of a hash as JSON wants them: numbers as numbers, times as Unix seconds
    (numbers), text as it is, an empty number as None. A value that is not of its field's type
    (corrupt, or written by hand: ``"abc"``, ``"inf"``) is None too, and its raw text is kept
    under ``"corrupt"``, so that no number comparison ever meets a string and nothing is
    hidden."""
    values: dict[str, object] = {}
    corrupt: dict[str, str] = {}
    for name, raw in fields.items():
        kind = kinds.get(name, "text")
        if kind == "text":
            values[name] = raw
            continue
        values[name] = number = _json(raw) if kind == "json" else _number(raw, kind)
        if number is None and raw != "":
            corrupt[name] = raw
    if corrupt:
        values[CORRUPT] = corrupt
    return values


def _json(raw: str) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _number(raw: str, kind: Kind) -> int | float | None:
    value = field_float(raw)
    if value is None or kind != "int":
        return value
    return int(value) if value.is_integer() else None
