"""Commands that read: `status`, `tasks`, `show`, `logs`."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from typing import Any

from blueque import keys as k
from blueque.cli.base import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    Commands,
    Failure,
    emit,
    unknown_queue,
)
from blueque.client import Client, ListenerStatus
from blueque.display import (
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
from blueque.policy import field_float
from blueque.task import Task, readable_history
from blueque.tasklog import follow_output, read_output, wait_for_output

#: Timestamp fields of a task hash, shown as dates by `blueque show`.
TIME_FIELDS = ("created", "updated", "eta", "started_at", "finished_at", "cancelled",
               "cancel_requested", "pid_created")


def register(commands: Commands) -> None:
    commands.add("status", cmd_status,
                 "queues with counts per state, listeners with their leases, and whether "
                 "Redis may evict Blueque's keys (its maxmemory-policy)")
    sub = commands.add("tasks", cmd_tasks, "list the tasks of a queue")
    sub.add_argument("queue")
    sub.add_argument("--status", choices=k.STATES,
                     help="only tasks in this state (cancelled: failed tasks that were "
                          "cancelled, listed apart)")
    sub.add_argument("--limit", type=positive_int, default=20,
                     help="at most N per state (default 20)")
    sub = commands.add("show", cmd_show,
                       "every field of one task, and its checkpoint's size and age")
    sub.add_argument("task_id")
    sub.add_argument("--checkpoint", action="store_true",
                     help="print the task's checkpoint (its saved state) instead")
    sub = commands.add("logs", cmd_logs, "a task's output (stdout and stderr), read from Redis")
    sub.add_argument("task_id")
    sub.add_argument("--attempt", type=positive_int,
                     help="which attempt (default: the newest)")
    sub.add_argument("--follow", "-f", action="store_true",
                     help="print what the attempt writes until it ends (waits for a task "
                          "that has not started yet)")


# --- status -----------------------------------------------------------------------------------
def cmd_status(client: Client, args: argparse.Namespace) -> int:
    queues = client.queue_names()
    stats = [vars(client.get_queue(name).stats()) for name in queues]
    listeners = client.listeners(queues)
    current = client.store.now()
    counts = ("pending", "scheduled", "reserved", "started", "complete", "failed", "cancelled",
              "listeners")
    text = table(("QUEUE", *(c.upper() for c in counts)),
                 [(s["name"], *(s[c] for c in counts)) for s in stats]) if stats else "no queues"
    rows = [(item.listener, item.queue, item.host or "-", item.info.get("pid", "-"),
             _lease_text(item.lease_remaining), _age_text(item.renewed_age),
             _state_text(item, current)) for item in listeners]
    text += "\n\n" + (table(("LISTENER", "QUEUE", "HOST", "PID", "LEASE", "RENEWED", "STATE"),
                            rows) if rows else "no listeners")
    policy = client.store.memory_policy()  # anything but noeviction loses tasks silently
    text += "\n\n" + policy.summary()
    emit(args, {"queues": stats, "listeners": [asdict(item) for item in listeners],
                "redis": policy.as_dict()}, text)
    return EXIT_OK


def _state_text(listener: ListenerStatus, current: float) -> str:
    """``preempting: node goes away in 1m20s (12:34:56)`` for a preempted listener."""
    deadline = listener.preempting_until
    if deadline is None:
        return "listening"
    when = time.strftime("%H:%M:%S", time.localtime(deadline))
    left = deadline - current
    if left <= 0:
        return f"preempted: node gone since {when}"
    return f"preempting: node goes away in {format_seconds(left)} ({when})"


def _lease_text(remaining: float | None) -> str:
    if remaining is None:
        return "none"
    if remaining < 0:
        return f"EXPIRED {format_seconds(-remaining)} ago"
    return f"{format_seconds(remaining)} left"


def _age_text(age: float | None) -> str:
    return "-" if age is None else f"{format_seconds(age)} ago"


# --- tasks ------------------------------------------------------------------------------------
def cmd_tasks(client: Client, args: argparse.Namespace) -> int:
    if args.queue not in client.queue_names():
        raise unknown_queue(args.queue)
    queue = client.get_queue(args.queue)
    ids: list[str] = []
    for status in [args.status] if args.status else list(k.STATES):
        ids += queue.task_ids(status, 0, args.limit - 1)[: args.limit]
    datas = client.store.task_data_many(ids)
    tasks = [{"id": i, **d} for i, d in zip(ids, datas, strict=True)]
    current = client.store.now()
    rows = [(t["id"], k.state_of(t) or "(missing)", t.get("attempts", "-"),
             format_time(field_float(t.get("updated"))), _eta_text(t, current),
             t.get("node") or "-",
             shorten(last_line(t.get("error")) or t.get("result") or t.get("parameters"),
                     48))
            for t in tasks]
    text = table(("ID", "STATUS", "ATTEMPTS", "UPDATED", "ETA", "NODE",
                  "RESULT/ERROR/PARAMETERS"), rows) if rows else f"no tasks in {args.queue}"
    emit(args, tasks, text)
    return EXIT_OK


def _eta_text(task: dict[str, str], current: float) -> str:
    """When a scheduled or retrying task runs: ``in 3h12m`` (``due`` once passed)."""
    eta = field_float(task.get("eta")) if task.get("status") == k.SCHEDULED else None
    if eta is None or not math.isfinite(eta):  # inf, nan: corrupt, or written by hand
        return "-"
    return f"in {format_seconds(eta - current)}" if eta > current else "due"




# --- show -------------------------------------------------------------------------------------
def cmd_show(client: Client, args: argparse.Namespace) -> int:
    task = client.get_task(args.task_id)
    data = task.data
    if not data:
        raise TaskNotFound(args.task_id)
    if args.checkpoint:
        return _show_checkpoint(task, args)
    rows = []
    for name in sorted(set(data) - {"history"}):  # the history is shown as a table below
        value = data[name]
        stamp = field_float(value) if name in TIME_FIELDS else None
        rows.append((name, f"{format_time(stamp)} ({value})" if stamp else value))
    info = task.checkpoint_info  # its size, time and attempt; the state stays in Redis
    if info is None:
        saved = "checkpoint: none"
    else:
        age = format_seconds(client.store.now() - info.saved_at)
        saved = (f"checkpoint: {format_bytes(info.size)} saved {format_time(info.saved_at)} "
                 f"({age} ago) by attempt {info.attempt}; "
                 f"blueque show {visible(args.task_id)} --checkpoint prints it")
    history = readable_history(data.get("history"))
    emit(args, {"id": args.task_id, **data, "history": history,
                "checkpoint": info and vars(info)},
         f"task {visible(args.task_id)}" + (" (cancelled)" if task.cancelled else "") + "\n"
         + table(("FIELD", "VALUE"), rows) + "\n" + _history_text(history) + "\n" + saved)
    return EXIT_OK


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
        print(json.dumps({"id": task.id, **vars(info), "state": state}, indent=2))
    else:
        sys.stdout.write(state if state.endswith("\n") else state + "\n")
    return EXIT_OK


# --- logs -------------------------------------------------------------------------------------
def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    if args.json and args.follow:
        raise Failure("--json: blueque logs --follow streams the text as it comes; without "
                      "--follow, --json prints the attempt's output as one record", EXIT_USAGE)
    task = client.get_task(args.task_id)

    def finished() -> bool:
        return task.refresh().status in k.FINISHED_STATUSES or not task.data

    output = read_output(client.store, args.task_id, args.attempt)
    if output is None and args.follow and not finished():
        # pending, scheduled or just reserved: follow from its first line
        output = wait_for_output(client.store, args.task_id, args.attempt, finished)
    if output is None:
        if not task.refresh().data:
            raise TaskNotFound(args.task_id)
        raise Failure(_no_output(args, task.data), EXIT_FAILURE)
    if args.json:
        print(json.dumps({"id": args.task_id, "attempt": output.attempt, "text": output.text,
                          "ended": output.ended}, indent=2))
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


def _no_output(args: argparse.Namespace, data: dict[str, str]) -> str:
    """Why `blueque logs` has nothing to show: the task never ran, or its output is not kept."""
    if data.get("status") in k.FINISHED_STATUSES and data.get("attempts", "0") in ("", "0"):
        how = ("was cancelled before it ran" if data.get("cancelled")
               else f"ended ({data.get('status')}) without running")
        return (f"task {visible(args.task_id)} {how}: it has no output"
                f"{_reason(data.get('error', ''))}")
    which = f"attempt {args.attempt}" if args.attempt is not None else "any attempt"
    return (f"no output of {which} of task {visible(args.task_id)} in Redis (listeners keep "
            "the last 64 KiB of each attempt; --no-task-logs keeps none)")


def _reason(error: str) -> str:
    return f" ({shorten(last_line(error), 200)})" if error else ""
