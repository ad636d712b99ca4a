"""The ``blueque`` command: the listener daemon, the scheduler, and operator tools.

Each subcommand is a short function over library calls. Readable tables for people; ``--json``
for scripts. Exit codes: see EXIT_CODES (also in ``blueque --help`` and README.md).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from blueque import daemon, demo
from blueque import keys as k
from blueque.client import Client
from blueque.config import Settings, default_url
from blueque.cron import CronEntry, check_unique, load_file, parse_spec
from blueque.display import (
    format_bytes,
    format_seconds,
    format_time,
    last_line,
    log_level,
    parse_duration,
    parse_eta,
    port_number,
    positive_int,
    positive_seconds,
    shorten,
    table,
)
from blueque.errors import (
    BluequeError,
    ConfigurationError,
    InvalidTaskState,
    RedisUnavailable,
    TaskNotFound,
)
from blueque.logs import configure as configure_logs
from blueque.metrics import MetricsServer, queue_registry
from blueque.node import hostname
from blueque.policy import OPTION_TYPES
from blueque.recovery import Recovery
from blueque.scheduler import Scheduler
from blueque.store import now
from blueque.task import Task
from blueque.tasklog import follow_output, read_output, wait_for_output
from blueque.waiting import WaitResult, wait_all

EXIT_OK = 0
EXIT_FAILURE = 1  # the operation failed or was refused (e.g. a task failed, cannot cancel)
EXIT_USAGE = 2  # bad arguments, bad URL, bad configuration
EXIT_UNREACHABLE = 3  # Redis could not be reached
EXIT_NOT_FOUND = 4  # no such task or queue

EXIT_CODES = f"""exit codes:
  {EXIT_OK}  success
  {EXIT_FAILURE}  failure: an operation was refused, a task failed, a wait timed out
  {EXIT_USAGE}  usage: bad arguments, bad Redis URL or credentials, Redis older than 6.2,
     a task function that cannot be imported, bad cron entry, a port in use
  {EXIT_UNREACHABLE}  Redis unreachable
  {EXIT_NOT_FOUND}  task or queue not found"""

#: Timestamp fields of a task hash, shown as dates by `blueque show`.
TIME_FIELDS = ("created", "updated", "eta", "started_at", "finished_at", "cancelled",
               "cancel_requested", "pid_created")
#: Options of `enqueue` and `configure` that are durations (accept 90, 15m, 2h...).
DURATION_OPTIONS = ("retry_backoff", "retry_backoff_max", "time_limit", "kill_grace",
                    "result_ttl")


class Failure(Exception):
    """A command's refusal: its message goes to stderr and its code is the exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def emit(args: argparse.Namespace, data: object, text: str) -> None:
    """Print ``data`` as JSON with --json, else ``text``."""
    print(json.dumps(data, indent=2) if args.json else text)


#: Commands that wait for Redis with backoff instead of exiting 3 when it is not up yet.
DAEMONS = ("listen", "scheduler", "dashboard", "metrics")


def connect(args: argparse.Namespace, ping: bool = True) -> Client:
    """A client for --url (else $BLUEQUE_URL, else redis://localhost:6379/0), checked with a
    PING so that an unreachable Redis is reported at once (exit 3). Daemons skip the PING:
    they retry with backoff until Redis is there (a listener started before its Redis)."""
    url = default_url() if args.url is None else args.url  # --url '' is a mistake, not "default"
    kwargs: dict[str, Any] = {}
    if urlsplit(url).scheme.lower() in ("redis", "rediss", "unix"):
        kwargs["socket_connect_timeout"] = 5.0
    client = Client(url, **kwargs)
    if ping:
        client.ping()
    return client


# --- inspecting -------------------------------------------------------------------------------
def cmd_status(client: Client, args: argparse.Namespace) -> int:
    queues = client.queue_names()
    stats = [vars(client.get_queue(name).stats()) for name in queues]
    listeners = _listeners(client, queues)
    counts = ("pending", "scheduled", "reserved", "started", "complete", "failed", "listeners")
    text = table(("QUEUE", *(c.upper() for c in counts)),
                 [(s["name"], *(s[c] for c in counts)) for s in stats]) if stats else "no queues"
    rows = [(item["listener"], item["queue"], item["info"].get("host", "-"),
             item["info"].get("pid", "-"), _lease_text(item["lease_remaining"]),
             _age_text(item["renewed_age"]), _state_text(item["info"])) for item in listeners]
    text += "\n\n" + (table(("LISTENER", "QUEUE", "HOST", "PID", "LEASE", "RENEWED", "STATE"),
                            rows) if rows else "no listeners")
    emit(args, {"queues": stats, "listeners": listeners}, text)
    return EXIT_OK


