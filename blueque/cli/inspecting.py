"""Commands that read: `status` (its own module, status.py), `tasks`, `show`, `logs`."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from blueque.cli.base import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    Commands,
    Failure,
    emit,
    json_text,
    known_queue,
    positive_duration,
    task_json,
    with_finish_time,
)
from blueque.cli.status import cmd_status
from blueque.client import Client
from blueque.display import (
    SHOWN_CHARACTERS,
    cut_value,
    format_bytes,
    format_seconds,
    format_time,
    last_line,
    positive_int,
    shorten,
    table,
    visible,
)
from blueque.errors import TaskNotFound
from blueque.fields import TIME_FIELDS
from blueque.history import task_history
from blueque.jobs import JobCall, read_job_call
from blueque.keyed import KeyState
from blueque.policy import field_float
from blueque.statuses import (
    FINISHED_STATUSES,
    RESERVED,
    SCHEDULED,
    STARTED,
    STATES,
    WAITING,
    state_of,
)
from blueque.tails import follow_output, read_output, wait_for_output
from blueque.task import Task


def register(commands: Commands) -> None:
    sub = commands.add("status", cmd_status, "queues with counts per state, listeners with "
                       "their leases and busy slots, and whether Redis may evict Blueque's keys "
                       "(its maxmemory-policy)", role="inspector")
    sub.add_argument("--watch", nargs="?", type=positive_duration, const=2.0,
                     metavar="SECONDS", help="show it again every SECONDS (default 2) until "
                     "Ctrl-C: redrawn on a terminal, else one snapshot after the other (with "
                     "--json, one JSON document a line)")
    sub = commands.add("tasks", cmd_tasks, "list the tasks of a queue", role="inspector")
    sub.add_argument("queue")
    sub.add_argument("--status", choices=STATES,
                     help="only tasks in this state (cancelled: failed tasks that were "
                          "cancelled, listed apart)")
    sub.add_argument("--limit", type=positive_int, default=20,
                     help="at most N per state (default 20)")
    sub = commands.add("show", cmd_show,
                       "every field of one task, and its checkpoint's size and age",
                       role="inspector")
    sub.add_argument("task_id")
    sub.add_argument("--checkpoint", action="store_true",
                     help="print the task's checkpoint (its saved state) instead")
    sub.add_argument("--full", action="store_true",
                     help=f"print every field whole (longer than {SHOWN_CHARACTERS:,} "
                          "characters, a value is cut, and says its length; --json never cuts)")
    sub = commands.add("logs", cmd_logs, "a task's output (stdout and stderr), read from Redis",
                       role="inspector")
    sub.add_argument("task_id")
    sub.add_argument("--attempt", type=positive_int,
                     help="which attempt (default: the newest)")
    sub.add_argument("--follow", "-f", action="store_true",
                     help="print what the attempt writes until it ends (waits for a task "
                          "that has not started yet)")


# --- tasks ------------------------------------------------------------------------------------
def cmd_tasks(client: Client, args: argparse.Namespace) -> int:
    queue = client.get_queue(known_queue(client, args.queue))
    ids: list[str] = []
    for status in [args.status] if args.status else list(STATES):
        ids += queue.task_ids(status, 0, args.limit - 1)[: args.limit]
    datas = client.store.task_data_many(ids)
    tasks = [{"id": i, **d} for i, d in zip(ids, datas, strict=True)]
    current = client.store.now()
    calls = [read_job_call(t.get("parameters")) for t in tasks]
    jobs = any(calls)  # a JOB column only where a registry's tasks are listed
    rows = [(t["id"], state_of(t) or "(missing)", t.get("attempts", "-"), _progress_text(t),
             format_time(field_float(t.get("updated"))), _eta_text(t, current),
             t.get("node") or "-", *([call.name if call else "-"] if jobs else []),
             shorten(last_line(t.get("error")) or t.get("result") or t.get("parameters"),
                     48))
            for t, call in zip(tasks, calls, strict=True)]
    text = table(("ID", "STATUS", "ATTEMPTS", "PROGRESS", "UPDATED", "ETA", "NODE",
                  *(["JOB"] if jobs else []), "RESULT/ERROR/PARAMETERS"),
                 rows) if rows else f"no tasks in {args.queue}"
    emit(args, [{**task_json(i, d), **_job_of(c)}
                for i, d, c in zip(ids, datas, calls, strict=True)], text)
    return EXIT_OK


def _job_of(call: JobCall | None) -> dict[str, str]:
    """What --json adds for a task a blueque.Jobs runs: its job's name (read from its
    parameters; no field of the hash)."""
    return {} if call is None else {"job": call.name}


def _progress_text(task: dict[str, str]) -> str:
    """A running task's progress as a percentage (``45%``), else ``-``."""
    fraction = field_float(task.get("progress"))
    if fraction is None or task.get("status") in FINISHED_STATUSES:
        return "-"
    return f"{max(0.0, min(1.0, fraction)) * 100:.0f}%"


