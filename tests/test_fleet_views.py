"""The views of a fleet (issue 29 item 3): what `blueque status` (text and --json), the
dashboard's overview and nodes pages ask of Redis does not grow with the fleet, and /metrics
has no series per task. Counts, never times: `python -m benchmarks.fleet_views` prints those,
for 1,000 listeners over 50 queues, from the same fleet (benchmarks.fleet_views.populate:
listeners registered and renewed by the daemon's own Membership, tasks run through them)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import redis

import blueque
from benchmarks.fleet_views import populate, queue_name, round_trips
from blueque.metrics import QueueCollector
from blueque.statuses import OUTCOMES, STATES
from blueque.web.views import nodes_page, queues_page


def views(client: blueque.Client, redis_url: str, blueque_main: Callable[..., Any]
          ) -> dict[str, Callable[[], Any]]:
    def status(*extra: str) -> Callable[[], None]:
        def call() -> None:
            done = blueque_main(*extra, "status", "--url", redis_url)
            assert done.returncode == 0, done.stderr
        return call

    return {"status": status(), "status --json": status("--json"),
            "overview": lambda: queues_page(client.store, time.time()),
            "nodes": lambda: nodes_page(client.store, time.time()),
            "nodes, page 2": lambda: nodes_page(client.store, time.time(), 2)}


def test_the_views_ask_redis_as_often_for_a_fleet_of_150_as_for_one_of_60(
        client: blueque.Client, redis_client: redis.Redis, redis_url: str,
        blueque_main: Callable[..., Any]) -> None:
    """`blueque status` sent a command per queue, two per listener's queue and a pipeline:
    216 round trips for 1,000 listeners over 50 queues. Every view now reads in a fixed
    number of pipelines, whatever the number of queues and listeners."""
    populate(redis_url, listeners=60, queues=3)
    small = {name: round_trips(call)
             for name, call in views(client, redis_url, blueque_main).items()}
    redis_client.flushdb()
    populate(redis_url, listeners=150, queues=30)
    big = {name: round_trips(call)
           for name, call in views(client, redis_url, blueque_main).items()}
    assert big == small, (small, big)
    shown = nodes_page(client.store, time.time(), 3)
    assert len(shown["listeners"]) == 50 and shown["page"].pages == 3  # 50 a page
    done = blueque_main("--json", "status", "--url", redis_url)
    assert len(json.loads(done.stdout)["listeners"]) == 150  # all of them


def test_metrics_have_series_per_queue_and_listener_never_per_task(
        client: blueque.Client, redis_url: str) -> None:
    populate(redis_url, listeners=6, queues=2)

    def series() -> int:
        return sum(len(family.samples) for family in QueueCollector(client.store).collect())

    before = series()
    client.get_queue(queue_name(0)).enqueue_many(["{}"] * 200)  # more tasks, no more series
    client.store.close()  # its script connection, not left for a later test to see close
    assert series() == before
    # per queue: its tasks per state and its ended ones per outcome, its listeners, its
    # oldest pending age, whether it is paused and its work; per listener: its slots and its
    # busy slots; and blueque_redis_up
    assert before == 2 * (len(STATES) + len(OUTCOMES) + 4) + 6 * 2 + 1
