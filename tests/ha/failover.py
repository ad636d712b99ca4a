"""The failover scenario shared by the HA tests and benchmarks/ha_figures.py.

Three real listener daemons drain tasks that a producer keeps enqueueing while the master is
SIGKILLed mid-run; the scenario returns what happened so the caller can assert and report.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from daemons import Daemon, daemons

import blueque
from blueque.testing import wait_for

JOB = "tests.ha.ha_jobs:record"


def listen_command(url: str, queue: str, concurrency: int, interval: float,
                   job: str = JOB) -> list[str]:
    return [sys.executable, "-m", "blueque.cli", "listen", queue, job, "--url", url,
            "--concurrency", str(concurrency), "--interval", str(interval)]


@dataclass
class Outcome:
    """What a failover run produced."""

    acknowledged: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    runs: Counter[str] = field(default_factory=Counter)
    daemons_alive: bool = False
    daemon_exit_codes: list[int] = field(default_factory=list)
    kill_after_complete: int = 0
    write_resumed_s: float = 0.0
    durable_write_resumed_s: float = 0.0
    drain_s: float = 0.0
    logs: list[str] = field(default_factory=list)

    @property
    def ran_twice(self) -> list[str]:
        return sorted(task for task, count in self.runs.items() if count > 1)

    def figures(self) -> dict[str, object]:
        return {
            "tasks": len(self.acknowledged),
            "complete": self.statuses.get("complete", 0),
            "ran_twice": len(self.ran_twice),
            "write_resumed_s": round(self.write_resumed_s, 2),
            "durable_write_resumed_s": round(self.durable_write_resumed_s, 2),
            "drain_s": round(self.drain_s, 2),
        }


def run_failover(
    tmp: Path,
    url: str,
    kill_master: Callable[[], None],
    queues: tuple[str, ...] = ("ha",),
    tasks: int = 500,
    listeners: int = 3,
    concurrency: int = 2,
    kill_at: int = 150,
    seconds: float = 0.05,
    plain_url: str | None = None,
    probe_queue: str = "probe",
    drain_timeout: float = 120.0,
    strict: bool = True,
) -> Outcome:
    """Enqueue ``tasks`` (one by one, spread over ``queues``) while ``listeners`` daemons per
    queue drain them; call ``kill_master`` once ``kill_at`` tasks are complete. If they do not
    all complete within ``drain_timeout``: AssertionError with a diagnosis, or (``strict``
    False) the outcome as it stands."""
    outcome = Outcome()
    runs_log = tmp / "runs.log"
    client = blueque.Client(url)
    probe = blueque.Client(plain_url or url.split("?", 1)[0])
    producer_error: list[BaseException] = []

    def produce() -> None:
        try:
            for n in range(tasks):
                queue = client.get_queue(queues[n % len(queues)])
                params = json.dumps({"log": str(runs_log), "seconds": seconds, "n": n})
                outcome.acknowledged.append(queue.enqueue(params))
                time.sleep(0.004)
        except BaseException as error:  # reported by the caller
            producer_error.append(error)

    def complete() -> int:
        return sum(client.get_queue(q).stats().complete for q in queues)

    with daemons(tmp) as started:
        started += [Daemon(listen_command(url, queue, concurrency, interval=2.0),
                           tmp / f"daemon-{queue}-{n}.log")
                    for queue in queues for n in range(listeners)]
        began = time.monotonic()
        producer = threading.Thread(target=produce, name="producer")
        producer.start()
        try:
            wait_for(lambda: complete() >= kill_at or producer_error, timeout=120)
            outcome.kill_after_complete = complete()
            killed = time.monotonic()
            kill_master()
            probe.get_queue(probe_queue).enqueue("{}")  # retries until a master accepts it
            outcome.write_resumed_s = time.monotonic() - killed
            client.get_queue(probe_queue).enqueue("{}")  # and until a replica acknowledges it
            outcome.durable_write_resumed_s = time.monotonic() - killed
        finally:
            producer.join(120)
        if producer_error:
            raise producer_error[0]
        try:
            wait_for(lambda: complete() >= tasks, timeout=drain_timeout, interval=0.1)
        except TimeoutError:
            if strict:
                raise AssertionError(_diagnose(client, outcome.acknowledged, started)) from None
        finally:
            outcome.drain_s = time.monotonic() - began
            outcome.daemons_alive = all(d.alive() for d in started)
            outcome.daemon_exit_codes = [d.stop() for d in started]
            outcome.logs = [d.log() for d in started]
    _tally(outcome, client, runs_log)
    client.close()
    probe.close()
    return outcome


def _tally(outcome: Outcome, client: blueque.Client, runs_log: Path) -> None:
    """The tasks' final statuses, and how often each task's function ran."""
    for data in client.store.task_data_many(outcome.acknowledged):
        outcome.statuses[data.get("status", "missing")] += 1
    for line in runs_log.read_text().splitlines():
        outcome.runs[line.split()[0]] += 1


def _diagnose(client: blueque.Client, acknowledged: list[str], started: list[Daemon]) -> str:
    """Why the drain did not finish: the unfinished tasks and the daemons' last words."""
    lines = ["tasks did not all complete:"]
    data = client.store.task_data_many(acknowledged)
    stuck = [(i, d) for i, d in zip(acknowledged, data, strict=True)
             if d.get("status") != "complete"]
    lines.append(f"{len(stuck)} unfinished; first ones:")
    for task_id, fields in stuck[:5]:
        fields.pop("parameters", None)
        lines.append(f"  {task_id}: {fields}")
    queues = {d.get("queue") for _, d in stuck if d.get("queue")}
    for queue in sorted(q for q in queues if q):
        listeners = client.store.listener_ids(queue)
        lines.append(f"queue {queue}: {client.get_queue(queue).stats()}")
        for listener in sorted(listeners):
            lines.append(f"  reserved by {listener}: "
                         f"{client.store.reserved_ids(queue, listener)[:5]}")
    for daemon in started:
        lines.append(f"daemon {daemon.pid} alive={daemon.alive()}, last log lines:")
        lines += ["  " + line for line in daemon.log().splitlines()[-8:]]
    return "\n".join(lines)
