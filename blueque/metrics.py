"""Prometheus metrics: queue figures read from Redis, and each listener daemon's own counters.

Two exporters, two sets of names, so that summing over scrape targets never counts twice:

- ``QueueCollector`` reads Redis at scrape time (the dashboard's ``/metrics``, one per cluster):
  tasks per queue and state, the oldest pending task's age, tasks finished per outcome (from
  ``blueque_outcome_counts_[queue]``, written by the scripts that end tasks), listeners and the
  slots each reported at its last renewal.
- ``ListenerMetrics`` lives in a listener daemon (``blueque listen --metrics-port``): its slots,
  late lease renewals, lost leases, recoveries and adoptions by its sweeps, the tasks its
  children ran per outcome, and their run times.

Names follow Prometheus conventions: ``blueque_`` prefix, base units (``_seconds``), counters
end in ``_total``. docs/how-to/observability.md lists them with an example alert rule.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from blueque import keyed
from blueque.errors import BluequeError, ConfigurationError
from blueque.hosts import HostRule
from blueque.policy import field_float
from blueque.recovery import RecoveryReport
from blueque.spool import Spool
from blueque.statuses import COMPLETE, FAILED, OUTCOMES, SCHEDULED, STATES
from blueque.store import RedisStore

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger("blueque.metrics")

#: Run-time buckets for jobs of seconds to days (seconds).
RUN_TIME_BUCKETS = (1, 10, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 259200,
                    float("inf"))


def pending_age(oldest: tuple[str, dict[str, str]] | None, at: float) -> float:
    """Seconds the next task in line has waited (since it last became pending: ``updated``,
    else ``created``), from a store.oldest_pending() reply; 0 if none."""
    if oldest is None:
        return 0.0
    times = oldest[1]
    for field in ("updated", "created"):
        try:
            age = at - float(times[field])
        except (KeyError, ValueError):
            continue
        if math.isfinite(age):
            return max(0.0, age)
    return 0.0


def task_outcome(data: dict[str, str]) -> str:
    """How a task's latest run ended, from its hash: one of statuses.OUTCOMES, or "unknown"."""
    status = data.get("status")
    if status == COMPLETE:
        return "complete"
    if status == FAILED:
        return "cancelled" if data.get("cancelled") else "failed"
    if status == SCHEDULED and data.get("error"):
        return "retry"
    return "unknown"


#: Seconds a scrape keeps retrying a Redis that went away before it reports it down.
SCRAPE_RETRY = 1.0


class QueueCollector(Collector):
    """Cluster-wide figures, read from Redis at each scrape: a few pipelines of O(1) commands
    per queue, and one of listener hashes."""

    def __init__(self, store: RedisStore) -> None:
        # a scrape waits at most a moment for a Redis that went away (then blueque_redis_up
        # 0), not the client's whole retry_deadline: Prometheus times a scrape out at 10 s
        self.store = store.bounded(SCRAPE_RETRY)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("blueque_redis_up", "1 if Redis answered this scrape, else 0")
        try:
            families = self._families()
        except BluequeError as error:
            log.warning("metrics: %s", error)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self) -> list[Metric]:
        tasks = GaugeMetricFamily(
            "blueque_tasks", "Tasks per queue and state (cancelled tasks are not counted as "
            "failed)", labels=["queue", "state"])
        age = GaugeMetricFamily(
            "blueque_queue_oldest_pending_age_seconds",
            "How long the next pending task of the queue has waited (0 when none is pending)",
            labels=["queue"])
        finished = CounterMetricFamily(
            "blueque_tasks_finished",
            "Tasks of the queue that ended, per outcome (complete, failed, cancelled, retry)",
            labels=["queue", "outcome"])
        listeners = GaugeMetricFamily("blueque_queue_listeners", "Listeners of the queue",
                                      labels=["queue"])
        paused = GaugeMetricFamily("blueque_queue_paused", "1 while the queue is paused (no "
                                   "listener starts its tasks), else 0", labels=["queue"])
        work = GaugeMetricFamily(
            "blueque_queue_work", "Tasks of the queue to run or running: pending (none while "
            "it is paused), reserved and started; what an autoscaler scales listeners on",
            labels=["queue"])
        slots = GaugeMetricFamily(
            "blueque_listener_info_slots",
            "Task slots of each registered listener (its --concurrency)",
            labels=["listener", "host"])
        busy = GaugeMetricFamily(
            "blueque_listener_info_busy_slots",
            "Slots in use per listener, as it wrote at its last lease renewal",
            labels=["listener", "host"])
        at = self.store.now()
        ids: set[str] = set()
        queues = [queue for queue, _ in self.store.known_queues()]
        for queue, counts, oldest, done in zip(
                queues, self.store.counts_many(queues), self.store.oldest_pending_many(queues),
                self.store.outcome_counts_many(queues), strict=True):
            for state in STATES:  # cancelled apart from failed
                tasks.add_metric([queue, state], getattr(counts, state))
            listeners.add_metric([queue], counts.listeners)
            paused.add_metric([queue], int(counts.paused))
            work.add_metric([queue], (0 if counts.paused else counts.pending)
                            + counts.reserved + counts.started)
            age.add_metric([queue], pending_age(oldest, at))
            for outcome in OUTCOMES:
                finished.add_metric([queue, outcome], done.get(outcome, 0))
        ids = self.store.listener_ids_many(queues)
        ordered = sorted(ids)
        for listener, info in zip(ordered, self.store.listener_infos(ordered), strict=True):
            if not info:
                continue  # its info expired: a dead listener not yet recovered
            host = info.get("host", "")
            # a count that is missing or corrupt is shown as 0
            slots.add_metric([listener, host], field_float(info.get("concurrency")) or 0.0)
            busy.add_metric([listener, host], field_float(info.get("busy")) or 0.0)
        return [tasks, age, finished, listeners, paused, work, slots, busy, *self._keys()]

    def _keys(self) -> list[Metric]:
        """Each concurrency key's limit, holders and waiters (PROTOCOL.md 5.22): one series
        per key with a limit or in use, never per task."""
        limit = GaugeMetricFamily("blueque_key_limit", "Runs a concurrency key allows at once "
                                  "across the fleet (keys with a limit)", labels=["key"])
        holding = GaugeMetricFamily("blueque_key_holding",
                                    "Runs holding a slot of the concurrency key", labels=["key"])
        waiting = GaugeMetricFamily("blueque_key_waiting", "Tasks waiting for a slot of the "
                                    "concurrency key", labels=["key"])
        for state in self.store.perform(keyed.key_states):
            if state.limit is not None:
                limit.add_metric([state.key], state.limit)
            holding.add_metric([state.key], state.holding)
            waiting.add_metric([state.key], state.waiting)
        return [limit, holding, waiting]


