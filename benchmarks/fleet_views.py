"""How long the views of a fleet take (issue 29 item 3): `blueque status` and `blueque status
--json`, the dashboard's overview and nodes pages, and how big the Prometheus endpoint is,
with 1,000 listeners over 50 queues.

    python -m benchmarks.fleet_views                 # 1,000 listeners over 50 queues
    python -m benchmarks.fleet_views --smoke         # 40 over 5: seconds, proves it runs

``measure_views(url)`` is the measurement (``measure``, its timing part over a fleet that is
already there, is what ``benchmarks.fleet`` calls while its simulated fleet runs): it fills the
Redis at ``url`` (an empty database) the way a fleet writes it, through Blueque's own
operations: each listener registers and renews as the listener daemon does (its Membership:
info hash, lease, listener set, one renewal), on a node of its own name (5 listeners a node),
and runs three tasks of its queue through the library's Listener and Processor (two ended, so
that the nodes page has a history of each; one left running); each queue also holds pending
and scheduled tasks. Then it times, in this process, `blueque status` and `status --json`
(blueque.cli.main: the command's work, without the interpreter's start; and its round trips,
a new client's handshake included), and, from a real
`blueque dashboard` process, full HTTP requests of the overview (first page), the nodes page
(first and last page) and /metrics, whose size and number of series it reports. Prints
median, p95 and max per view in milliseconds, with the median CPU time of the process that did
the work (on a busy machine the wall time moves with the others' work, the CPU time hardly),
and the Redis round trips of a status call.
Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

import blueque
from benchmarks.dashboard_pages import start_dashboard, timed
from benchmarks.wait_round_trips import counting
from blueque.cli import main as blueque_main
from blueque.daemon.membership import Membership
from blueque.listener import Listener
from blueque.node import node_identity
from blueque.testing import RedisServer, free_port, stop_process

#: The issue's fleet.
LISTENERS = 1000
QUEUES = 50
#: Listeners a node runs (each node a --node-name of its own).
PER_NODE = 5
#: The listeners' renewal interval: long, so that no lease lapses while the views are timed.
INTERVAL = 600.0
#: The target of every view (issue 29 item 3), for the printout.
TARGET_MS = 300.0


@dataclass(frozen=True)
class ViewFigures:
    """Per view: (median, p95, max, median CPU) in ms; status round trips; the metrics
    page's size."""

    times: dict[str, tuple[float, float, float, float]]
    status_round_trips: int
    metrics_bytes: int
    metrics_series: int
    listeners: int
    queues: int

    def rows(self) -> list[dict[str, Any]]:
        """As benchmarks.fleet prints and keeps them: {label, value, unit} and more."""
        rows: list[dict[str, Any]] = [
            {"label": f"{view}, median", "value": round(median, 1), "unit": "ms",
             "p95_ms": round(p95, 1), "max_ms": round(worst, 1), "cpu_ms": round(cpu, 1)}
            for view, (median, p95, worst, cpu) in self.times.items()]
        rows.append({"label": "blueque status, Redis round trips",
                     "value": self.status_round_trips, "unit": ""})
        rows.append({"label": "/metrics, size", "value": self.metrics_bytes, "unit": "bytes",
                     "series": self.metrics_series})
        return rows

    def as_dict(self) -> dict[str, object]:
        return {"times_ms": {view: {"median": m, "p95": p, "max": x, "cpu": c}
                             for view, (m, p, x, c) in self.times.items()},
                "status_round_trips": self.status_round_trips,
                "metrics_bytes": self.metrics_bytes, "metrics_series": self.metrics_series,
                "listeners": self.listeners, "queues": self.queues}


def queue_name(n: int) -> str:
    return f"fleet-{n:02d}"


def populate(url: str, listeners: int = LISTENERS, queues: int = QUEUES) -> None:
    """The fleet's state in Redis, written by Blueque's own operations (module docstring)."""
    with contextlib.closing(blueque.Client(url)) as client:
        _populate(client, listeners, queues)


def _populate(client: blueque.Client, listeners: int, queues: int) -> None:
    store = client.store
    params = json.dumps({"document": "x" * 100})
    for n in range(queues):
        queue = client.get_queue(queue_name(n))
        queue.enqueue_many([params] * (3 * -(-listeners // queues) + 40))
        for k in range(5):
            queue.schedule(params, store.now() + 3600 + k)
    for n in range(listeners):
        node_name = f"node-{n // PER_NODE:04d}.fleet.example"
        listener_id = f"{node_name}_{10_000 + n}"
        queue = queue_name(n % queues)
        membership = Membership(store, listener_id, node_identity(node_name), node_name,
                                {queue: 1}, INTERVAL)
        membership.register(concurrency=4)
        reserver = Listener(queue, store, identity=listener_id)
        running: list[str] = []
        for run in range(3):
            task = reserver.reserve()
            assert task is not None, "the queue ran out of tasks"
            processor = client.get_processor(task)
            processor.start(20_000 + 3 * n + run)
            if run < 2:
                processor.complete('{"ok": true}')
            else:
                running.append(task.id)
        membership.renew(len(running), {}, int(INTERVAL * 3), running)


def _status_call(url: str, *extra: str) -> Callable[[], None]:
    def call() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            code = blueque_main(["--url", url, *extra, "status"])
        assert code == 0, f"blueque {' '.join(extra)} status exited {code}"
    return call


def _times(call: Callable[[], object], samples: int, cpu: Callable[[], float]
           ) -> tuple[float, float, float, float]:
    """Wall time of ``call`` (median, p95, max, ms) and the median CPU time it took of the
    process that does the work (``cpu``: its seconds so far), which a busy machine's other
    work hardly moves, as it moves the wall time."""
    call()  # warm: scripts, connections, templates
    times, used = [], []
    for _ in range(samples):
        started, spent = time.perf_counter(), cpu()
        call()
        times.append((time.perf_counter() - started) * 1000)
        used.append((cpu() - spent) * 1000)
    times.sort()
    return (statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.95))],
            times[-1], statistics.median(used))