def _listeners(client: Client, queues: Sequence[str]) -> list[dict[str, Any]]:
    """Every listener of every queue, with its lease: seconds left (negative: expired)."""
    store = client.store
    server_now = store.server_time()
    found = []
    for queue in queues:
        leases = store.leases(queue)
        for listener in sorted(store.listener_ids(queue) | set(leases)):
            info = store.listener_info(listener)
            deadline = leases.get(listener)
            renewed = info.get("renewed") or info.get("started")
            found.append({
                "listener": listener,
                "queue": queue,
                "lease_deadline_ms": deadline,
                "lease_remaining": None if deadline is None else deadline / 1000 - server_now,
                "renewed_age": None if not renewed else time.time() - float(renewed),
                "info": info,
            })
    return found


def _state_text(info: dict[str, str]) -> str:
    """``preempting: node goes away in 1m20s (12:34:56)`` for a preempted listener."""
    try:
        deadline = float(info.get("preempting_until") or "")
    except ValueError:
        return "listening"
    when = time.strftime("%H:%M:%S", time.localtime(deadline))
    left = deadline - time.time()
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


def cmd_tasks(client: Client, args: argparse.Namespace) -> int:
    if args.queue not in client.queue_names():
        raise Failure(f"queue {args.queue!r} is not known (not in blueque_queues)",
                      EXIT_NOT_FOUND)
    queue = client.get_queue(args.queue)
    ids: list[str] = []
    for status in [args.status] if args.status else list(k.STATUSES):
        ids += queue.task_ids(status, 0, args.limit - 1)[: args.limit]
    datas = client.store.task_data_many(ids)
    tasks = [{"id": i, **d} for i, d in zip(ids, datas, strict=True)]
    current = now()
    rows = [(t["id"], t.get("status", "(missing)"), t.get("attempts", "-"),
             format_time(_float(t.get("updated"))), _eta_text(t, current),
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
    eta = _float(task.get("eta")) if task.get("status") == k.SCHEDULED else None
    if eta is None:
        return "-"
    return f"in {format_seconds(eta - current)}" if eta > current else "due"


def _float(raw: str | None) -> float | None:
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def cmd_show(client: Client, args: argparse.Namespace) -> int:
    task = client.get_task(args.task_id)
    data = task.data
    if not data:
        raise TaskNotFound(args.task_id)
    if args.checkpoint:
        return _show_checkpoint(task, args)
    rows = []
    for name in sorted(data):
        value = data[name]
        stamp = _float(value) if name in TIME_FIELDS else None
        rows.append((name, f"{format_time(stamp)} ({value})" if stamp else value))
    info = task.checkpoint_info  # its size, time and attempt; the state stays in Redis
    if info is None:
        saved = "checkpoint: none"
    else:
        saved = (f"checkpoint: {format_bytes(info.size)} saved {format_time(info.saved_at)} "
                 f"({format_seconds(now() - info.saved_at)} ago) by attempt {info.attempt}; "
                 f"blueque show {args.task_id} --checkpoint prints it")
    emit(args, {"id": args.task_id, **data, "checkpoint": info and vars(info)},
         f"task {args.task_id}\n" + table(("FIELD", "VALUE"), rows) + "\n" + saved)
    return EXIT_OK


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


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
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
        which = f"attempt {args.attempt}" if args.attempt is not None else "any attempt"
        raise Failure(f"no output of {which} of task {args.task_id} in Redis (listeners keep "
                      "the last 64 KiB of each attempt; --no-task-logs keeps none)", EXIT_FAILURE)
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


# --- changing ---------------------------------------------------------------------------------
def _options(args: argparse.Namespace) -> dict[str, object]:
    return {name: getattr(args, name) for name in OPTION_TYPES
            if getattr(args, name, None) is not None}


def cmd_enqueue(client: Client, args: argparse.Namespace) -> int:
    parameters = sys.stdin.read() if args.parameters == "-" else args.parameters
    queue = client.get_queue(args.queue)
    options = _options(args)
    if args.delay is not None or args.eta is not None:
        eta = args.eta if args.eta is not None else now() + args.delay
        task_id = queue.schedule(parameters, eta, task_id=args.task_id, **options)
    else:
        task_id = queue.enqueue(parameters, task_id=args.task_id, **options)
    if not task_id.created:
        # stdout stays the id alone (scripts capture it); the notice goes to stderr
        status = client.get_task(task_id).status or "gone"
        print(f"blueque: task {task_id} already existed ({status}): nothing was enqueued"
              + ("; waiting for the existing task" if args.wait else ""), file=sys.stderr)
    if not args.wait:
        emit(args, {"task_id": task_id, "queue": args.queue, "created": task_id.created},
             task_id)
        return EXIT_OK
    result = wait_all(client, [task_id], args.timeout)
    return _report_waited(args, result, {"created": task_id.created})


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    outcome = client.cancel_task(args.task_id, args.reason)
    text = {"cancelled": f"task {args.task_id} cancelled: it will not run",
            "requested": f"task {args.task_id} is running: its listener was told to stop it"}
    emit(args, {"task_id": args.task_id, "outcome": outcome}, text.get(outcome, outcome))
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
    listeners = sorted({item["listener"] for item in _listeners(client, client.queue_names())
                        if item["info"].get("host") == node})
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
        queue = client.get_task(args.task_id).queue
        if queue is None:
            raise TaskNotFound(args.task_id)
        client.store.retry_failed(queue, args.task_id, now())
        emit(args, {"retried": [args.task_id]}, f"task {args.task_id} is pending again")
        return EXIT_OK
    if args.failed not in client.queue_names():  # a typo must not read as "0 retried"
        raise Failure(f"queue {args.failed!r} is not known (not in blueque_queues)",
                      EXIT_NOT_FOUND)
    ids = client.get_queue(args.failed).task_ids(k.FAILED)[::-1]  # oldest first
    retried = []
    for task_id in ids[: args.limit]:
        try:
            client.store.retry_failed(args.failed, task_id, now())
        except (InvalidTaskState, TaskNotFound):
            continue  # retried, deleted or expired meanwhile
        retried.append(task_id)
    emit(args, {"retried": retried},
         f"{len(retried)} failed task(s) of {args.failed} are pending again")
    return EXIT_OK


def cmd_purge(client: Client, args: argparse.Namespace) -> int:
    queue = client.get_queue(args.queue)
    statuses = [args.status] if args.status else list(k.FINISHED_STATUSES)
    deleted = {status: queue.purge(status, args.older_than) for status in statuses}
    emit(args, {"queue": args.queue, "deleted": deleted},
         ", ".join(f"{n} {status}" for status, n in deleted.items())
         + f" task(s) older than {format_seconds(args.older_than)} deleted from {args.queue}")
    return EXIT_OK


def cmd_configure(client: Client, args: argparse.Namespace) -> int:
    queue = client.get_queue(args.queue)
    changes = {name: getattr(args, name) for name in OPTION_TYPES
               if getattr(args, name) is not _UNSET}
    if changes:
        queue.configure(**changes)
    config = queue.config()
    text = table(("OPTION", "VALUE"), sorted(config.items())) if config else (
        f"{args.queue} has no queue defaults")
    emit(args, {"queue": args.queue, "config": config}, text)
    return EXIT_OK


def cmd_forget_queue(client: Client, args: argparse.Namespace) -> int:
    if not client.store.forget_queue(args.queue):
        raise Failure(f"queue {args.queue!r} is not known (not in blueque_queues)",
                      EXIT_NOT_FOUND)
    emit(args, {"queue": args.queue, "forgotten": True},
         f"queue {args.queue} forgotten: it no longer shows in blueque status")
    return EXIT_OK


# --- waiting ----------------------------------------------------------------------------------
def cmd_wait(client: Client, args: argparse.Namespace) -> int:
    ids = list(dict.fromkeys(args.task_ids))
    show = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())
    result = wait_all(client, ids, args.timeout, show=sys.stderr if show else None)
    return _report_waited(args, result)


def _report_waited(args: argparse.Namespace, result: WaitResult,
                   extra: dict[str, object] | None = None) -> int:
    tasks = [{"id": i, **d} for i, d in result.tasks.items()]
    rows = [(t["id"], t.get("status", "(missing)"),
             shorten(last_line(t.get("error")) if t.get("status") == k.FAILED
                     else t.get("result"), 60))
            for t in tasks]
    emit(args, {"tasks": tasks, "timed_out": result.timed_out, **(extra or {})},
         table(("ID", "STATUS", "RESULT/ERROR"), rows))
    if result.missing():
        raise Failure(f"no such task: {', '.join(result.missing())}", EXIT_NOT_FOUND)
    if result.timed_out:
        raise Failure(f"timed out: {len(tasks) - len(result.finished())} task(s) unfinished")
    if result.failed():
        raise Failure(f"{len(result.failed())} task(s) failed")
    return EXIT_OK


# --- daemons ----------------------------------------------------------------------------------
def cron_entries(args: argparse.Namespace) -> list[CronEntry]:
    entries: list[CronEntry] = []
    for path in args.cron_file:
        entries += load_file(path)
    entries += [parse_spec(spec, args.timezone) for spec in args.cron]
    return check_unique(entries)


def cmd_scheduler(client: Client, args: argparse.Namespace) -> int:
    configure_logs(args.log_format, args.log_level)
    # a step retries for one interval at most (then run() backs off), so that a stop
    # request is heard while Redis is away
    client = client.bounded(max(1.0, args.interval))
    scheduler = Scheduler(
        client, cron_entries(args), interval=args.interval,
        recovery=Recovery(client.store, host=args.node_name),
        recovery_interval=args.recovery_interval,
        purge_interval=args.purge_interval,
    )
    if args.once:
        report = scheduler.run_once()
        data = {name: value for name, value in vars(report).items() if name != "recovered"}
        emit(args, data, "\n".join(f"{name}: {value or '-'}" for name, value in data.items()))
        return EXIT_FAILURE if report.errors else EXIT_OK
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: scheduler.stop())
    scheduler.run()
    return EXIT_OK