class _TaskMemory(Collector):
    """``blueque_listener_task_process_resident_bytes{listener, pid}``: each task process's
    resident memory (running or idle: warm processes, --max-memory-per-process), read from
    /proc when scraped."""

    def __init__(self, listener_id: str, memory: Callable[[], dict[int, int]]) -> None:
        self.listener_id, self.memory = listener_id, memory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "blueque_listener_task_process_resident_bytes",
            "Resident memory (RSS) of each task process of this listener, running a task or "
            "idle", labels=["listener", "pid"])
        for pid, size in self.memory().items():
            family.add_metric([self.listener_id, str(pid)], float(size))
        yield family


class ListenerMetrics:
    """One listener daemon's counters; the daemon calls these hooks, never the other way."""

    def __init__(self, store: RedisStore, listener_id: str, concurrency: int,
                 busy: Callable[[], int], registry: CollectorRegistry | None = None,
                 memory: Callable[[], dict[int, int]] | None = None,
                 spool: Spool | None = None) -> None:
        """``busy``: its slots in use, ``memory``: the resident memory of each of its task
        processes by pid, and ``spool``: whether its spool takes endings, read at scrape
        time."""
        self.store = store
        self.registry = registry or CollectorRegistry()
        if memory is not None:
            self.registry.register(_TaskMemory(listener_id, memory))
        labels = {"listener": listener_id}
        if spool is not None:
            failing = Gauge("blueque_listener_spool_failing",
                            "1 while this listener's spool (--spool-dir) cannot be written: an "
                            "ending Redis refuses is then held in memory only",
                            list(labels), registry=self.registry)
            failing.labels(**labels).set_function(lambda: float(spool.failing is not None))
        self.slots = Gauge("blueque_listener_slots", "Task slots (--concurrency)",
                           list(labels), registry=self.registry).labels(**labels)
        self.slots.set(concurrency)
        self.busy = Gauge("blueque_listener_busy_slots", "Slots running a task now",
                          list(labels), registry=self.registry).labels(**labels)
        self.busy.set_function(lambda: float(busy()))  # read at scrape time
        self.late = Counter(
            "blueque_listener_lease_renewals_late",
            "Lease renewals that came more than one interval after the previous one (the "
            "lease lasts two: a paused or starved daemon)", registry=self.registry)
        self.lost = Counter(
            "blueque_listener_leases_lost",
            "Renewals that found the lease gone: the listener had been declared dead",
            ["queue"], registry=self.registry)
        self.recoveries = Counter(
            "blueque_listener_recoveries", "Dead listeners this daemon's sweeps recovered",
            registry=self.registry)
        self.recovered = Counter(
            "blueque_listener_recovered_tasks",
            "Tasks of dead listeners recovered by this daemon's sweeps, per verdict",
            ["verdict"], registry=self.registry)
        self.adopted = Gauge(
            "blueque_listener_adopted_tasks",
            "Running tasks of dead listeners on this host that its last sweep adopted",
            registry=self.registry)
        self.finished = Counter(
            "blueque_listener_tasks_finished",
            "Task runs of this listener's children that ended, per queue and outcome",
            ["queue", "outcome"], registry=self.registry)
        self.run_time = Histogram(
            "blueque_task_run_seconds", "Run time of task attempts on this listener",
            ["queue", "outcome"], buckets=RUN_TIME_BUCKETS, registry=self.registry)
        self.renewal_time = Gauge(
            "blueque_listener_renewal_seconds",
            "How long the latest lease renewal took (one round trip): more than a tenth of "
            "--interval is a slow link, on which the lease is not promised to hold",
            registry=self.registry)
        self._last_renewal: float | None = None

    def renewal(self, at: float, interval: float) -> None:
        """At registration and every renewal (monotonic clock): each writes the leases."""
        if self._last_renewal is not None and at - self._last_renewal > interval:
            self.late.inc()
        self._last_renewal = at

    def renewal_took(self, seconds: float) -> None:
        self.renewal_time.set(seconds)

    def lease_lost(self, queue: str) -> None:
        self.lost.labels(queue=queue).inc()

    def swept(self, report: RecoveryReport) -> None:
        self.recoveries.inc(len(report.listeners))
        for verdict in ("requeued", "retried", "failed"):
            self.recovered.labels(verdict=verdict).inc(getattr(report, verdict))
        self.adopted.set(report.adopted)

    def task_ended(self, task_id: str, queue: str, attempt: int | None,
                   duration: float) -> None:
        """A child exited and its ending is recorded: read the outcome from the task (one
        HGETALL); while Redis is away, or if the task moved on, it counts as "unknown"."""
        try:
            data = self.store.task_data(task_id)
        except BluequeError:
            data = {}
        fresh = attempt is None or data.get("attempts") == str(attempt)
        outcome = task_outcome(data) if fresh else "unknown"
        self.finished.labels(queue=queue, outcome=outcome).inc()
        self.run_time.labels(queue=queue, outcome=outcome).observe(duration)


