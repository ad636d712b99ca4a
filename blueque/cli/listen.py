"""`blueque listen`: its arguments, and the listener daemon they configure (blueque.daemon)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from blueque.cli.base import (
    Commands,
    add_allow_eviction,
    add_allowed_host,
    argument_type,
    positive_duration,
)
from blueque.client import Client
from blueque.daemon import ListenerDaemon
from blueque.daemon.options import ON_STOP, ListenerOptions, default
from blueque.display import (
    LOG_LEVELS,
    log_level,
    port_number,
    positive_int,
    positive_seconds,
)
from blueque.errors import CallbackError, ConfigurationError
from blueque.hosts import allowed_hosts
from blueque.jobs import Jobs
from blueque.logs import configure as configure_logs
from blueque.logs import printed_as_logs
from blueque.metrics import MetricsServer, serve_listener_metrics
from blueque.node import checked_node_name
from blueque.placement import parse_resources
from blueque.process import set_title
from blueque.queue import check_queue_name
from blueque.spool import default_directory as spool_directory
from blueque.tasklog import TaskLogSettings, default_directory

log = logging.getLogger("blueque.listen")


def register(commands: Commands) -> None:
    sub = commands.add("listen", run_listen,
                       "run the listener daemon: fork one child per task", daemon=True,
                       prints=False, role="listener")
    add_listen_arguments(sub)


def parse_queues(text: str) -> dict[str, int]:
    """``high:3,low`` -> {"high": 3, "low": 1}."""
    weights: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, weight = item.partition(":")
        check_queue_name(name)
        try:
            weights[name] = int(weight) if weight else 1
        except ValueError as error:
            raise ConfigurationError(f"bad queue weight in {item!r}: use QUEUE[:WEIGHT]"
                                     ) from error
        if weights[name] < 1:
            raise ConfigurationError(f"queue weight must be at least 1 in {item!r}")
    if not weights:
        raise ConfigurationError("no queue given: use QUEUE[:WEIGHT][,QUEUE[:WEIGHT]...]")
    return weights


def add_listen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queues", metavar="QUEUE[:WEIGHT][,...]",
                        help="queues to serve; a higher weight is served more often")
    parser.add_argument("function", metavar="package.module:function",
                        help="called with the Task in a forked child; its return value is the "
                             "result (a string, or JSON for other values)")
    parser.add_argument("--concurrency", type=positive_int, default=default("concurrency"),
                        help="tasks run at once (one child each); no task is reserved "
                             f"without a free slot (default {default('concurrency')})")
    parser.add_argument("--resources", type=argument_type(parse_resources), default={},
                        metavar="NAME=AMOUNT[,...]",
                        help="what this listener offers tasks enqueued with requires= "
                             "(gpu=2,memory=64G: any names; amounts with K, M, G, T or Ki, Mi, "
                             "Gi, Ti): it takes a task only if what its running tasks leave "
                             "free covers it; a task without requires runs anywhere")
    parser.add_argument("--reuse", type=positive_int, default=default("reuse"), metavar="N",
                        help="a task process runs up to N tasks one after another, then is "
                             "replaced (PROTOCOL.md 6.7): no fork per task, but what a task "
                             "leaves in the process (globals, threads, open files) stays for "
                             "the next; default 1, a fresh process per task")
    parser.add_argument("--max-memory-per-process", type=_byte_count, default=None,
                        metavar="SIZE",
                        help="with --reuse: a task process whose resident memory is over this "
                             "once its task has ended retires, and a fresh one takes the next "
                             "task (500M, 2G; K, M, G); logged at warning. Default: no bound")
    parser.add_argument("--exclusive", action="store_true",
                        help="never two runs of a task at once, even when this node is cut "
                             "off from Redis: a run is stopped before the lease can lapse "
                             "(PROTOCOL.md 6.6); a Redis outage longer than half a lease "
                             "stops every run")
    parser.add_argument("--on-stop", choices=ON_STOP, default=default("on_stop"),
                        help="on SIGTERM: keep children running for the next listener to "
                             "adopt (default), drain (wait for them), terminate them, or "
                             "preempt them (each saves and stops within --preempt-grace and "
                             "is put back without spending an attempt: a container's stop; "
                             "the default when the listener is PID 1)")
    parser.add_argument("--interval", type=positive_seconds, default=default("interval"),
                        help="lease renewal and recovery sweep interval in seconds (a dead "
                             "listener is recovered within 3 intervals; default "
                             f"{default('interval'):g})")
    parser.add_argument("--poll", type=positive_seconds, default=default("poll"),
                        help="fallback poll for enqueues that publish nothing, such as "
                             f"blueque 1.0.1's (seconds, default {default('poll'):g})")
    add_node_name_argument(parser)
    parser.add_argument("--log-dir", type=Path, default=None, metavar="DIR",
                        help="where each task attempt's stdout and stderr go on this node "
                             f"(default {default_directory()}); the last 64 KiB of each "
                             "attempt are also kept in Redis for `blueque logs`")
    parser.add_argument("--log-max-bytes", type=_byte_count, default=10 * 1024 * 1024,
                        metavar="BYTES", help="cap of one attempt's file: past it, what the "
                                             "file holds moves to .1 (default 10M; K, M, G)")
    parser.add_argument("--log-keep", type=positive_duration, default=7 * 86400.0,
                        metavar="DURATION", help="remove task log files older than this, and "
                                                 "expire unfinished streams after it (7d)")
    parser.add_argument("--spool-dir", type=Path, default=None, metavar="DIR",
                        help="where a run's ending that Redis refuses or cannot take is held "
                             "on this node until it can (default "
                             f"{spool_directory()}); the node's next listener records "
                             "what a dead one held")
    parser.add_argument("--no-task-logs", action="store_true",
                        help="do not capture task output: it goes to the listener's stderr")
    parser.add_argument("--preempt-grace", type=positive_duration,
                        default=default("preempt_grace"), metavar="DURATION",
                        help="on SIGUSR1 (this node goes away), and SIGTERM with --on-stop="
                             "preempt, how long its tasks have to save and stop before they "
                             "are terminated and put back "
                             f"({default('preempt_grace'):g}s)")
    parser.add_argument("--identity", help=argparse.SUPPRESS)
    add_allow_eviction(parser, "listener")
    add_log_arguments(parser)
    parser.add_argument("--metrics-port", type=port_number, metavar="PORT",
                        help="serve this listener's Prometheus metrics on http://HOST:PORT/"
                             "metrics (0: any free port, logged)")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                        help="address of the metrics server (default 127.0.0.1; 0.0.0.0 "
                             "lets a Prometheus on another host scrape it)")
    add_allowed_host(parser, "metrics server", "--metrics-allowed-host")


def _byte_count(text: str) -> int:
    units = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    number, unit = text.strip().upper().rstrip("B") or "x", ""
    if number[-1:] in units:
        number, unit = number[:-1], number[-1]
    try:
        value = int(float(number) * units[unit])
    except ValueError:
        value = 0
    if value < 1024:
        raise argparse.ArgumentTypeError(f"must be a size of at least 1K (such as 512K or "
                                         f"10M), not {text!r}")
    return value


def _node_name_type(value: str) -> str:
    try:
        return checked_node_name(value)
    except ConfigurationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """--log-format and --log-level, of `listen` and `scheduler`."""
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="text lines (default), or one JSON object a line for a log "
                             "collector")
    parser.add_argument("--log-level", type=log_level, default="INFO", metavar="LEVEL",
                        help=f"{', '.join(LOG_LEVELS)} (default INFO)")


def add_node_name_argument(parser: argparse.ArgumentParser) -> None:
    """--node-name, of `listen` and `scheduler`."""
    parser.add_argument(
        "--node-name", type=_node_name_type, metavar="NAME",
        help="this node's name, first in listener ids ([NAME]_[pid]) and node identities "
             "(default: the fully qualified host name); give nodes that share a host name "
             "(containers, cloned VMs, 'localhost') distinct names")


def task_log_settings(args: argparse.Namespace) -> TaskLogSettings | None:
    if args.no_task_logs:
        return None
    settings = TaskLogSettings(args.log_dir or default_directory(), args.log_max_bytes,
                               args.log_keep)
    try:
        settings.directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigurationError(f"cannot use --log-dir {settings.directory}: {error}; give "
                                 "a writable directory or --no-task-logs") from error
    settings.clean()
    return settings


def listener_options(args: argparse.Namespace) -> ListenerOptions:
    """The daemon's options, as `blueque listen`'s arguments give them."""
    return ListenerOptions(
        parse_queues(args.queues), args.function, concurrency=args.concurrency,
        on_stop=args.on_stop, interval=args.interval, poll=args.poll, identity=args.identity,
        node_name=args.node_name, allow_eviction=args.allow_eviction,
        spool_dir=args.spool_dir, exclusive=args.exclusive, reuse=args.reuse,
        max_memory_per_process=args.max_memory_per_process,
        task_logs=task_log_settings(args), preempt_grace=args.preempt_grace,
        metrics=args.metrics_port is not None, resources=args.resources)


def run_listen(client: Client, args: argparse.Namespace) -> int:
    configure_logs(args.log_format, args.log_level)
    # as `python -m` does (and RQ and Celery): the current directory's packages are importable
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    daemon = ListenerDaemon(client, listener_options(args))
    set_title(f"blueque listen {args.queues} {args.function} ({daemon.id})")
    try:
        with printed_as_logs("blueque.task_module"):
            function = daemon.load_function()
    except CallbackError as error:
        raise ConfigurationError(
            f"{error}. The listener imports it before taking any task: check the spelling "
            "(package.module:function), and run `blueque listen` from the directory that holds "
            "the package, add that directory to PYTHONPATH, or install the package into this "
            f"Python ({sys.executable})"
        ) from error
    if isinstance(function, Jobs):
        log.info("%s is a registry of %d job(s): %s", args.function, len(function),
                 ", ".join(function))
    server: MetricsServer | None = None
    if daemon.metrics is not None:
        try:
            server = serve_listener_metrics(
                daemon.metrics, args.metrics_port, args.metrics_host,
                allowed_hosts(args.metrics_host, args.metrics_allowed_host))
        except OSError as error:
            raise ConfigurationError(f"cannot serve metrics on {args.metrics_host}:"
                                     f"{args.metrics_port}: {error}") from error
    try:
        return daemon.run()
    finally:
        if server is not None:
            server.close()
