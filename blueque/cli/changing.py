"""Commands that change tasks and queues: `enqueue`, `cancel`, `preempt`, `retry`, `purge`,
`configure`, `forget-queue`, `pause`, `resume`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from blueque.cli.base import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    Commands,
    Failure,
    argument_type,
    duration,
    emit,
    eta_time,
    known_queue,
    unknown_queue,
)
from blueque.cli.wait import print_result, report_waited
from blueque.client import Client
from blueque.display import format_seconds, format_time, parse_duration, positive_int, table
from blueque.fields import typed
from blueque.node import hostname
from blueque.placement import PLACEMENT_OPTIONS, parse_resources
from blueque.policy import OPTION_TYPES, QUEUE_LIMITS
from blueque.statuses import ENDED_LISTS
from blueque.waiting import wait_all

#: `configure`'s value of an option that was not given (None means "remove it").
_UNSET = object()


def register(commands: Commands) -> None:
    sub = commands.add("enqueue", cmd_enqueue, "submit a task (prints its id)", role="client")
    sub.add_argument("queue")
    sub.add_argument("parameters", help="a string, JSON by convention (text that is not "
                     "JSON is enqueued with a warning on stderr); - reads stdin")
    sub.add_argument("--text", action="store_true", help=(
        "the parameters are plain text on purpose: no warning that they are not JSON"))
    when = sub.add_mutually_exclusive_group()
    when.add_argument("--delay", type=duration, metavar="DURATION",
                      help="run after this long (90, 15m, 2h)")
    when.add_argument("--eta", type=eta_time, help=(
        "run at this time: Unix seconds or ISO 8601 (no offset: local time)"))
    sub.add_argument("--task-id", help="your own id; enqueueing an existing id does nothing")
    sub.add_argument("--after", action="append", metavar="TASK_ID", help=(
        "wait for this task (of any queue) to end first; repeat for several: the task runs "
        "once all completed, and fails if one fails or is cancelled"))
    sub.add_argument("--after-any", action="store_true", help=(
        "with --after: run once they have ended, however they ended"))
    _add_task_options(sub, None)
    sub.add_argument("--wait", action="store_true", help=(
        "wait for the task and print its result (a failed task: its error on stderr, exit "
        "1); with --json, the task's record"))
    sub.add_argument("--timeout", type=duration, metavar="DURATION",
                     help="with --wait: give up after this long (90, 15m, 2h)")

    sub = commands.add("cancel", cmd_cancel,
                       "cancel a task (a running one has its processes stopped), or with "
                       "--all every pending and scheduled task of a queue", role="operator")
    sub.add_argument("task_id", nargs="?")
    sub.add_argument("--reason", default="by operator", help="recorded in the task's error")
    sub.add_argument("--all", metavar="QUEUE", dest="all_of",
                     help="cancel every pending and scheduled task of QUEUE (running ones go "
                          "on: cancel them by id), a few hundred per server-side step")
    sub.add_argument("--older-than", type=duration, metavar="DURATION",
                     help="with --all: only tasks created longer ago than this (90, 15m, 2h)")
    sub.add_argument("--match", metavar="PATTERN",
                     help="with --all: only tasks whose id matches this shell pattern "
                          "('batch-7-*', quoted)")
    sub.add_argument("--pending-only", action="store_true",
                     help="with --all: leave the scheduled tasks alone")
    _add_preempt(commands)
    sub = commands.add("retry", cmd_retry, "make failed tasks pending again (attempts are kept)",
                       role="operator")
    sub.add_argument("task_id", nargs="?", help="a failed task (a cancelled one too: it is "
                                                "asked for by its id)")
    sub.add_argument("--failed", metavar="QUEUE",
                     help="every failed task of QUEUE (not the cancelled ones)")
    sub.add_argument("--limit", type=positive_int, default=None,
                     help="with --failed: oldest N only")
    sub.add_argument("--include-cancelled", action="store_true",
                     help="with --failed: the cancelled tasks too (after the failed ones)")
    sub = commands.add("purge", cmd_purge, "delete finished tasks older than a duration",
                       role="operator")
    sub.add_argument("queue")
    sub.add_argument("--older-than", type=duration, required=True, metavar="DURATION",
                     help="finished longer ago than this (90, 15m, 2h, 7d)")
    sub.add_argument("--status", choices=ENDED_LISTS, help="default: all three")
    sub = commands.add("configure", cmd_configure,
                       "set or show a queue's defaults (a value of 'none' removes one)",
                       role="operator")
    sub.add_argument("queue")
    _add_task_options(sub, _UNSET)
    for name, what in (("max_parameters_bytes", "largest parameters an enqueue may give"),
                       ("max_result_bytes", "largest result a task may return (a larger "
                                            "one fails the run)")):
        sub.add_argument("--" + name.replace("_", "-"), dest=name, default=_UNSET,
                         type=_attempts_value, metavar="BYTES",
                         help=f"{what}, in bytes (default {QUEUE_LIMITS[name]}: 16 MiB; 0: "
                              "no limit)")
    sub = commands.add("forget-queue", cmd_forget_queue, "remove an empty queue without "
                       "listeners from `blueque status` (and its defaults)", role="operator")
    sub.add_argument("queue")
    _add_pause(commands)


def _add_pause(commands: Commands) -> None:
    sub = commands.add("pause", cmd_pause, "pause a queue: no listener starts its tasks until "
                       "`blueque resume` (running ones go on, enqueues are kept)",
                       role="operator")
    sub.add_argument("queue")
    sub.add_argument("--reason", metavar="TEXT",
                     help="why, shown by blueque status and the dashboard")
    sub = commands.add("resume", cmd_resume, "resume a paused queue: its listeners start its "
                       "tasks again at once", role="operator")
    sub.add_argument("queue")


def _add_preempt(commands: Commands) -> None:
    sub = commands.add("preempt", cmd_preempt,
                       "announce that a node goes away: its listeners stop taking tasks, and "
                       "its tasks save and stop to resume elsewhere (without spending an "
                       "attempt)", role="operator")
    sub.add_argument("--node", metavar="NAME",
                     help="the node's name, as its listeners' --node-name (default: this "
                          "machine's fully qualified host name)")
    sub.add_argument("--grace", type=duration, default=90.0, metavar="DURATION",
                     help="notice before the node goes away: tasks still running then are "
                          "terminated and put back (default 90s)")
    sub.add_argument("--reason", help="recorded with the request (default: blueque preempt)")
    sub.add_argument("--withdraw", action="store_true",
                     help="withdraw the node's preemption (a false alarm)")


def _option_value(text: str) -> object:
    """A queue default: a number or duration, or ``none`` to remove it."""
    return None if text.lower() in ("none", "") else parse_duration(text)


def _attempts_value(text: str) -> object:
    return None if text.lower() in ("none", "") else int(text)


def _key_value(text: str) -> object:
    return None if text.lower() in ("none", "") else text


def _requires_value(text: str) -> object:
    """``gpu=1,memory=16G`` (blueque.placement), or ``none`` to remove a queue's default."""
    return None if text.lower() in ("none", "") else parse_resources(text)