def _cpu_of(pid: int) -> Callable[[], float]:
    process = psutil.Process(pid)

    def seconds() -> float:
        spent = process.cpu_times()
        return float(spent.user + spent.system)
    return seconds


def round_trips(call: Callable[[], object]) -> int:
    """The round trips of ``call``'s second time (its client's clock has measured Redis',
    a TIME once a minute, and its connections are made), counted where redis-py writes each
    request to its socket (a pipeline is one): INFO's reads would count a long pipeline's
    bytes, which the server reads in several."""
    call()
    with counting(threading.current_thread()) as sent:
        call()
    return sent[0]


def measure_views(url: str, listeners: int = LISTENERS, queues: int = QUEUES,
                  samples: int = 15) -> ViewFigures:
    """Fill the (empty) Redis at ``url`` with the fleet and time its views (module
    docstring)."""
    populate(url, listeners, queues)
    return time_views(url, listeners, queues, samples)


def measure(url: str, queues: Sequence[str], listeners: int, smoke: bool
            ) -> list[dict[str, Any]]:
    """benchmarks.fleet's views section: the views of the fleet it runs against ``url`` (its
    simulated ``listeners`` over ``queues``, renewing and sweeping meanwhile: nothing is
    added to it), as rows {label, value, unit, ...}."""
    return time_views(url, listeners, len(queues), 3 if smoke else 15).rows()


def time_views(url: str, listeners: int, queues: int, samples: int) -> ViewFigures:
    """Time the views of the fleet Redis at ``url`` holds (``listeners`` over ``queues``,
    for the printout and the nodes page's last page)."""
    status, status_json = _status_call(url), _status_call(url, "--json")
    times = {"blueque status": _times(status, samples, time.process_time),
             "blueque status --json": _times(status_json, samples, time.process_time)}
    trips = round_trips(status)
    port = free_port()
    log = Path(tempfile.gettempdir()) / f"fleet-views-dashboard-{os.getpid()}.log"
    dashboard = start_dashboard(url, port, log)
    try:
        base = f"http://127.0.0.1:{port}"
        last = -(-listeners // 50)
        for name, path in (("dashboard overview (/)", "/"), ("dashboard nodes (/nodes)", "/nodes"),
                           (f"dashboard nodes, last page ({last})", f"/nodes?page={last}"),
                           ("/metrics", "/metrics")):
            times[name] = _times(lambda path=path: timed(base + path), samples,
                                 _cpu_of(dashboard.pid))
        with urllib.request.urlopen(base + "/metrics", timeout=30) as response:
            text = response.read().decode()
    finally:
        stop_process(dashboard)
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return ViewFigures(times, trips, len(text.encode()), series, listeners, queues)


def report(figures: ViewFigures) -> str:
    lines = [f"{figures.listeners:,} listeners over {figures.queues} queues "
             f"(target: each view under {TARGET_MS:.0f} ms)",
             f"{'view':<38} {'median':>8} {'p95':>8} {'max':>8} {'cpu':>8}"]
    for view, (median, p95, worst, cpu) in figures.times.items():
        lines.append(f"{view:<38} {median:8.1f} {p95:8.1f} {worst:8.1f} {cpu:8.1f}")
    lines.append("(ms; cpu: the median CPU time of the process that does the work: this one "
                 "for status, the dashboard's for its pages)")
    lines.append(f"blueque status: {figures.status_round_trips} Redis round trips")
    lines.append(f"/metrics: {figures.metrics_bytes:,} bytes, {figures.metrics_series:,} series")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--listeners", type=int, default=LISTENERS)
    parser.add_argument("--queues", type=int, default=QUEUES)
    parser.add_argument("--samples", type=int, default=15, help="timed calls per view")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--smoke", action="store_true", help="a small fleet: proves it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.listeners, args.queues, args.samples = 40, 5, 2
    with RedisServer() as server:
        started = time.monotonic()
        figures = measure_views(server.url, args.listeners, args.queues, args.samples)
        print(report(figures))
        print(f"(filled and measured in {time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(figures.as_dict(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