def cmd_listen(client: Client, args: argparse.Namespace) -> int:
    return daemon.run_listen(args, client)


def cmd_dashboard(client: Client, args: argparse.Namespace) -> int:
    try:  # the web extra is optional: say how to get it
        from blueque.web import server
    except ImportError as error:
        raise Failure(f"the dashboard needs the web extra: pip install 'blueque[web]' "
                      f"({error})", EXIT_USAGE) from error
    configure_logs("text", "INFO")
    try:
        return server.serve(client, args, cron_entries(args))
    except (OSError, ValueError) as error:
        raise Failure(f"cannot serve the dashboard: {error}", EXIT_USAGE) from error


def cmd_metrics(client: Client, args: argparse.Namespace) -> int:
    """The dashboard's /metrics alone (no web extra needed): every queue's figures, read from
    Redis at each scrape."""
    configure_logs("text", "INFO")
    try:
        server = MetricsServer(queue_registry(client.store), args.port, args.host)
    except OSError as error:
        raise Failure(f"cannot serve metrics on {args.host}:{args.port}: {error}",
                      EXIT_USAGE) from error
    print(f"blueque: metrics of every queue on http://{args.host}:{server.port}/metrics",
          file=sys.stderr, flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.close()
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    return demo.run(args.url, queue=args.queue, out=sys.stdout, err=sys.stderr)


# --- the parser -------------------------------------------------------------------------------
_UNSET = object()


def _argument(parse: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse type whose message is the parser's own (argparse hides a ValueError's)."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ConfigurationError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = parse.__name__
    return convert


duration = _argument(parse_duration)
eta_time = _argument(parse_eta)


def _option_value(text: str) -> object:
    """A queue default: a number or duration, or ``none`` to remove it."""
    return None if text.lower() in ("none", "") else parse_duration(text)


def _add_common(parser: argparse.ArgumentParser, top: bool) -> None:
    # the subcommand's copy must not overwrite a value given before the subcommand
    absent: Any = None if top else argparse.SUPPRESS
    parser.add_argument("--url", default=absent, help=(
        "Redis URL (default: $BLUEQUE_URL, else redis://localhost:6379/0)"))
    parser.add_argument("--json", action="store_true", default=False if top else absent,
                        help="print JSON for scripts instead of tables")


def _attempts_value(text: str) -> object:
    return None if text.lower() in ("none", "") else int(text)


def _add_task_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--max-attempts", dest="max_attempts", default=default,
                        type=int if default is None else _attempts_value,
                        metavar="N", help="runs allowed, counting crashes (default 1)")
    for name, what in (("retry_backoff", "first retry delay"),
                       ("retry_backoff_max", "longest retry delay"),
                       ("time_limit", "time limit of one run (SIGTERM, then SIGKILL)"),
                       ("kill_grace", "time between SIGTERM and SIGKILL at the time limit"),
                       ("result_ttl", "how long a finished task is kept")):
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=default,
                            type=duration if default is None else _argument(_option_value),
                            metavar="DURATION", help=f"{what} (90, 15m, 2h, 7d)")
    parser.add_argument("--checkpoint-max-bytes", dest="checkpoint_max_bytes", default=default,
                        type=int if default is None else _attempts_value, metavar="BYTES",
                        help="largest checkpoint a run may save (default 1048576: 1 MiB)")
    parser.add_argument("--max-preemptions", dest="max_preemptions", default=default,
                        type=int if default is None else _attempts_value, metavar="N",
                        help="runs a preemption may stop without spending an attempt before "
                             "the task fails (default 10)")


