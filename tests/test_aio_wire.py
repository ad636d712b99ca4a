"""blueque.aio.wire: the asyncio client's script calls on a connection of its own, read by a
protocol (issue 33). Its replies parsed as redis-py parses them (with hiredis and without, in
RESP2 and RESP3), a reply later than the socket timeout, and a connection the server closed.

What a cancelled caller leaves (nothing half-written, no connection of the pool taken) is
tests/test_aio.py's test_cancelled_enqueues_leak_no_connection_and_write_whole_tasks_or_none."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import blueque.aio
from blueque.aio import wire
from blueque.errors import BluequeError
from blueque.keys import Keys
from tests.test_aio import anyio_backend, until  # noqa: F401 (anyio_backend: a fixture)

pytestmark = pytest.mark.anyio
K = Keys()

#: Every reply type a script or a command can answer, RESP2 then RESP3, and what each is read as.
STREAM = (b"+OK\r\n:42\r\n$6\r\nh\xc3\xa9llo\r\n$-1\r\n$0\r\n\r\n*3\r\n:1\r\n*0\r\n$2\r\n\r\n\r\n"
          b"*-1\r\n-NOSCRIPT No matching script\r\n-ERR boom\r\n"
          b"_\r\n#t\r\n#f\r\n,1.5\r\n(123456789012345678901234567890\r\n%1\r\n+k\r\n:1\r\n"
          b"~2\r\n:1\r\n:2\r\n=8\r\ntxt:some\r\n!9\r\nERR bulky\r\n>2\r\n+message\r\n+x\r\n")
EXPECTED: list[Any] = ["OK", 42, "héllo", None, "", [1, [], "\r\n"], None,
                       redis.exceptions.NoScriptError("No matching script"),
                       wire.parse_error("ERR boom"),  # as redis-py's parsers make it
                       None, True, False, 1.5, 123456789012345678901234567890, {"k": 1}, [1, 2],
                       "some", wire.parse_error("ERR bulky"),
                       wire.Push(["message", "x"])]


def parsed(pieces: Iterator[bytes]) -> list[Any]:
    replies = wire.Replies("utf-8", "strict")
    out = []
    for piece in pieces:
        replies.feed(piece)
        while (reply := replies.gets()) is not wire.INCOMPLETE:
            out.append(reply)
    return out


def same(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected), got
    for reply, wanted in zip(got, expected, strict=True):
        if isinstance(wanted, Exception):  # an error reply: redis-py's class, its message
            assert type(reply) is type(wanted) and str(reply) == str(wanted), reply
        else:
            assert type(reply) is type(wanted) and reply == wanted, (reply, wanted)


def test_replies_are_parsed_whole_however_the_bytes_are_cut() -> None:
    same(parsed(iter([STREAM])), EXPECTED)
    same(parsed(STREAM[i:i + 1] for i in range(len(STREAM))), EXPECTED)  # a byte at a time
    for cut in range(1, len(STREAM)):
        same(parsed(iter([STREAM[:cut], STREAM[cut:]])), EXPECTED)


def test_replies_undecoded_are_bytes_and_a_wrong_type_is_a_protocol_error() -> None:
    replies = wire.Replies(None, "strict")
    replies.feed(b"$2\r\nok\r\n")
    assert replies.gets() == b"ok" and replies.gets() is wire.INCOMPLETE
    replies.feed(b"?what\r\n")
    with pytest.raises(redis.exceptions.InvalidResponse):
        replies.gets()


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("parser", ["hiredis", "Replies"])
async def test_script_calls_go_on_the_wire_in_resp2_and_resp3(
        parser: str, protocol: int, redis_url: str, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if parser == "Replies":
        monkeypatch.setattr(wire, "hiredis", None)
    elif wire.hiredis is None:
        pytest.skip("hiredis is not installed (the fast extra)")
    connection = redis.asyncio.Redis.from_url(redis_url, decode_responses=True,
                                              protocol=protocol)
    async with blueque.aio.Client(connection) as aio:
        queue = aio.get_queue("q")
        texts = [json.dumps({"n": n, "text": "é\r\n"}) for n in range(60)]
        ids = await asyncio.gather(*(queue.enqueue(text) for text in texts))  # pipelined
        line = aio.store._pipeliner._wire
        assert line is not None and line.lost is None
        assert type(line._replies).__name__ == ("Reader" if parser == "hiredis" else parser)
        assert all(task_id.created for task_id in ids)
        assert sorted(redis_client.lrange(K.pending("q"), 0, -1)) == sorted(map(str, ids))
        assert [(await aio.get_task(str(i))).parameters for i in ids[:3]] == texts[:3]
        again = await queue.enqueue("again", task_id=str(ids[0]))
        assert not again.created  # the script's 0, read as such
        redis_client.script_flush()  # NOSCRIPT on the wire: loaded again the ordinary way
        assert (await queue.enqueue("after a flush")).created
        assert aio.store._pipeliner._wire is line and line.lost is None
    await connection.aclose()


async def test_a_reply_later_than_the_socket_timeout_fails_the_call_and_the_next_reconnects(
        redis_client: redis.Redis, redis_url: str) -> None:
    """CLIENT PAUSE holds the script (a write) past the client's 0.5 s socket timeout: the call
    fails with a Blueque error instead of waiting (a ready client: no retry), the wire is
    closed, and once the pause is over the next enqueue goes on a new connection."""
    connection = redis.asyncio.Redis.from_url(redis_url, decode_responses=True,
                                              socket_timeout=0.5)
    async with blueque.aio.Client(connection) as aio:
        queue = aio.get_queue("q")
        await queue.enqueue("warm-up")
        line = aio.store._pipeliner._wire
        assert line is not None
        redis_client.client_pause(3_000, all=False)
        try:
            with pytest.raises(BluequeError, match="Timeout reading"):
                await asyncio.wait_for(queue.enqueue("held", task_id="held"), 10)
            assert isinstance(line.lost, redis.exceptions.TimeoutError)
        finally:
            redis_client.client_unpause()
        assert (await queue.enqueue("after", task_id="after")).created
        assert aio.store._pipeliner._wire is not line
    await connection.aclose()


async def test_a_connection_the_server_closed_is_made_again_before_the_next_call(
        redis_client: redis.Redis, redis_url: str) -> None:
    """The server closes the wire's connection between two calls (CLIENT KILL, as an idle
    timeout or a failover would): the next call connects again before it writes, so even a
    client without retries sees no error."""
    connection = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    async with blueque.aio.Client(connection) as aio:
        queue = aio.get_queue("q")
        await queue.enqueue("first")
        line = aio.store._pipeliner._wire
        assert line is not None
        host, port = line._transport.get_extra_info("sockname")[:2]
        assert redis_client.client_kill(f"{host}:{port}")
        await until(lambda: line.lost is not None, what="the wire hears its connection closed")
        assert (await queue.enqueue("second")).created
        assert aio.store._pipeliner._wire is not line
    await connection.aclose()


async def test_calls_waiting_when_the_client_closes_hear_it(redis_client: redis.Redis,
                                                             redis_url: str) -> None:
    """Closing the client with calls in flight (held by CLIENT PAUSE) fails them with a
    Blueque error at once: none waits for a reply that will not be read."""
    connection = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    aio = blueque.aio.Client(connection)
    queue = aio.get_queue("q")
    await queue.enqueue("warm-up")
    redis_client.client_pause(3_000, all=False)
    try:
        calls = [asyncio.ensure_future(queue.enqueue(f"held {n}")) for n in range(5)]
        await until(lambda: redis_client.info("clients")["blocked_clients"] >= 1,
                    what="the enqueues held by the pause")
        await aio.aclose()
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 2)
    finally:
        redis_client.client_unpause()
    assert all(isinstance(result, BluequeError) for result in results), results
    await connection.aclose()
