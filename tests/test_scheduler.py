"""The scheduler, one step at a time, with an injected clock, on the private redis-server."""

from __future__ import annotations

import logging
import time

import pytest
import redis

import blueque
from blueque.cron import CronEntry
from blueque.display import format_time
from blueque.errors import RedisUnavailable
from blueque.keys import Keys
from blueque.recovery import Recovery
from blueque.scheduler import MAX_BACKOFF, Scheduler
from blueque.testing import RedisServer, free_port, wait_for

KEYS = Keys()
T0 = 1_800_000_000  # a whole minute: 2027-01-15 08:00:00 UTC


class Clock:
    def __init__(self, start: float = T0 + 0.5) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def every_second(name: str = "tick", queue: str = "cronq", **extra: object) -> CronEntry:
    return CronEntry(name=name, cron="* * * * * *", queue=queue, parameters='{"n": 1}',
                     **extra)  # type: ignore[arg-type]


def pending(redis_client: redis.Redis, queue: str) -> list[str]:
    return list(reversed(redis_client.lrange(KEYS.pending(queue), 0, -1)))


def test_due_tasks_of_every_queue_are_enqueued(client, redis_client):  # type: ignore[no-untyped-def]
    past = time.time() - 5
    for queue in ("a", "b", "c"):
        client.store.submit(queue, f"{queue}-due", "{}", past, eta=past)
        client.get_queue(queue).schedule("{}", time.time() + 3600, task_id=f"{queue}-later")
    report = Scheduler(client).run_once()
    assert report.due == {"a": 1, "b": 1, "c": 1}
    for queue in ("a", "b", "c"):
        assert pending(redis_client, queue) == [f"{queue}-due"]
        assert redis_client.zrange(KEYS.scheduled(queue), 0, -1) == [f"{queue}-later"]
        assert redis_client.hget(KEYS.task(f"{queue}-due"), "status") == "pending"
    assert Scheduler(client).run_once().due == {}


def test_cron_entry_registers_then_fires_each_tick_once(client, redis_client):  # type: ignore[no-untyped-def]
    clock = Clock()
    scheduler = Scheduler(client, [every_second()], clock=clock)
    assert scheduler.run_once().fired == {}
    assert redis_client.hget(KEYS.cron(), "tick") == str(T0)
    clock.now += 3
    fired = scheduler.run_once().fired["tick"]
    assert fired == [f"cron-tick-{T0 + n}" for n in (1, 2, 3)]
    assert pending(redis_client, "cronq") == fired
    assert redis_client.hget(KEYS.task(fired[0]), "parameters") == '{"n": 1}'
    assert redis_client.hget(KEYS.cron(), "tick") == str(T0 + 3)
    assert scheduler.run_once().fired == {}  # same second: nothing new
    clock.now += 1
    assert scheduler.run_once().fired == {"tick": [f"cron-tick-{T0 + 4}"]}


def test_cron_options_reach_the_task(client, redis_client):  # type: ignore[no-untyped-def]
    clock = Clock()
    entry = every_second(options={"max_attempts": 3, "time_limit": 60})
    scheduler = Scheduler(client, [entry], clock=clock)
    scheduler.run_once()
    clock.now += 1
    (task_id,) = scheduler.run_once().fired["tick"]
    data = redis_client.hgetall(KEYS.task(task_id))
    assert (data["max_attempts"], data["time_limit"]) == ("3", "60.0")


def test_two_schedulers_interleaved_fire_each_tick_exactly_once(redis_url, redis_client):  # type: ignore[no-untyped-def]
    clock = Clock()
    first, second = (Scheduler(blueque.Client(redis_url), [every_second()], clock=clock)
                     for _ in range(2))
    first.run_once()
    fired: list[str] = []
    for step in range(40):
        clock.now += 0.7
        for scheduler in (first, second) if step % 3 else (second, first):
            fired += scheduler.run_once().fired.get("tick", [])
    last = int(clock.now)
    expected = [f"cron-tick-{tick}" for tick in range(T0 + 1, last + 1)]
    assert sorted(fired) == expected  # each tick reported by exactly one scheduler
    assert sorted(pending(redis_client, "cronq")) == expected  # and enqueued exactly once