Command = Callable[[Client, argparse.Namespace], int]


def _add_dashboard_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=port_number, default=8080,
                        help="default 8080 (0: any free port, logged)")
    parser.add_argument("--token-file", metavar="FILE",
                        help="enable actions (cancel, retry, purge) for requests that carry "
                             "the token in this file (or in $BLUEQUE_DASHBOARD_TOKEN); "
                             "without one the dashboard is read-only")
    parser.add_argument("--refresh", type=positive_seconds, default=2.0,
                        help="seconds between live updates of a page (default 2)")
    parser.add_argument("--cron", action="append", default=[], metavar="NAME=CRON:QUEUE[:PARAMS]",
                        help="the scheduler's cron entries, to show their next runs; repeatable")
    parser.add_argument("--cron-file", action="append", default=[], metavar="FILE",
                        help="the scheduler's cron file(s), to show their next runs")
    parser.add_argument("--timezone", help="IANA time zone of the --cron entries (default UTC)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blueque", description="Blueque: a Redis job queue for very long jobs.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(parser, top=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, function: Callable[..., int], help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text,
                                  epilog=EXIT_CODES,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        _add_common(sub, top=False)
        sub.set_defaults(handler=function)
        return sub

    add("status", cmd_status, "queues with counts per state, listeners with their leases")
    sub = add("tasks", cmd_tasks, "list the tasks of a queue")
    sub.add_argument("queue")
    sub.add_argument("--status", choices=k.STATUSES, help="only tasks in this state")
    sub.add_argument("--limit", type=positive_int, default=20,
                     help="at most N per state (default 20)")
    sub = add("show", cmd_show, "every field of one task, and its checkpoint's size and age")
    sub.add_argument("task_id")
    sub.add_argument("--checkpoint", action="store_true",
                     help="print the task's checkpoint (its saved state) instead")
    sub = add("logs", cmd_logs, "a task's output (stdout and stderr), read from Redis")
    sub.add_argument("task_id")
    sub.add_argument("--attempt", type=positive_int,
                     help="which attempt (default: the newest)")
    sub.add_argument("--follow", "-f", action="store_true",
                     help="print what the attempt writes until it ends (waits for a task "
                          "that has not started yet)")

    sub = add("enqueue", cmd_enqueue, "submit a task (prints its id)")
    sub.add_argument("queue")
    sub.add_argument("parameters", help="a string, JSON by convention; - reads stdin")
    when = sub.add_mutually_exclusive_group()
    when.add_argument("--delay", type=duration, metavar="DURATION",
                      help="run after this long (90, 15m, 2h)")
    when.add_argument("--eta", type=eta_time, help=(
        "run at this time: Unix seconds or ISO 8601 (no offset: local time)"))
    sub.add_argument("--task-id", help="your own id; enqueueing an existing id does nothing")
    _add_task_options(sub, None)
    sub.add_argument("--wait", action="store_true", help="wait for the task and print it")
    sub.add_argument("--timeout", type=duration, help="with --wait: give up after this")

    sub = add("cancel", cmd_cancel, "cancel a task (a running one has its processes stopped)")
    sub.add_argument("task_id")
    sub.add_argument("--reason", default="by operator", help="recorded in the task's error")
    sub = add("preempt", cmd_preempt,
              "announce that a node goes away: its listeners stop taking tasks, and its tasks "
              "save and stop to resume elsewhere (without spending an attempt)")
    sub.add_argument("--node", metavar="NAME",
                     help="the node's name, as its listeners' --node-name (default: this "
                          "machine's fully qualified host name)")
    sub.add_argument("--grace", type=duration, default=90.0, metavar="DURATION",
                     help="notice before the node goes away: tasks still running then are "
                          "terminated and put back (default 90s)")
    sub.add_argument("--reason", help="recorded with the request (default: blueque preempt)")
    sub.add_argument("--withdraw", action="store_true",
                     help="withdraw the node's preemption (a false alarm)")
    sub = add("retry", cmd_retry, "make failed tasks pending again (attempts are kept)")
    sub.add_argument("task_id", nargs="?")
    sub.add_argument("--failed", metavar="QUEUE", help="every failed task of QUEUE")
    sub.add_argument("--limit", type=positive_int, default=None,
                     help="with --failed: oldest N only")
    sub = add("purge", cmd_purge, "delete finished tasks older than a duration")
    sub.add_argument("queue")
    sub.add_argument("--older-than", type=duration, required=True, metavar="DURATION")
    sub.add_argument("--status", choices=k.FINISHED_STATUSES, help="default: both")
    sub = add("configure", cmd_configure,
              "set or show a queue's defaults (a value of 'none' removes one)")
    sub.add_argument("queue")
    _add_task_options(sub, _UNSET)
    sub = add("forget-queue", cmd_forget_queue,
              "remove an empty queue without listeners from `blueque status` (and its defaults)")
    sub.add_argument("queue")
    sub = add("wait", cmd_wait, "wait until tasks finish (progress bar on stderr)")
    sub.add_argument("task_ids", nargs="+", metavar="TASK_ID")
    sub.add_argument("--timeout", type=duration, help="give up after this long")
    sub.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                     help="auto (default): on a terminal, one task's own progress bar "
                          "(fraction and message) or, for several, how many finished")

    sub = add("listen", cmd_listen, "run the listener daemon: fork one child per task")
    daemon.add_listen_arguments(sub)
    sub = add("scheduler", cmd_scheduler,
              "move due tasks, fire cron entries, recover dead listeners, purge old results")
    sub.add_argument("--cron", action="append", default=[], metavar="NAME=CRON:QUEUE[:PARAMS]",
                     help="a periodic task, e.g. 'report=0 3 * * *:reports:{\"kind\": 1}' "
                          "(6 fields: seconds last); repeatable")
    sub.add_argument("--cron-file", action="append", default=[], metavar="FILE",
                     help="periodic tasks from a .toml or .json file; repeatable")
    sub.add_argument("--timezone", help="IANA time zone of the --cron entries (default UTC)")
    sub.add_argument("--interval", type=positive_seconds, default=1.0, help="seconds between steps")
    sub.add_argument("--recovery-interval", type=positive_seconds, default=2.0,
                     help="seconds between recovery sweeps (default 2)")
    sub.add_argument("--purge-interval", type=positive_seconds, default=60.0,
                     help="seconds between purges of results past result_ttl (default 60)")
    sub.add_argument("--once", action="store_true", help="run one step and exit")
    daemon.add_node_name_argument(sub)
    sub.add_argument("--log-format", choices=("text", "json"), default="text")
    sub.add_argument("--log-level", type=log_level, default="INFO")
    sub = add("metrics", cmd_metrics,
              "serve every queue's Prometheus metrics (the dashboard's /metrics, without it)")
    sub.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default 127.0.0.1; 0.0.0.0 lets a Prometheus "
                          "on another host scrape it)")
    sub.add_argument("--port", type=port_number, default=9309,
                     help="default 9309 (0: any free port, printed)")
    sub = add("dashboard", cmd_dashboard,
              "serve the web dashboard and /metrics (read-only unless a token is given)")
    _add_dashboard_arguments(sub)
    sub = add("demo", cmd_demo, "run a demo: a private redis-server (unless --url or "
                                "$BLUEQUE_URL), a listener, a scheduler and a few tasks")
    sub.add_argument("--queue", default=demo.QUEUE, help=f"default {demo.QUEUE}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2, already explained)
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        if args.command == "demo":  # needs no connection: it may start its own Redis
            if args.url is not None:
                Settings.from_url(args.url)  # an empty or malformed --url: refused up front
            return cmd_demo(args)
        return int(args.handler(connect(args, ping=args.command not in DAEMONS), args))
    except Failure as failure:
        return _fail(str(failure), failure.code)
    except ConfigurationError as error:
        return _fail(str(error), EXIT_USAGE)
    except RedisUnavailable as error:
        return _fail(str(error), EXIT_UNREACHABLE)
    except TaskNotFound as error:
        return _fail(str(error), EXIT_NOT_FOUND)
    except (BluequeError, TimeoutError) as error:
        return _fail(str(error), EXIT_FAILURE)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_FAILURE)


def _fail(message: str, code: int) -> int:
    print(f"blueque: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
