"""RedisStore.subscribe and AsyncRedisStore.subscribe: what the waits and the listener's
subscriber thread listen through. A subscription hears only its channels, is confirmed
before its first call returns, outlives its connection (a Redis restart, a connection a NAT
dropped without a word) and says when messages may have been missed; redis-py's errors
never reach its caller."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

import blueque
import blueque.aio
from blueque.errors import BluequeError
from blueque.store import MISSED, Confirmation, Health, Message, Resubscribing, Subscription
from blueque.testing import RedisServer
from tests.fake_servers import FreezingProxy


def next_message(subscription: Subscription, timeout: float = 20.0) -> Message:
    """The next message, waiting at most ``timeout`` seconds for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = subscription.get_message(timeout=0.2)
        if message is not None:
            return message
    raise AssertionError(f"no message within {timeout} s")


def numsub(r: redis.Redis, channel: str) -> int:
    return int(dict(r.pubsub_numsub(channel))[channel])


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private redis-server of the test's own, to restart or to put behind a proxy."""
    with RedisServer() as started:
        yield started


def test_a_subscription_hears_its_channels_only_once_confirmed(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    subscription = client.store.subscribe(["one", "two"])
    try:
        assert subscription.get_message(timeout=0) is None  # subscribed, and confirmed:
        assert redis_client.publish("one", "first") == 1  # so this one reaches it
        assert redis_client.publish("elsewhere", "not ours") == 0
        redis_client.publish("two", "second")
        assert next_message(subscription) == Message("one", "first")
        assert next_message(subscription) == Message("two", "second")
        assert subscription.get_message(timeout=0.05) is None
    finally:
        subscription.close()
    assert numsub(redis_client, "one") == 0  # closed: unsubscribed


def test_a_confirmation_counts_its_channels_and_keeps_what_was_published_meanwhile() -> None:
    """What both Subscriptions do with the replies to SUBSCRIBE (their one copy): each
    channel's confirmation counts once, a message published on a channel confirmed already
    is kept in order, and nothing more is waited for once all are confirmed."""
    heard: list[Message] = []
    confirmation = Confirmation(2, heard)
    assert confirmation.wait() is not None
    confirmation.take({"type": "subscribe", "channel": "one", "data": 1})
    confirmation.take(None)  # no reply within the wait
    confirmation.take({"type": "message", "channel": "one", "data": "early"})
    assert confirmation.wait() is not None  # "two" is not confirmed yet
    confirmation.take({"type": "subscribe", "channel": "two", "data": 2})
    assert confirmation.wait() is None
    assert heard == [Message("one", "early")]


class Watched:
    """Where a Resubscribing's store is, and its Health (all it asks of one)."""

    where = "redis://127.0.0.1:1/0"

    def __init__(self) -> None:
        self.health = Health()


def test_resubscribing_backs_off_after_a_loss_and_says_missed_once_subscribed_again() -> None:
    """The part both Subscriptions share: a transient loss is counted and delays the next
    subscription; the one after a loss starts with MISSED (the first never does); an error
    that is not transient is raised as a Blueque error."""
    store = Watched()
    state = Resubscribing(store, ["one"])
    assert state.due() and state.pause(time.monotonic() + 10) == 0.0
    state.subscribed()
    assert state.heard == []
    state.lost(redis.exceptions.ConnectionError("reset"))
    assert store.health.disruptions == 1
    assert not state.due()
    assert 0.0 < state.pause(time.monotonic() + 10) <= 10
    assert state.pause(time.monotonic()) == 0.0  # never past the caller's deadline
    state.subscribed()
    assert state.heard == [MISSED]
    with pytest.raises(BluequeError, match="NOPERM"):
        state.lost(redis.exceptions.ResponseError("NOPERM no permission"))
    assert store.health.disruptions == 1


def test_a_subscription_outlives_a_redis_restart_and_says_what_it_missed(
        server: RedisServer) -> None:
    client = blueque.Client(server.url)
    subscription = client.store.subscribe(["news"])
    try:
        assert subscription.get_message(timeout=0) is None
        server.kill()
        server.start()  # the same port: the subscription's connection is gone
        assert next_message(subscription) is MISSED
        assert client.store.health.disruptions >= 1
        watcher = redis.Redis(port=server.port, decode_responses=True)
        assert watcher.publish("news", "after the restart") == 1
        assert next_message(subscription) == Message("news", "after the restart")
        watcher.close()
    finally:
        subscription.close()
        client.close()


def test_a_connection_closed_under_it_is_subscribed_again(
        redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client closed (its pool disconnected) while its subscriber thread reads. Between
    two reads redis-py reconnects and subscribes again by itself; in the middle of one it
    lets through what the closed socket raises (with hiredis, a TypeError): either way the
    subscription says MISSED and goes on, never raising."""
    client = blueque.Client(redis_url)
    subscription = client.store.subscribe(["closing"])
    try:
        assert subscription.get_message(timeout=0) is None
        client.redis.connection_pool.disconnect()
        assert next_message(subscription) is MISSED
        redis_client.publish("closing", "still heard")
        assert next_message(subscription) == Message("closing", "still heard")

        def closed_mid_read(**_: object) -> None:  # what hiredis raised in the daemon's thread
            raise TypeError("argument must be an int, or have a fileno() method.")

        monkeypatch.setattr(subscription._pubsub, "get_message", closed_mid_read)
        assert next_message(subscription) is MISSED  # on a new connection
        redis_client.publish("closing", "heard again")
        assert next_message(subscription) == Message("closing", "heard again")
    finally:
        subscription.close()
        client.close()


def test_keepalive_notices_a_connection_dropped_without_a_word(server: RedisServer) -> None:
    """A NAT or load balancer forgets an idle connection: nothing arrives, nothing closes.
    With a keepalive the subscription PINGs after that much silence and, with no PONG within
    as long again, subscribes on a new connection (PROTOCOL.md 6, the subscriber)."""
    proxy = FreezingProxy(server.port)
    client = blueque.Client(f"redis://127.0.0.1:{proxy.port}/0")
    watcher = redis.Redis(port=server.port, decode_responses=True)
    subscription = client.store.subscribe(["work"], keepalive=0.3)
    try:
        assert subscription.get_message(timeout=0) is None
        proxy.freeze()
        assert next_message(subscription) is MISSED
        assert numsub(watcher, "work") == 2  # the frozen connection, and the new one
        watcher.publish("work", "heard again")
        assert next_message(subscription) == Message("work", "heard again")
    finally:
        subscription.close()
        proxy.close()
        watcher.close()


def test_a_refused_subscription_is_a_blueque_error(redis_server: RedisServer,
                                                   redis_client: redis.Redis) -> None:
    user = f"nosub-{uuid.uuid4().hex[:8]}"
    redis_client.acl_setuser(user, enabled=True, passwords=["+secret"], keys=["*"],
                             commands=["+@all", "-subscribe"])
    client = blueque.Client(f"redis://{user}:secret@127.0.0.1:{redis_server.port}/0")
    subscription = client.store.subscribe(["forbidden"])
    try:
        with pytest.raises(BluequeError, match="subscribe"):
            subscription.get_message(timeout=0)
    finally:
        subscription.close()
        client.close()
        redis_client.acl_deluser(user)


def test_the_asyncio_subscription_hears_and_outlives_a_restart(server: RedisServer) -> None:
    async def scenario() -> list[Message | None]:
        async with blueque.aio.Client(server.url) as client:
            subscription = client.store.subscribe(["news"])
            heard = [await subscription.get_message(timeout=0)]
            watcher = redis.Redis(port=server.port, decode_responses=True)
            watcher.publish("news", "before")
            heard.append(await subscription.get_message(timeout=10))
            server.kill()
            server.start()
            deadline = time.monotonic() + 20
            message = None
            while message is None and time.monotonic() < deadline:
                message = await subscription.get_message(timeout=0.2)
            heard.append(message)
            watcher = redis.Redis(port=server.port, decode_responses=True)
            watcher.publish("news", "after")
            heard.append(await subscription.get_message(timeout=10))
            await subscription.close()
            watcher.close()
            return heard

    assert asyncio.run(scenario()) == [None, Message("news", "before"), MISSED,
                                       Message("news", "after")]
