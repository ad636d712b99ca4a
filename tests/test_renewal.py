"""A listener's lease renewal in one round trip that reads no parameters (PROTOCOL.md 6, step 2;
issue 19 item 4), on the private redis-server."""

from __future__ import annotations

from typing import Any

import redis

import blueque
from blueque.keys import Keys
from blueque.listener import Listener
from blueque.store import NodeRenewal

KEYS = Keys()


class OnlyPipelines:
    """A client that lets a store send pipelines and nothing else, and counts them."""

    def __init__(self, real: redis.Redis) -> None:
        self.real = real
        self.pipelines = 0

    def pipeline(self, **options: Any) -> Any:
        self.pipelines += 1
        return self.real.pipeline(**options)

    def register_script(self, script: str) -> Any:
        return self.real.register_script(script)  # no round trip

    def __getattr__(self, name: str) -> Any:
        if name == "get_nodes":  # what tells a cluster client: this one is not
            raise AttributeError(name)
        raise AssertionError(f"a renewal sent {name} outside its one pipeline")


def renewal(listener: str, tasks: list[str]) -> NodeRenewal:
    return NodeRenewal(listener, "node-1", ["q"], 2000, {"interval": "1", "busy": "1"}, 4,
                       {"4242": '{"task": "t"}'}, 60, tasks)


def test_one_round_trip_renews_writes_and_reads_only_the_fields_it_needs(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    client.get_queue("q").enqueue("x" * 1_000_000)  # big parameters: never read back
    listener = Listener("q", client.store)
    task = listener.reserve()
    assert task is not None
    client.store.lease("q", listener.id, 2000, "register")
    store = client.store
    counting = OnlyPipelines(store.redis)
    store.redis = counting
    reply = store.renew_node(renewal(listener.id, [task.id, "gone"]))
    assert counting.pipelines == 1
    assert reply.leases["q"] > 0
    assert reply.tasks[0] == {"status": "reserved", "attempts": "1", "node": listener.id}
    assert reply.tasks[1] == {}  # a missing hash
    assert reply.reserved == {"q": [task.id]}
    assert redis_client.hget(KEYS.listener_info(listener.id), "busy") == "1"
    assert 0 < redis_client.ttl(KEYS.listener_info(listener.id)) <= 4
    assert redis_client.hget(KEYS.node_runs("node-1"), "4242") == '{"task": "t"}'


def test_a_lost_lease_and_an_emptied_script_cache(client: blueque.Client,
                                                  redis_client: redis.Redis) -> None:
    """After a restart that emptied the script cache the pipeline is sent again whole; a
    lease that was taken (the listener was declared dead) answers -1."""
    client.store.lease("q", "me_1", 2000, "register")
    redis_client.script_flush()
    assert client.store.renew_node(renewal("me_1", [])).leases["q"] > 0
    redis_client.zrem(KEYS.leases("q"), "me_1")
    reply = client.store.renew_node(renewal("me_1", []))
    assert reply.leases == {"q": -1} and reply.tasks == []
    assert redis_client.zscore(KEYS.leases("q"), "me_1") is None  # renew never re-adds