def test_losing_the_compare_and_set_skips_what_the_winner_fired(redis_url, redis_client):  # type: ignore[no-untyped-def]
    """The worst interleaving: B runs a whole step between A's enqueue and A's CAS."""
    clock = Clock()
    a = Scheduler(blueque.Client(redis_url), [every_second()], clock=clock)
    b = Scheduler(blueque.Client(redis_url), [every_second()], clock=clock)
    a.run_once()
    original = a.client.store.advance_cron
    b_fired: list[str] = []

    def advance_after_b(name: str, expected: str | None, tick: int) -> bool:
        if not b_fired:
            b_fired.extend(b.run_once().fired["tick"])
        return original(name, expected, tick)

    a.client.store.advance_cron = advance_after_b  # type: ignore[method-assign]
    clock.now += 3
    a_fired = a.run_once().fired.get("tick", [])
    assert b_fired == [f"cron-tick-{T0 + n}" for n in (1, 2, 3)]
    assert a_fired == []
    assert sorted(pending(redis_client, "cronq")) == b_fired
    assert redis_client.hget(KEYS.cron(), "tick") == str(T0 + 3)


def test_a_crash_between_enqueue_and_advance_neither_doubles_nor_skips(redis_url, redis_client):  # type: ignore[no-untyped-def]
    clock = Clock()
    a = Scheduler(blueque.Client(redis_url), [every_second()], clock=clock)
    a.run_once()

    def lost(name: str, expected: str | None, tick: int) -> bool:
        raise RedisUnavailable("connection lost after the enqueue")

    a.client.store.advance_cron = lost  # type: ignore[method-assign]
    clock.now += 2
    with pytest.raises(RedisUnavailable):
        a.run_once()
    assert pending(redis_client, "cronq") == [f"cron-tick-{T0 + 1}"]  # enqueued, not recorded
    b = Scheduler(blueque.Client(redis_url), [every_second()], clock=clock)
    assert b.run_once().fired["tick"] == [f"cron-tick-{T0 + 1}", f"cron-tick-{T0 + 2}"]
    assert pending(redis_client, "cronq") == [f"cron-tick-{T0 + 1}", f"cron-tick-{T0 + 2}"]


def test_after_downtime_only_the_catch_up_cap_of_missed_ticks_fires(client, redis_client, caplog):  # type: ignore[no-untyped-def]
    clock = Clock()
    scheduler = Scheduler(client, [every_second(catch_up=3)], clock=clock)
    with caplog.at_level(logging.INFO, logger="blueque.scheduler"):
        scheduler.run_once()
        clock.now += 100
        report = scheduler.run_once()
    # times a person reads, not Unix seconds (1795575600)
    assert f"next tick at {format_time(T0 + 1)}" in caplog.text
    assert f"missed more than 3 ticks since {format_time(T0)}" in caplog.text
    assert report.fired["tick"] == [f"cron-tick-{T0 + n}" for n in (98, 99, 100)]
    assert report.skipped_ticks == {"tick": 1}
    assert redis_client.llen(KEYS.pending("cronq")) == 3


def test_cron_time_zone(client, redis_client):  # type: ignore[no-untyped-def]
    """03:00 in Paris is 02:00 UTC in January."""
    clock = Clock(T0)  # 08:00 UTC
    entry = CronEntry(name="paris", cron="0 3 * * *", queue="tz", timezone="Europe/Paris")
    scheduler = Scheduler(client, [entry], clock=clock)
    scheduler.run_once()
    clock.now = T0 + 18 * 3600 - 1  # 01:59:59 UTC next day
    assert scheduler.run_once().fired == {}
    clock.now += 1
    tick = T0 + 18 * 3600
    assert scheduler.run_once().fired == {"paris": [f"cron-paris-{tick}"]}


def test_corrupt_cron_record_is_reported_and_other_entries_still_fire(client, redis_client):  # type: ignore[no-untyped-def]
    clock = Clock()
    redis_client.hset(KEYS.cron(), "broken", "not-a-number")
    scheduler = Scheduler(client, [every_second("broken"), every_second("fine")], clock=clock)
    scheduler.run_once()
    clock.now += 1
    report = scheduler.run_once()
    assert report.fired == {"fine": [f"cron-fine-{T0 + 1}"]}
    assert len(report.errors) == 1 and "HDEL" in report.errors[0]


class FakeSweeper:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def sweep(self, queues: list[str]) -> str:
        self.calls.append(list(queues))
        return "swept"


def test_recovery_sweeps_every_recovery_interval(client):  # type: ignore[no-untyped-def]
    client.get_queue("q1").enqueue("{}")
    clock = Clock()
    sweeper = FakeSweeper()
    scheduler = Scheduler(client, recovery=sweeper, recovery_interval=5, clock=clock)
    assert scheduler.run_once().recovered == "swept"
    clock.now += 4
    assert scheduler.run_once().recovered is None
    clock.now += 1
    scheduler.run_once()
    assert sweeper.calls == [["q1"], ["q1"]]


