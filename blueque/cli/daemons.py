"""The other long-running commands: `scheduler`, `metrics`, `dashboard`, and `demo`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from blueque import demo, eviction
from blueque.acl import Role
from blueque.cli.base import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    Commands,
    Failure,
    add_allow_eviction,
    add_allowed_host,
    emit,
    queue_name,
)
from blueque.cli.listen import add_log_arguments, add_node_name_argument
from blueque.client import Client
from blueque.config import Settings
from blueque.cron import CronEntry, check_unique, load_file, parse_spec
from blueque.display import port_number, positive_seconds
from blueque.errors import RedisUnavailable
from blueque.hosts import allowed_hosts
from blueque.logs import configure as configure_logs
from blueque.metrics import MetricsServer, queue_registry
from blueque.recovery import Recovery
from blueque.scheduler import Scheduler

log = logging.getLogger("blueque.web")


def register(commands: Commands) -> None:
    _add_scheduler(commands)
    sub = commands.add("metrics", cmd_metrics, "serve every queue's Prometheus metrics (the "
                       "dashboard's /metrics, without it)", daemon=True, prints=False,
                       role="inspector")
    sub.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default 127.0.0.1; 0.0.0.0 lets a Prometheus "
                          "on another host scrape it)")
    sub.add_argument("--port", type=port_number, default=9309,
                     help="default 9309 (0: any free port, printed)")
    add_allowed_host(sub, "metrics server")
    _add_dashboard(commands)
    sub = commands.add_standalone(
        "demo", cmd_demo, "run a demo: a private redis-server (unless --url or $BLUEQUE_URL), "
        "a listener, a scheduler and a few tasks", url_help=(
            "a Redis to run the demo on (default: $BLUEQUE_URL, else a private redis-server "
            "the demo starts and stops)"))
    sub.add_argument("--queue", type=queue_name, default=demo.QUEUE,
                     help=f"default {demo.QUEUE}")


def _add_cron_arguments(parser: argparse.ArgumentParser, cron: str, cron_file: str) -> None:
    parser.add_argument("--cron", action="append", default=[],
                        metavar="NAME=CRON:QUEUE[:PARAMS]", help=cron)
    parser.add_argument("--cron-file", action="append", default=[], metavar="FILE",
                        help=cron_file)
    parser.add_argument("--timezone", help="IANA time zone of the --cron entries (default UTC)")


def cron_entries(args: argparse.Namespace) -> list[CronEntry]:
    entries: list[CronEntry] = []
    for path in args.cron_file:
        entries += load_file(path)
    entries += [parse_spec(spec, args.timezone) for spec in args.cron]
    return check_unique(entries)


# --- scheduler --------------------------------------------------------------------------------
def _add_scheduler(commands: Commands) -> None:
    sub = commands.add("scheduler", cmd_scheduler, "move due tasks, fire cron entries, recover "
                       "dead listeners, purge old results", daemon=True, role="scheduler")
    _add_cron_arguments(
        sub, "a periodic task, e.g. 'report=0 3 * * *:reports:{\"kind\": 1}' (5 fields, or 6 "
             "with seconds last); repeatable",
        "periodic tasks from a .toml or .json file; repeatable")
    sub.add_argument("--interval", type=positive_seconds, default=1.0,
                     help="seconds between steps (default 1)")
    sub.add_argument("--recovery-interval", type=positive_seconds, default=2.0,
                     help="seconds between recovery sweeps (default 2)")
    sub.add_argument("--purge-interval", type=positive_seconds, default=60.0,
                     help="seconds between purges of results past result_ttl (default 60)")
    sub.add_argument("--once", action="store_true", help="run one step and exit")
    add_allow_eviction(sub, "scheduler")
    add_node_name_argument(sub)
    add_log_arguments(sub)


def cmd_scheduler(client: Client, args: argparse.Namespace) -> int:
    configure_logs(args.log_format, args.log_level)
    # a step retries for one interval at most (then run() backs off), so that a stop
    # request is heard while Redis is away
    client = client.bounded(max(1.0, args.interval))
    scheduler = Scheduler(
        client, cron_entries(args), interval=args.interval,
        # its own stalls are judged by its cadence: two sweeps, as a listener's lease
        recovery=Recovery(client.store, host=args.node_name,
                          watch_ms=int(2000 * args.recovery_interval)),
        recovery_interval=args.recovery_interval,
        purge_interval=args.purge_interval, allow_eviction=args.allow_eviction,
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


# --- metrics and the dashboard ----------------------------------------------------------------
def cmd_metrics(client: Client, args: argparse.Namespace) -> int:
    """The dashboard's /metrics alone (no web extra needed): every queue's figures, read from
    Redis at each scrape."""
    configure_logs("text", "INFO")
    _check_server(client, "inspector")
    try:
        server = MetricsServer(queue_registry(client.store), args.port, args.host,
                               allowed_hosts(args.host, args.allowed_host))
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


def _add_dashboard(commands: Commands) -> None:
    sub = commands.add("dashboard", cmd_dashboard, "serve the web dashboard and /metrics "
                       "(read-only unless a token is given)", daemon=True, prints=False,
                       role="inspector")
    sub.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default 127.0.0.1: this machine only)")
    sub.add_argument("--port", type=port_number, default=8080,
                     help="default 8080 (0: any free port, logged)")
    add_allowed_host(sub, "dashboard")
    sub.add_argument("--token-file", metavar="FILE",
                     help="enable actions (cancel, retry, purge) for requests that carry "
                          "the token in this file (or in $BLUEQUE_DASHBOARD_TOKEN); "
                          "without one the dashboard is read-only")
    sub.add_argument("--refresh", type=positive_seconds, default=2.0,
                     help="seconds between live updates of a page (default 2)")
    add_allow_eviction(sub, "dashboard")
    _add_cron_arguments(sub, "the scheduler's cron entries, to show their next runs; "
                             "repeatable", "the scheduler's cron file(s), to show their next runs")


def cmd_dashboard(client: Client, args: argparse.Namespace) -> int:
    try:  # the web extra is optional: say how to get it
        from blueque.web import server
    except ImportError as error:
        raise Failure(f"the dashboard needs the web extra: pip install -e '.[web]' in "
                      f"Blueque's checkout ({error})", EXIT_USAGE) from error
    configure_logs("text", "INFO")
    actions = bool(args.token_file or os.environ.get("BLUEQUE_DASHBOARD_TOKEN"))
    _check_server(client, "operator" if actions else "inspector", True, args.allow_eviction)
    try:
        return server.serve(client, args, cron_entries(args))
    except (OSError, ValueError) as error:
        raise Failure(f"cannot serve the dashboard: {error}", EXIT_USAGE) from error


def _check_server(client: Client, role: Role, dashboard: bool = False,
                  allow: bool | None = None) -> None:
    """Refuse a user that may not run what ``role`` runs (blueque.acl) and, for the
    ``dashboard``, a Redis that may evict Blueque's keys unless ``allow`` (blueque.eviction);
    one that does not answer yet is checked by every page or scrape instead (these servers
    wait for their Redis)."""
    try:
        store = client.store.bounded(1.0)
        store.check_server(role)
        policy = store.memory_policy() if dashboard else None
    except RedisUnavailable as error:
        log.warning("cannot check Redis now (%s); every page or scrape will say what is wrong",
                    error)
        return
    if policy is not None:
        eviction.check(policy, "dashboard", allow, log)


# --- demo -------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    """No connection of its own: without --url or $BLUEQUE_URL it starts its own Redis."""
    if args.url is not None:
        Settings.from_url(args.url)  # an empty or malformed --url: refused up front
    return demo.run(args.url, queue=args.queue, out=sys.stdout, err=sys.stderr)