def _add_task_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """A task's options (enqueue: default None) or a queue's defaults (configure: default
    _UNSET, and 'none' removes one)."""
    parser.add_argument("--max-attempts", dest="max_attempts", default=default,
                        type=int if default is None else _attempts_value,
                        metavar="N", help="runs allowed, counting crashes (default 1)")
    for name, what in (("retry_backoff", "first retry delay"),
                       ("retry_backoff_max", "longest retry delay"),
                       ("time_limit", "time limit of one run (SIGTERM, then SIGKILL)"),
                       ("kill_grace", "time between SIGTERM and SIGKILL at the time limit"),
                       ("result_ttl", "how long a finished task is kept")):
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=default,
                            type=duration if default is None else argument_type(_option_value),
                            metavar="DURATION", help=f"{what} (90, 15m, 2h, 7d)")
    parser.add_argument("--checkpoint-max-bytes", dest="checkpoint_max_bytes", default=default,
                        type=int if default is None else _attempts_value, metavar="BYTES",
                        help="largest checkpoint a run may save (default 1048576: 1 MiB)")
    parser.add_argument("--max-preemptions", dest="max_preemptions", default=default,
                        type=int if default is None else _attempts_value, metavar="N",
                        help="runs a preemption may stop without spending an attempt before "
                             "the task fails (default 10)")
    parser.add_argument("--keep-processes", dest="keep_processes", default=default,
                        type=int if default is None else _attempts_value, metavar="0|1",
                        help="1: leave running what a run started when it ends (a task that "
                             "starts a daemon on purpose); 0 (default): stop it, SIGTERM then "
                             "SIGKILL after kill_grace")
    parser.add_argument("--exclusive", dest="exclusive", default=default,
                        type=int if default is None else _attempts_value, metavar="0|1",
                        help="1: never two runs of a task at once, even when a node is cut "
                             "off from Redis: its run is stopped before its lease can lapse "
                             "(PROTOCOL.md 6.6); 0 (default)")
    parser.add_argument("--concurrency-key", dest="concurrency_key", default=default,
                        type=str if default is None else _key_value, metavar="KEY",
                        help="at most `blueque limit KEY N` runs of the tasks with this key at "
                             "once, across the fleet (PROTOCOL.md 5.22)")
    parser.add_argument("--requires", dest="requires", default=default,
                        type=argument_type(_requires_value), metavar="NAME=AMOUNT[,...]",
                        help="resources a listener must have free to take the task "
                             "(gpu=1,memory=16G; blueque listen --resources)")