def _eta_text(task: dict[str, str], current: float) -> str:
    """When a scheduled or retrying task runs: ``in 3h12m`` (``due`` once passed)."""
    eta = field_float(task.get("eta")) if task.get("status") == SCHEDULED else None
    if eta is None or not math.isfinite(eta):  # inf, nan: corrupt, or written by hand
        return "-"
    return f"in {format_seconds(eta - current)}" if eta > current else "due"




# --- show -------------------------------------------------------------------------------------
def cmd_show(client: Client, args: argparse.Namespace) -> int:
    task = client.get_task(args.task_id, missing_ok=True)
    if not task.data:
        raise TaskNotFound(args.task_id)
    if args.checkpoint:
        return _show_checkpoint(task, args)
    data = with_finish_time(task.data)
    rows = []
    for name in sorted(set(data) - {"history"}):  # the history is shown as a table below
        value = data[name]
        stamp = field_float(value) if name in TIME_FIELDS else None
        if name == "status" and task.cancelled:  # what the reader asks: was it cancelled?
            value = f"{value} (cancelled: listed and counted as cancelled)"
        rows.append((name, f"{format_time(stamp)} ({value})" if stamp else
                     value if args.full else cut_value(value)))
    info = task.checkpoint_info  # its size, time and attempt; the state stays in Redis
    if info is None:
        saved = "checkpoint: none"
    else:
        age = format_seconds(client.store.now() - info.saved_at)
        saved = (f"checkpoint: {format_bytes(info.size)} saved {format_time(info.saved_at)} "
                 f"({age} ago) by attempt {info.attempt}; "
                 f"blueque show {visible(args.task_id)} --checkpoint prints it")
    history = task_history(data)
    awaiting = task.awaiting() if task.status == WAITING else []
    call = read_job_call(task.parameters)
    key = data.get("concurrency_key")
    state = client.key_states([key])[0] if key else None  # its key's slots (5.22)
    emit(args, {**task_json(args.task_id, data), "state": task.state, **_job_of(call),
                "history": history,
                "checkpoint": info and vars(info),
                **({"key": _key_json(state)} if state else {}),
                **({"awaiting": awaiting} if task.status == WAITING else {})},
         f"task {visible(args.task_id)}" + (" (cancelled)" if task.cancelled else "")
         + (f": job {visible(call.name)}" if call else "") + "\n"
         + table(("FIELD", "VALUE"), rows) + "\n" + _history_text(history) + "\n" + saved
         + _waiting_text(client, task, awaiting) + _key_text(state))
    return EXIT_OK


def _key_json(state: KeyState) -> dict[str, object]:
    return {"key": state.key, "limit": state.limit, "holding": state.holding,
            "waiting": state.waiting, "holders": [vars(h) for h in state.holders],
            "waiters": list(state.waiters)}


def _key_text(state: KeyState | None) -> str:
    """Its concurrency key: the limit, the runs holding it and the tasks waiting for it."""
    if state is None:
        return ""
    held = ", ".join(f"{h.task_id} on {h.listener}" for h in state.holders) or "none"
    return (f"\nkey {visible(state.key)}: limit "
            f"{'none' if state.limit is None else state.limit}, {state.holding} holding "
            f"({held}), {state.waiting} waiting")


def _waiting_text(client: Client, task: Task, awaiting: list[str]) -> str:
    """What a waiting task waits for: its parents not yet ended (or not yet told), each with
    its state, the first 10 of them."""
    if task.status != WAITING:
        return ""
    shown = awaiting[:10]
    states = [state_of(d) or "gone" for d in client.store.task_data_many(shown)]
    listed = ", ".join(f"{visible(i)} ({state})" for i, state in zip(shown, states, strict=True))
    more = f" and {len(awaiting) - len(shown)} more" if len(awaiting) > len(shown) else ""
    rule = "any ending" if task.data.get("after_any") == "1" else "all complete"
    return (f"\nwaiting for {len(awaiting)} of {len(task.after)} parent(s) to end "
            f"(runs when {rule}): {listed}{more}")