class MetricsServer:
    """``/metrics`` over HTTP in a thread (of the listener daemon, or of ``blueque metrics``),
    answering only to the host names ``allowed`` (blueque.hosts; None: any). Its socket is
    closed in forked children (os.register_at_fork), so a task process never holds the port
    after its listener is gone."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str,
                 allowed: Sequence[str] | None = None) -> None:
        if not 0 <= port <= 65535:
            raise ConfigurationError(f"--metrics-port must be a port number from 0 to 65535, "
                                     f"not {port}")
        app = make_wsgi_app(registry)
        if allowed is not None:
            app = host_checked(app, HostRule.of(allowed, "metrics server"))
        # IPv4 or IPv6, as the host resolves (the server class names its family)
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, address = found[0][0], str(found[0][4][0])
        server_class = type("MetricsHTTPServer", (ThreadingWSGIServer,),
                            {"address_family": family})
        self.server: WSGIServer = make_server(address, port, app, server_class,
                                              handler_class=_QuietHandler)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       name="blueque-metrics", daemon=True)
        self.thread.start()
        _SERVERS.append(self.server)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.server in _SERVERS:
            _SERVERS.remove(self.server)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged, one line each to stderr (prometheus_client's are not)."""


def host_checked(app: WSGIApplication, rule: HostRule) -> WSGIApplication:
    """``app``, answering 400 to a request whose Host header ``rule`` refuses."""
    def checked(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        host = environ.get("HTTP_HOST")
        message = rule.refusal(host)
        if message is None:
            return app(environ, start_response)
        log.warning("metrics: refused a request for host %r", host or "")
        body = message.encode()
        start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8"),
                                           ("Content-Length", str(len(body)))])
        return [body]

    return checked


_SERVERS: list[WSGIServer] = []


def _close_in_child() -> None:
    for server in _SERVERS:
        with contextlib.suppress(OSError):
            server.socket.close()
    _SERVERS.clear()


os.register_at_fork(after_in_child=_close_in_child)


def serve_listener_metrics(metrics: ListenerMetrics, port: int, host: str,
                           allowed: Sequence[str] | None = None) -> MetricsServer:
    server = MetricsServer(metrics.registry, port, host, allowed)
    log.info("metrics on http://%s:%d/metrics", host, server.port)
    return server


def scrape(registry: CollectorRegistry) -> bytes:
    """The text exposition of a registry (what /metrics serves)."""
    return bytes(generate_latest(registry))


def queue_registry(store: RedisStore) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(store))
    return registry