# --- handlers ---------------------------------------------------------------------------------
def cmd_enqueue(client: Client, args: argparse.Namespace) -> int:
    parameters = sys.stdin.read() if args.parameters == "-" else args.parameters
    queue = client.get_queue(args.queue)
    options: dict[str, Any] = {name: getattr(args, name)
                               for name in [*OPTION_TYPES, *PLACEMENT_OPTIONS]
                               if getattr(args, name, None) is not None}
    if args.after_any and not args.after:
        raise Failure("--after-any goes with --after TASK_ID", EXIT_USAGE)
    if args.after:
        options.update(after=args.after, after_any=args.after_any)
    if args.delay is not None or args.eta is not None:
        current = client.store.now()
        if args.eta is not None and args.eta < current:
            print(f"blueque: warning: --eta {format_time(args.eta)} was "
                  f"{format_seconds(current - args.eta)} ago: the task is due at once",
                  file=sys.stderr)
        # --delay counts from now by Redis' clock, whatever this host's clock says
        task_id = queue.schedule(parameters, args.eta, task_id=args.task_id, delay=args.delay,
                                 **options)
    else:
        task_id = queue.enqueue(parameters, task_id=args.task_id, **options)
    if task_id.created and not args.text:
        _warn_unless_json(parameters)
    if not task_id.created:
        # stdout stays the id alone (scripts capture it); the notice goes to stderr
        status = client.get_task(task_id, missing_ok=True).status or "gone"
        print(f"blueque: task {task_id} already existed ({status}): nothing was enqueued"
              + ("; waiting for the existing task" if args.wait else ""), file=sys.stderr)
    if not args.wait:
        emit(args, {"task_id": task_id, "queue": args.queue, "created": task_id.created},
             task_id)
        return EXIT_OK
    result = wait_all(client, [task_id], args.timeout)
    if args.json:
        return report_waited(args, result, {"created": task_id.created})
    return print_result(task_id, result)


def _warn_unless_json(parameters: str) -> None:
    """Parameters are text, JSON by convention: text that is not JSON (``{page: 1}``, the
    shell's quotes lost) is enqueued, as any client may, but said on stderr: a task function
    that reads them with json.loads would fail hours later, on its listener."""
    try:
        json.loads(parameters)
    except ValueError as error:
        print(f"blueque: warning: the parameters are not JSON ({error}): enqueued as text, "
              "which a task function that reads JSON cannot read. Quote them for the shell, "
              "as in '{\"page\": 1}', or pass --text if plain text is meant", file=sys.stderr)


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    if (args.task_id is None) == (args.all_of is None):
        raise Failure("give either a TASK_ID or --all QUEUE", EXIT_USAGE)
    if args.all_of is not None:
        return _cancel_all(client, args)
    if args.older_than is not None or args.match is not None or args.pending_only:
        raise Failure("--older-than, --match and --pending-only go with --all QUEUE",
                      EXIT_USAGE)
    outcome = client.cancel_task(args.task_id, args.reason)
    text = {"cancelled": f"task {args.task_id} cancelled: it will not run",
            "requested": f"task {args.task_id} is running: its listener was told to stop it"}
    emit(args, {"task_id": args.task_id, "outcome": outcome}, text.get(outcome, outcome))
    return EXIT_OK


def _cancel_all(client: Client, args: argparse.Namespace) -> int:
    queue = known_queue(client, args.all_of)  # a typo must not read as "0 cancelled"
    started = time.monotonic()
    done = client.get_queue(queue).cancel_waiting(
        args.older_than, args.match, args.reason, scheduled=not args.pending_only)
    which = []
    if args.older_than is not None:
        which.append(f"created more than {format_seconds(args.older_than)} ago")
    if args.match is not None:
        which.append(f"whose id matches {args.match!r}")
    emit(args, {"queue": queue, "cancelled": {"pending": done.pending,
                                              "scheduled": done.scheduled},
                "seconds": round(time.monotonic() - started, 3)},
         f"{done.pending} pending and {done.scheduled} scheduled task(s) of {queue}"
         + (" " + " and ".join(which) if which else "")
         + " cancelled; running tasks go on (cancel them by id)")
    return EXIT_OK