def _history_text(history: list[dict[str, Any]]) -> str:
    """How each earlier run ended: the ``history`` field (PROTOCOL.md 3.2), oldest first."""
    if not history:
        return "history: none (no run has ended yet)"
    rows = [(entry.get("attempt") or "-", entry.get("outcome") or "?",
             format_time(field_float(entry.get("at"))), _ran(entry),
             entry.get("node") or "-", shorten(last_line(entry.get("error")), 60))
            for entry in history]
    return "history:\n" + table(("ATTEMPT", "ENDED", "AT", "RAN", "WHERE", "WHY"), rows)


def _ran(entry: dict[str, Any]) -> str:
    started, at = field_float(entry.get("started")), field_float(entry.get("at"))
    return "-" if started is None or at is None else format_seconds(max(0.0, at - started))


def _show_checkpoint(task: Task, args: argparse.Namespace) -> int:
    """The checkpoint's state alone (for a pipe into jq), or with --json its fields too."""
    state, info = task.checkpoint, task.checkpoint_info
    if state is None or info is None:
        raise Failure(f"task {task.id} has no checkpoint", EXIT_FAILURE)
    if args.json:
        print(json_text({"id": task.id, **vars(info), "state": state}))
    else:
        sys.stdout.write(state if state.endswith("\n") else state + "\n")
    return EXIT_OK


# --- logs -------------------------------------------------------------------------------------
def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    if args.json and args.follow:
        raise Failure("--json: blueque logs --follow streams the text as it comes; without "
                      "--follow, --json prints the attempt's output as one record", EXIT_USAGE)
    task = client.get_task(args.task_id, missing_ok=True)

    def finished() -> bool:
        return task.refresh().status in FINISHED_STATUSES or not task.data

    output = read_output(client.store, args.task_id, args.attempt)
    if output is None and args.follow and not finished():
        # pending, scheduled or just reserved: follow from its first line
        output = wait_for_output(client.store, args.task_id, args.attempt, finished)
    if output is None:
        if not task.refresh().data:
            raise TaskNotFound(args.task_id)
        return _no_output(args, task.data)
    if args.json:
        attempt = output.attempt  # as the stream has it: a number, unless written by hand
        print(json_text({"id": args.task_id,
                         "attempt": int(attempt) if attempt.isdigit() else None,
                         "text": output.text, "ended": output.ended}))
        return EXIT_OK
    sys.stdout.write(output.text)
    sys.stdout.flush()
    if args.follow:
        for text in follow_output(client.store, args.task_id, output, finished):
            sys.stdout.write(text)
            sys.stdout.flush()
        if output.superseded_by is not None:
            print(f"blueque: attempt {output.attempt} ended without its end mark (its "
                  f"process died unwatched); attempt {output.superseded_by} has begun: "
                  f"blueque logs {args.task_id} --follow", file=sys.stderr)
    return EXIT_OK


def _no_output(args: argparse.Namespace, data: dict[str, str]) -> int:
    """A task with no output in Redis: not a failure of `blueque logs` (an attempt that
    printed nothing ships nothing), but said on stderr, with why; --json prints the record
    with an empty text instead. An attempt the task has not had is refused (exit 1)."""
    task_id = visible(args.task_id)
    runs = int(data.get("attempts") or 0) if (data.get("attempts") or "0").isdigit() else 0
    if args.attempt is not None and args.attempt > runs:
        raise Failure(f"task {task_id} has had {runs} attempt(s): there is no attempt "
                      f"{args.attempt} to show", EXIT_FAILURE)
    status = data.get("status")
    attempt = args.attempt or runs or None
    if attempt is None:
        if status in FINISHED_STATUSES:
            how = ("was cancelled before it ran" if data.get("cancelled")
                   else f"ended ({status}) without running")
            why = f"task {task_id} {how}: it has no output{_reason(data.get('error', ''))}"
        else:
            why = (f"task {task_id} is {status} and has not run yet: it has no output "
                   f"(blueque logs {task_id} --follow waits for it)")
    else:
        why = (f"attempt {attempt} of task {task_id} printed nothing (or its output was not "
               "kept: a listener started with --no-task-logs or a ForkingRunner keeps none, "
               "and Redis keeps it only for the task's result TTL or the listener's "
               "--log-keep)")
    # is the attempt over (for a task that never ran: is the task)?
    ended = (status in FINISHED_STATUSES if attempt is None
             else attempt < runs or status not in (RESERVED, STARTED))
    if args.json:  # the record says it: no text
        print(json_text({"id": args.task_id, "attempt": attempt, "text": "", "ended": ended}))
    else:
        print(f"blueque: {why}", file=sys.stderr)
    return EXIT_OK


def _reason(error: str) -> str:
    return f" ({shorten(last_line(error), 200)})" if error else ""
