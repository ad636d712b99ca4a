"""Step by step: which expired leases a sweeper acts on (PROTOCOL.md 6, "Outages"), on the
private redis-server, with a hand-driven clock for the sweeper's side."""

from __future__ import annotations

import redis

import blueque
from blueque.keys import Keys
from blueque.leases import RECONNECT_GRACE, LeaseWatch

KEYS = Keys()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lapsed(redis_client: redis.Redis, listener: str, seconds_ago: float = 0.1) -> None:
    seconds, micros = redis_client.time()
    deadline = (seconds + micros / 1e6 - seconds_ago) * 1000
    redis_client.zadd(KEYS.leases("work"), {listener: deadline})


def live(redis_client: redis.Redis, listener: str) -> None:
    lapsed(redis_client, listener, -60.0)


def test_a_sweeper_that_saw_no_outage_acts_at_once(client: blueque.Client,
                                                   redis_client: redis.Redis) -> None:
    watch = LeaseWatch(client.store, lease_ms=1000, clock=Clock())
    lapsed(redis_client, "gone_1")
    live(redis_client, "alive_2")
    watch.begin()
    assert watch.expired("work") == ["gone_1"]


def test_after_an_outage_only_leases_seen_live_since_or_past_the_grace(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    clock = Clock()
    watch = LeaseWatch(client.store, lease_ms=1000, clock=clock)
    watch.begin()
    watch.end()
    client.store.health.disrupted()  # an operation of the sweeper's store failed meanwhile
    lapsed(redis_client, "silent_1")
    live(redis_client, "renewed_2")
    watch.begin()
    assert watch.expired("work") == []  # silent_1 may not have had the time to renew yet
    watch.end()
    lapsed(redis_client, "renewed_2")  # seen live since Redis came back, then lapsed: dead
    clock.now += 0.5
    watch.begin()
    assert watch.expired("work") == ["renewed_2"]
    watch.end()
    found: list[str] = []
    while clock.now < 1000.0 + RECONNECT_GRACE:  # sweeps every 0.5 s until the grace passed
        clock.now += 0.5
        watch.begin()
        found = watch.expired("work")
        watch.end()
        if "silent_1" in found:
            break
    assert sorted(found) == ["renewed_2", "silent_1"]  # silent_1 never renewed
    assert clock.now >= 1000.0 + RECONNECT_GRACE


def test_a_stalled_sweeper_starts_watching_afresh(client: blueque.Client,
                                                  redis_client: redis.Redis) -> None:
    clock = Clock()
    watch = LeaseWatch(client.store, lease_ms=1000, clock=clock)
    watch.begin()
    watch.end()
    clock.now += 5.0  # frozen (SIGSTOP) for longer than its own lease
    lapsed(redis_client, "silent_1")
    watch.begin()
    assert watch.expired("work") == []


def test_sweeps_a_little_late_are_no_stall(client: blueque.Client,
                                           redis_client: redis.Redis) -> None:
    """A loop whose sweeps come somewhat later than its lease (a slow step) is not frozen:
    taken for stalled at every sweep, it never acted on a dead listener's lease."""
    clock = Clock()
    watch = LeaseWatch(client.store, lease_ms=1000, clock=clock)
    for _ in range(3):
        watch.begin()
        watch.end()
        clock.now += 1.2  # later than its 1-s lease, short of STALL leases
    lapsed(redis_client, "gone_1")
    watch.begin()
    assert watch.expired("work") == ["gone_1"]


def test_a_lease_that_lapsed_before_the_server_started_waits_for_the_grace(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    """Its deadline is older than the server's start (a restart from AOF): even a sweeper
    that saw nothing go wrong leaves it until the server has been up for the grace."""
    redis_client.zadd(KEYS.leases("work"), {"before_restart_1": 1.0})  # 1970
    watch = LeaseWatch(client.store, lease_ms=10**9, clock=Clock())  # grace: a long lease
    watch.begin()
    assert watch.expired("work") == []
