"""Step by step: which expired leases a sweeper acts on (PROTOCOL.md 6, "Outages"), on the
private redis-server, with a hand-driven clock for the sweeper's side."""

from __future__ import annotations

import redis

import blueque
from blueque.keys import Keys
from blueque.leases import RECONNECT_GRACE, LeaseWatch
from blueque.recovery import Recovery
from blueque.store.health import Gap, Health

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
    client.store.health.clock = Clock()
    watch = LeaseWatch(client.store, lease_ms=1000)
    lapsed(redis_client, "gone_1")
    live(redis_client, "alive_2")
    watch.begin()
    assert watch.expired("work") == ["gone_1"]


def test_after_an_outage_only_leases_seen_live_since_or_past_the_grace(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    clock = Clock()
    client.store.health.clock = clock  # the watch's clock too
    watch = LeaseWatch(client.store, lease_ms=1000)
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
    client.store.health.clock = clock  # the watch's clock too
    watch = LeaseWatch(client.store, lease_ms=1000)
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
    client.store.health.clock = clock  # the watch's clock too
    watch = LeaseWatch(client.store, lease_ms=1000)
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
    client.store.health.clock = Clock()
    watch = LeaseWatch(client.store, lease_ms=10**9)  # grace: a long lease
    watch.begin()
    assert watch.expired("work") == []


def stall(store_health: Health, seconds: float) -> None:
    """As if the sweeper's latest operation waited ``seconds`` for Redis' answer, now."""
    store_health.gaps.append(Gap(store_health.clock(), seconds))


def test_a_gap_in_answers_holds_leases_until_they_lapse_again(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    """Issue 19 item 3: a Redis stall (DEBUG SLEEP 5) longer than a listener's lease but
    shorter than the socket timeout: no operation failed, the scheduler's sweeps came on time
    by its own lease, and it recovered live listeners whose renewals waited behind the
    stall. A gap longer than GAP of their lease now holds them until they lapse again."""
    clock = Clock()
    client.store.health.clock = clock  # the watch's clock too
    watch = LeaseWatch(client.store, lease_ms=20_000)  # a scheduler's cadence
    redis_client.hset(KEYS.listener_info("live_1"), "interval", "1")  # a 2-s lease
    watch.begin()
    watch.end()
    lapsed(redis_client, "live_1", 3.0)
    stall(client.store.health, 5.0)  # its renewal waited behind the stall, as our read did
    watch.begin()
    assert watch.expired("work") == []
    watch.end()
    live(redis_client, "live_1")  # it renewed once Redis answered: seen live after the gap
    clock.now += 0.5
    watch.begin()
    assert watch.expired("work") == []
    watch.end()
    lapsed(redis_client, "live_1")  # then it really stopped: lapsed again after the gap
    clock.now += 0.5
    watch.begin()
    assert watch.expired("work") == ["live_1"]
    watch.end()


def test_a_listener_silent_since_a_gap_is_judged_a_lease_after_it(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    clock = Clock()
    client.store.health.clock = clock  # the watch's clock too
    watch = LeaseWatch(client.store, lease_ms=1000)
    redis_client.hset(KEYS.listener_info("dead_1"), "interval", "1")
    lapsed(redis_client, "dead_1")
    stall(client.store.health, 1.0)  # a gap of half its 2-s lease
    watch.begin()
    assert watch.expired("work") == []
    watch.end()
    found: list[str] = []
    while not found:  # sweeps every half second
        clock.now += 0.5
        watch.begin()
        found = watch.expired("work")
        watch.end()
    assert found == ["dead_1"]
    assert clock.now == 1002.0  # a whole lease after the gap, and never seen live: dead


def test_a_gap_short_for_the_lease_holds_nothing(client: blueque.Client,
                                                 redis_client: redis.Redis) -> None:
    client.store.health.clock = Clock()
    watch = LeaseWatch(client.store, lease_ms=1000)
    redis_client.hset(KEYS.listener_info("dead_1"), "interval", "10")  # a 20-s lease
    lapsed(redis_client, "dead_1")
    stall(client.store.health, 1.0)  # under a quarter of it
    watch.begin()
    assert watch.expired("work") == ["dead_1"]


def test_a_gap_while_the_verdicts_are_read_puts_recovery_off(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    client.store.health.clock = Clock()
    watch = LeaseWatch(client.store, lease_ms=1000)
    lapsed(redis_client, "dead_1")
    watch.begin()
    assert watch.expired("work") == ["dead_1"]
    assert watch.still_dead("dead_1")
    stall(client.store.health, 1.0)  # Redis stalled after the judgement
    assert not watch.still_dead("dead_1")


def test_a_sweeper_never_judges_its_own_lease(client: blueque.Client,
                                              redis_client: redis.Redis) -> None:
    """Seen once: a listener's sweep recovered its own expired lease (PROTOCOL.md 6: it
    excludes itself)."""
    client.store.health.clock = Clock()
    watch = LeaseWatch(client.store, lease_ms=1000)
    lapsed(redis_client, "me_1")
    lapsed(redis_client, "other_2")
    watch.begin()
    assert watch.expired("work", exclude=["me_1"]) == ["other_2"]


def test_every_store_operation_notes_a_slow_answer(client: blueque.Client) -> None:
    """The store's Health sees a wait for Redis' answer, whatever the operation."""
    health = client.store.health
    times = iter([100.0, 103.0])  # asked at 100, answered at 103
    health.clock = lambda: next(times)
    health.answered_at = None
    client.store.server_time()
    assert health.gaps[-1] == Gap(103.0, 3.0)


def test_a_listeners_sweep_never_recovers_itself(client: blueque.Client,
                                                 redis_client: redis.Redis) -> None:
    """PROTOCOL.md 6: the sweep excludes the sweeper; its own lapsed lease is its renewal's
    business (it finds the lease there, or learns it was recovered)."""
    recovery = Recovery(client.store, host="me.example", lease_ms=1000)
    for listener in ("me_1", "other_2"):
        client.store.add_listener("work", listener)
        lapsed(redis_client, listener)
    report = recovery.sweep(["work"], exclude=["me_1"], adopter="me_1")
    assert report.listeners == ["other_2"]
    assert redis_client.zscore(KEYS.leases("work"), "me_1") is not None