def cmd_preempt(client: Client, args: argparse.Namespace) -> int:
    node = args.node or hostname()
    if args.withdraw:
        gone = client.withdraw_preemption(node)
        emit(args, {"node": node, "withdrawn": gone},
             f"preemption of node {node} withdrawn" if gone
             else f"no preemption of node {node} was announced")
        return EXIT_OK if gone else EXIT_NOT_FOUND
    deadline = client.preempt_node(node, args.grace, args.reason or "")
    listeners = sorted({item.listener for item in client.listeners() if item.host == node})
    text = (f"node {node} goes away in {format_seconds(args.grace)} "
            f"({time.strftime('%H:%M:%S', time.localtime(deadline))}): "
            + (f"its {len(listeners)} listener(s) take no more tasks and tell their tasks: "
               + ", ".join(listeners) if listeners else
               "no listener of it is registered now; one that starts before then takes no "
               "tasks"))
    emit(args, {"node": node, "deadline": deadline, "listeners": listeners}, text)
    return EXIT_OK


def cmd_retry(client: Client, args: argparse.Namespace) -> int:
    if (args.task_id is None) == (args.failed is None):
        raise Failure("give either a TASK_ID or --failed QUEUE", EXIT_USAGE)
    if args.task_id is not None:
        if args.limit is not None or args.include_cancelled:
            raise Failure("--limit and --include-cancelled go with --failed QUEUE", EXIT_USAGE)
        was_cancelled = client.get_task(args.task_id, missing_ok=True).cancelled
        client.retry_task(args.task_id)
        emit(args, {"retried": [args.task_id]},
             f"task {args.task_id} is pending again"
             + (" (it had been cancelled)" if was_cancelled else ""))
        return EXIT_OK
    queue = client.get_queue(known_queue(client, args.failed))  # not "0 retried" for a typo
    retried = queue.retry_failed(args.limit, include_cancelled=args.include_cancelled)
    left = 0 if args.include_cancelled else queue.stats().cancelled
    emit(args, {"retried": retried},
         f"{len(retried)} failed task(s) of {args.failed} are pending again"
         + (f"; {left} cancelled task(s) left alone (--include-cancelled retries them)"
            if left else ""))
    return EXIT_OK


def cmd_purge(client: Client, args: argparse.Namespace) -> int:
    queue = client.get_queue(args.queue)
    statuses = [args.status] if args.status else list(ENDED_LISTS)
    deleted = {status: queue.purge(status, args.older_than) for status in statuses}
    emit(args, {"queue": args.queue, "deleted": deleted},
         ", ".join(f"{n} {status}" for status, n in deleted.items())
         + f" task(s) older than {format_seconds(args.older_than)} deleted from {args.queue}")
    return EXIT_OK


def cmd_configure(client: Client, args: argparse.Namespace) -> int:
    queue = client.get_queue(args.queue)
    changes = {name: getattr(args, name)
               for name in [*OPTION_TYPES, *PLACEMENT_OPTIONS, *QUEUE_LIMITS]
               if getattr(args, name) is not _UNSET}
    if changes:
        queue.configure(**changes)
    config = queue.config()
    text = table(("OPTION", "VALUE"), sorted(config.items())) if config else (
        f"{args.queue} has no queue defaults")
    emit(args, {"queue": args.queue, "config": typed(config)}, text)
    return EXIT_OK


def cmd_forget_queue(client: Client, args: argparse.Namespace) -> int:
    if not client.store.forget_queue(args.queue):
        raise unknown_queue(args.queue, client.queue_names())
    emit(args, {"queue": args.queue, "forgotten": True},
         f"queue {args.queue} forgotten: it no longer shows in blueque status")
    return EXIT_OK


def cmd_pause(client: Client, args: argparse.Namespace) -> int:
    queue = client.get_queue(known_queue(client, args.queue))
    queue.pause(args.reason)
    stats = queue.stats()
    emit(args, {"queue": args.queue, "paused": True, "reason": args.reason or ""},
         f"queue {args.queue} paused: no listener starts its tasks until `blueque resume "
         f"{args.queue}` ({stats.pending} pending wait, {stats.started} running go on; "
         "blueque 1.0.1 listeners do not know of pauses)")
    return EXIT_OK


def cmd_resume(client: Client, args: argparse.Namespace) -> int:
    was_paused = client.get_queue(known_queue(client, args.queue)).resume()
    emit(args, {"queue": args.queue, "paused": False, "was_paused": was_paused},
         f"queue {args.queue} resumed: its listeners start its tasks again" if was_paused
         else f"queue {args.queue} was not paused")
    return EXIT_OK
