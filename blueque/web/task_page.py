"""What a task's dashboard page shows: its hash, how each run ended, its parents and
dependents, its checkpoint's size and the output of one attempt, read through the store as
plain dicts for task.html."""

from __future__ import annotations

import math
from typing import Any

from blueque import dependencies
from blueque.errors import CorruptTask
from blueque.fields import TIME_FIELDS
from blueque.history import task_history
from blueque.policy import field_float
from blueque.statuses import finish_time, state_of
from blueque.store import RedisStore
from blueque.tails import read_outputs
from blueque.task import CheckpointInfo
from blueque.web.views import task_row

#: Parents and dependents listed on a task page (with their states: one pipeline).
RELATIVES_SHOWN = 50
#: Characters of parameters, result and traceback shown on a task page (the page is fetched
#: again at every live refresh; `blueque show ID --json` prints everything).
SHOWN_CHARS = 65536


def task_page(store: RedisStore, task_id: str, at: float, attempt: str | None = None
              ) -> dict[str, Any] | None:
    """The task's hash, and the output of ``attempt`` (default: the newest attempt's) with
    the attempts whose output Redis holds (5.19)."""
    data = store.task_data_many([task_id])[0]  # a key that is no hash reads as no task
    if not data:
        return None
    fields = []
    for name in sorted(set(data) - {"history"}):  # the history has a table of its own
        stamp = field_float(data[name]) if name in TIME_FIELDS else None
        fields.append({"name": name, "value": data[name], "time": stamp,
                       "above": SHOWN_ABOVE.get(name)})
    row = task_row(task_id, data, at)
    row.update(
        fields=fields,
        times={**{name: field_float(data.get(name)) for name in TIME_FIELDS},
               "finished_at": field_float(finish_time(data))},
        attempts=data.get("attempts") or "0",
        attempts_text=attempts_text(data),
        error=data.get("error") or "",
        traceback=_shown(data.get("traceback") or ""),
        last_error=data.get("last_error") or "",
        result=_shown(data.get("result")),
        parameters=_shown(data.get("parameters") or ""),
        queue=data.get("queue") or "",
        node=data.get("node") or "",
        cancelled=bool(data.get("cancelled")),
        cancel_requested=bool(data.get("cancel_requested")),
        history=[history_row(entry) for entry in task_history(data)],
    )
    try:  # its size, time and attempt (HMGET): the state itself stays in Redis (5.20)
        row.update(checkpoint=CheckpointInfo.parse(task_id, store.checkpoint_info(task_id)))
    except CorruptTask:
        row.update(checkpoint=None)
    row.update(relatives(store, task_id, data))
    outputs, newest = read_outputs(store, task_id)  # the output tails (5.19)
    shown = attempt if attempt in outputs else newest
    output = outputs.get(shown or "")
    text, folded = fold_traceback(output.text if output else None, data.get("traceback"),
                                  shown == data.get("attempts"))
    row.update(output=text, output_folded=folded,
               output_attempt=output.attempt if output else None,
               output_ended=output.ended if output else False,
               output_attempts=list(outputs), newest_output=newest)
    return row


#: Fields of the task hash a task page shows in a panel of their own: the "every field"
#: table points there instead of showing them a second time (a traceback was on the page
#: three times).
SHOWN_ABOVE = {"traceback": "traceback", "parameters": "parameters", "result": "result",
               "error": "error"}


def fold_traceback(output: str | None, traceback: str | None, current: bool
                   ) -> tuple[str | None, bool]:
    """The output of the task's current attempt without the traceback its process wrote last
    (the page shows it under Error), and whether it was taken off."""
    if output is None or not traceback or not current:
        return output, False
    body, tail = output.rstrip("\n"), traceback.rstrip("\n")
    if not tail or not body.endswith(tail):
        return output, False
    return body[: len(body) - len(tail)], True


def attempts_text(data: dict[str, str]) -> str:
    """The attempts card: ``1 of 3``; what an operator's retries added to the allowed ones
    (``4 (2 allowed, then 2 operator retries)``: each retry runs it once more, its attempts
    kept), and the preempted runs that do not count."""
    runs = data.get("attempts") or "0"
    allowed = data.get("max_attempts") or "1"
    retried = _count(data.get("retried"))
    preempted = _count(data.get("preemptions"))
    if not retried and not preempted:
        return f"{runs} of {allowed}"
    said = [f"{allowed} allowed"]
    if retried:
        said[0] += f", then {retried} operator retr{'y' if retried == 1 else 'ies'}"
    if preempted:
        said.append(f"{preempted} preempted, not counted")
    return f"{runs} ({'; '.join(said)})"


def _count(raw: str | None) -> int:
    return int(raw) if raw and raw.isdigit() else 0


def relatives(store: RedisStore, task_id: str, data: dict[str, str]) -> dict[str, Any]:
    """A task's parents (what it was enqueued after) and its dependents not yet told of its
    ending, each with its state, RELATIVES_SHOWN of each (PROTOCOL.md 5.21)."""
    parents = dependencies.after_of(data)
    children = store.perform(dependencies.dependents, task_id)
    awaited = set(store.perform(dependencies.awaited, task_id)) if parents else set()
    shown = parents[:RELATIVES_SHOWN] + children[:RELATIVES_SHOWN]
    states = [state_of(d) or "(missing)" for d in store.task_data_many(shown)]
    rows = [{"id": i, "state": s, "awaited": i in awaited}
            for i, s in zip(shown, states, strict=True)]
    cut = len(parents[:RELATIVES_SHOWN])
    return {"parents": rows[:cut], "parents_total": len(parents),
            "dependents": rows[cut:], "dependents_total": len(children),
            "after_any": data.get("after_any") == "1"}


def history_row(entry: dict[str, Any]) -> dict[str, Any]:
    """One entry of a task's history (PROTOCOL.md 3.2) as the task page shows it."""
    at, started = _entry_number(entry.get("at")), _entry_number(entry.get("started"))
    return {"attempt": entry.get("attempt"), "outcome": str(entry.get("outcome") or "?"),
            "at": at, "ran": None if at is None or started is None else max(0.0, at - started),
            "node": entry.get("node") or "", "pid": entry.get("pid"),
            "error": str(entry.get("error") or ""), "eta": _entry_number(entry.get("eta")),
            "was": entry.get("was") or ""}


def _entry_number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _shown(text: str | None) -> str | None:
    if text is None or len(text) <= SHOWN_CHARS:
        return text
    return text[:SHOWN_CHARS] + f"\n... ({len(text) - SHOWN_CHARS} more characters not shown)"