def test_recovery_sweep_requeues_the_task_of_a_listener_whose_lease_expired(client, redis_client):  # type: ignore[no-untyped-def]
    queue = client.get_queue("work")
    task_id = queue.enqueue("{}")
    listener = client.get_listener("work")
    client.store.lease("work", listener.id, 1, "register")  # a 1 ms lease, never renewed
    assert listener.reserve() is not None
    assert redis_client.llen(KEYS.pending("work")) == 0
    wait_for(lambda: listener.id in client.store.expired_listeners("work"), timeout=5)
    recovery = Recovery(client.store, host="another-host.example")  # no same-host shortcut
    report = Scheduler(client, recovery=recovery).run_once()
    assert listener.id in report.recovered.listeners  # type: ignore[attr-defined]
    assert pending(redis_client, "work") == [task_id]
    assert redis_client.hget(KEYS.task(task_id), "status") == "pending"
    assert not redis_client.sismember(KEYS.listeners("work"), listener.id)


def test_purge_deletes_finished_tasks_past_the_queue_result_ttl(client, redis_client):  # type: ignore[no-untyped-def]
    queue = client.get_queue("results")
    queue.configure(result_ttl=60)
    ids = [queue.enqueue("{}") for _ in range(3)]
    listener = client.get_listener("results")
    for _ in ids:
        processor = client.get_processor(listener.reserve())
        processor.start(1)
        processor.complete("done")
    old = str(time.time() - 120)
    for task_id in ids[:2]:
        redis_client.hset(KEYS.task(task_id), "finished_at", old)
    clock = Clock()
    scheduler = Scheduler(client, purge_interval=30, clock=clock)
    assert scheduler.run_once().purged == {"results": 2}
    assert redis_client.lrange(KEYS.complete("results"), 0, -1) == [ids[2]]
    assert not redis_client.exists(KEYS.task(ids[0]))
    assert redis_client.exists(KEYS.task(ids[2]))
    client.get_queue("keep").enqueue("{}")  # no result_ttl: never purged
    assert scheduler.run_once().purged == {}


def test_run_backs_off_while_redis_is_unreachable() -> None:
    client = blueque.Client(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    pauses: list[float] = []
    scheduler = Scheduler(client, interval=1.0, sleep=pauses.append)
    scheduler.run(max_steps=6)
    assert pauses == [2.0, 4.0, 8.0, 16.0, MAX_BACKOFF, MAX_BACKOFF]


def test_an_interval_longer_than_the_backoff_cap_is_kept(client):  # type: ignore[no-untyped-def]
    """--interval 45 steps every 45 s (it used to be cut to MAX_BACKOFF), and an outage
    never makes the scheduler step more often than its interval."""
    pauses: list[float] = []
    Scheduler(client, interval=45.0, sleep=pauses.append).run(max_steps=2)
    down = blueque.Client(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    Scheduler(down, interval=45.0, sleep=pauses.append).run(max_steps=2)
    assert pauses == [45.0, 45.0, 45.0, 45.0]


def test_a_step_that_succeeds_after_an_outage_resets_the_backoff() -> None:
    pauses: list[float] = []
    with RedisServer() as server:
        client = blueque.Client(server.url, retry_deadline=0, socket_connect_timeout=1)

        def sleep(seconds: float) -> None:
            pauses.append(seconds)
            if len(pauses) in (1, 4):
                server.kill()  # the next step fails
            elif len(pauses) == 3:
                server.start()  # the next step succeeds

        Scheduler(client, interval=1.0, sleep=sleep).run(max_steps=5)
        client.close()
    assert pauses == [1.0, 2.0, 4.0, 1.0, 2.0]


def test_stop_ends_run_after_the_current_step(client):  # type: ignore[no-untyped-def]
    steps: list[float] = []
    scheduler: Scheduler

    def sleep(seconds: float) -> None:
        steps.append(seconds)
        if len(steps) == 3:
            scheduler.stop()

    scheduler = Scheduler(client, interval=0.5, sleep=sleep)
    scheduler.run()
    assert steps == [0.5, 0.5, 0.5]
    assert scheduler.stop_asked


def test_duplicate_cron_names_are_refused(client):  # type: ignore[no-untyped-def]
    with pytest.raises(blueque.ConfigurationError, match="two cron entries"):
        Scheduler(client, [every_second(), every_second()])
