"""The lease keeper (blueque.daemon.keeper, PROTOCOL.md 6 step 2): it renews a listener's
leases when the loop has not for 3/4 of an interval, on a connection of its own; never
registers a lost lease; lets the lease lapse once the loop is stuck; and tells the exclusive
guard of every renewal, the loop's and its own, in order. Driven step by step on a fake clock
against the private redis-server; the end-to-end scenario is tests/test_slow_links.py."""

from __future__ import annotations

import redis

import blueque
from blueque.daemon.keeper import DUE, STUCK_MIN, LeaseKeeper
from blueque.keys import Keys
from blueque.store import apart
from tests.test_recorder_table import FakeClock as Clock

KEYS = Keys()
INTERVAL = 2.0


def keeper(client: blueque.Client, clock: Clock, heard: list[float]) -> LeaseKeeper:
    for queue in ("a", "b"):
        client.store.lease(queue, "me_1", int(INTERVAL * 2000), "register")
    return LeaseKeeper(apart(client.store, INTERVAL), "me_1", ["a", "b"], INTERVAL,
                       heard.append, clock)


def test_it_renews_only_when_the_loop_is_late(client: blueque.Client,
                                              redis_client: redis.Redis) -> None:
    clock, heard = Clock(), []
    kept = keeper(client, clock, heard)
    assert not kept.step()  # nothing renewed yet: not registered
    kept.renewed(clock.now)  # the loop's registration
    info = KEYS.listener_info("me_1")
    redis_client.hset(info, "pid", "1")
    redis_client.expire(info, 100)
    before = redis_client.zscore(KEYS.leases("a"), "me_1")
    clock.now += DUE * INTERVAL - 0.01
    assert not kept.step()  # the loop renews every half interval: nothing to do
    clock.now += 0.02
    kept.beat()
    assert kept.step()  # the loop is late: the keeper renews, both leases
    assert heard == [1000.0, clock.now]
    for queue in ("a", "b"):
        assert (redis_client.zscore(KEYS.leases(queue), "me_1") or 0) > (before or 0)
    assert 0 < redis_client.ttl(info) <= 7  # the info hash kept 3 intervals more
    assert not kept.step()  # just renewed
    kept.close()


def test_it_hears_of_renewals_in_order_whoever_sent_them(client: blueque.Client) -> None:
    clock, heard = Clock(), []
    kept = keeper(client, clock, heard)
    kept.renewed(1000.0)
    kept.renewed(999.0)  # a loop renewal sent before the keeper's, answered after it
    kept.renewed(None)  # no renewal yet
    kept.renewed(1001.0)
    assert heard == [1000.0, 1001.0] and kept.renewed_at == 1001.0
    kept.close()


def test_a_lost_lease_is_left_to_the_loop_to_register(client: blueque.Client,
                                                      redis_client: redis.Redis) -> None:
    """Registering is the loop's alone: a listener joins its queue once (add_listener counts
    it in blueque_queues), and it must look at its runs' tasks first (reclaim or stop)."""
    clock, heard = Clock(), []
    kept = keeper(client, clock, heard)
    kept.renewed(clock.now)
    redis_client.zrem(KEYS.leases("b"), "me_1")  # a sweep took it for dead
    clock.now += INTERVAL
    kept.beat()
    assert kept.step()
    assert redis_client.zscore(KEYS.leases("b"), "me_1") is None
    assert heard == [1000.0]  # not every lease renewed: the exclusive guard keeps counting
    assert not kept.step()  # tried again a little later
    kept.close()


def test_a_stuck_loop_lets_its_lease_lapse(client: blueque.Client,
                                           redis_client: redis.Redis) -> None:
    clock, heard = Clock(), []
    kept = keeper(client, clock, heard)
    kept.beat()
    kept.renewed(clock.now)
    clock.now += STUCK_MIN + 1  # the loop began no step since
    kept.renewed(clock.now - INTERVAL)  # as if renewed by the loop just before it stuck
    deadline = redis_client.zscore(KEYS.leases("a"), "me_1")
    assert not kept.step()
    assert redis_client.zscore(KEYS.leases("a"), "me_1") == deadline
    kept.beat()  # it steps again
    assert kept.step()
    kept.close()


def test_its_connection_is_its_own_and_times_out(client: blueque.Client) -> None:
    own = apart(client.store, 1.5)
    assert own.redis is not client.store.redis
    assert own.redis.connection_pool is not client.store.redis.connection_pool
    assert own.redis.connection_pool.connection_kwargs["socket_timeout"] == 1.5
    assert own.health is not client.store.health  # its failures are not the sweeps' gaps
    assert own.renew_leases("me_1", ["a"], 4000, 7) == {"a": -1}  # renew never registers
    own.close()
    assert client.store.redis.ping()  # the store it was made from is untouched
