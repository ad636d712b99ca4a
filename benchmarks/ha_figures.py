"""Recovery and durability figures for docs/how-to/high-availability.md (real servers on
loopback).

    python -m benchmarks.ha_figures [--runs 3] [--json FILE]

Each run starts a fresh topology and three real listener daemons that drain tasks a producer
keeps enqueueing, SIGKILLs a master once 150 are complete, and reports: how long until a write
was accepted again (``write_resumed_s``), until a write acknowledged by a replica was
(``durable_s``), the whole drain, and what became of the tasks (complete / other / run twice).
Sentinel runs with and without ``wait_replicas=1``; Cluster with ``wait_replicas=1`` (the
killed node restarted as a replica); then a redis-server restart with AOF.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "ha")]

from failover import Outcome, run_failover  # noqa: E402

import blueque  # noqa: E402
from blueque.keys import Keys  # noqa: E402
from blueque.testing import ClusterTopology, RedisServer, SentinelTopology  # noqa: E402


def _row(scenario: str, outcome: Outcome) -> dict[str, Any]:
    other = sum(n for status, n in outcome.statuses.items() if status != "complete")
    return {"scenario": scenario, **outcome.figures(), "not_complete": other}


def sentinel_run(durable: bool) -> dict[str, Any]:
    with SentinelTopology(replicas=2) as topology, tempfile.TemporaryDirectory() as tmp:
        query = "?wait_replicas=1&wait_timeout=500" if durable else ""
        outcome = run_failover(Path(tmp), topology.url + query,
                               lambda: topology.kill_master(), drain_timeout=60, strict=False)
        return _row("sentinel, wait_replicas=1" if durable else "sentinel, no WAIT", outcome)


def cluster_run() -> dict[str, Any]:
    with ClusterTopology() as cluster, tempfile.TemporaryDirectory() as tmp:
        keys = Keys(hash_tags=True)
        names: dict[int, str] = {}
        for n in range(200):
            names.setdefault(cluster.master_for_key(keys.pending(f"q{n}")).port, f"q{n}")
            if len(names) == 3:
                break
        queues = tuple(names.values())
        victim_key = keys.pending(queues[0])
        victim = cluster.master_for_key(victim_key)

        def bring_back() -> None:
            cluster.wait_for_failover(victim_key, victim.port)
            cluster.restart(victim)

        restarter = threading.Thread(target=bring_back)

        def kill() -> None:
            cluster.kill_master_of(victim_key)
            restarter.start()

        outcome = run_failover(Path(tmp), cluster.url + "?wait_replicas=1&wait_timeout=500",
                               kill, queues=queues, listeners=1, probe_queue=queues[0],
                               drain_timeout=60, strict=False)
        restarter.join(60)
        return _row("cluster (3x2), wait_replicas=1", outcome)


def aof_restart(tasks: int = 100_000) -> dict[str, Any]:
    args = ("--appendonly", "yes", "--appendfsync", "everysec")
    with RedisServer(extra_args=args) as server:
        client = blueque.Client(server.url)
        client.get_queue("aof").enqueue_many([f'{{"n": {n}}}' for n in range(tasks)])
        client.close()
        server.kill()
        began = time.monotonic()
        server.start()
        restart = time.monotonic() - began
        client = blueque.Client(server.url)
        pending = client.get_queue("aof").stats().pending
        client.close()
    return {"scenario": f"AOF restart, {tasks:,} tasks", "restart_s": round(restart, 2),
            "tasks_found": pending}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="Sentinel runs per setting")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = [sentinel_run(durable) for durable in (True, False) for _ in range(args.runs)]
    rows.append(cluster_run())
    rows.append(aof_restart())
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
