"""`blueque wait`, and the result table it shares with `enqueue --wait`."""

from __future__ import annotations

import argparse
import sys

from blueque.cli.base import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    Commands,
    Failure,
    duration,
    emit,
    task_json,
)
from blueque.client import Client
from blueque.display import last_line, shorten, table, visible
from blueque.statuses import FAILED, state_of
from blueque.waiting import WaitResult, wait_all


def register(commands: Commands) -> None:
    sub = commands.add("wait", cmd_wait, "wait until tasks finish (progress bar on stderr)",
                       role="inspector")
    sub.add_argument("task_ids", nargs="+", metavar="TASK_ID")
    sub.add_argument("--timeout", type=duration, metavar="DURATION",
                     help="give up after this long (90, 15m, 2h)")
    sub.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                     help="auto (default): on a terminal, one task's own progress bar "
                          "(fraction and message) or, for several, how many finished")


def cmd_wait(client: Client, args: argparse.Namespace) -> int:
    ids = list(dict.fromkeys(args.task_ids))
    show = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())
    result = wait_all(client, ids, args.timeout, show=sys.stderr if show else None)
    return report_waited(args, result)


def print_result(task_id: str, result: WaitResult) -> int:
    """`enqueue --wait`: the result of the task as it is (what a script captures), or why
    there is none on stderr: it failed or was cancelled (exit 1), is gone (4), or still runs
    when the wait timed out (1). `blueque wait ID` prints the table."""
    if result.missing():
        raise Failure(f"no such task: {task_id} (deleted while waited for)", EXIT_NOT_FOUND)
    data = result.tasks[task_id]
    status = data.get("status")
    if result.timed_out:
        raise Failure(f"timed out: task {visible(task_id)} is still {status}")
    if status == FAILED:
        how = "was cancelled" if data.get("cancelled") else "failed"
        raise Failure(f"task {visible(task_id)} {how}: "
                      f"{visible(last_line(data.get('error')) or '(no error text)')} (blueque "
                      f"show {visible(task_id)} has its traceback)")
    value = data.get("result", "")
    sys.stdout.write(value if value.endswith("\n") or not value else value + "\n")
    return EXIT_OK


def report_waited(args: argparse.Namespace, result: WaitResult,
                  extra: dict[str, object] | None = None) -> int:
    tasks = [{"id": i, **d} for i, d in result.tasks.items()]
    rows = [(t["id"], state_of(t) or "(missing)",
             shorten(last_line(t.get("error")) if t.get("status") == FAILED
                     else t.get("result"), 60))
            for t in tasks]
    emit(args, {"tasks": [task_json(i, d) for i, d in result.tasks.items()],
                "timed_out": result.timed_out, **(extra or {})},
         table(("ID", "STATUS", "RESULT/ERROR"), rows))
    if result.missing():
        raise Failure(f"no such task: {', '.join(result.missing())}", EXIT_NOT_FOUND)
    if result.timed_out:
        raise Failure(f"timed out: {len(tasks) - len(result.finished())} task(s) unfinished")
    failed, cancelled = len(result.failed()), len(result.cancelled())
    if failed or cancelled:
        raise Failure(", ".join(f"{n} task(s) {what}" for n, what in (
            (failed, "failed"), (cancelled, "cancelled")) if n))
    return EXIT_OK
