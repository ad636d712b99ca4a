"""Script calls on a connection of the store's own: one EVALSHA written and its reply read,
without redis-py's per-command machinery.

A plain ``redis.Redis`` command takes a connection from the pool and gives it back on every
call: a ``poll`` system call to check the connection holds no stale reply, locks, metric
hooks and an event per release. Measured on an enqueue (benchmarks/profile_enqueue.py and
issue 20 item 5): that path costs about 10 us of client CPU per call, a third of a bare
``LPUSH``. ``DirectCalls`` makes one connection per process as the pool makes its own (its
connection class and settings: address, password, TLS, Sentinel's master lookup) but keeps it
apart from the pool, so that a pool the program bounds (``max_connections``, a
``BlockingConnectionPool`` of one) never has a connection taken from it for good; redis-py's
``Connection`` still encodes the command, parses the reply, raises a Redis error reply as its
exception and disconnects itself on any failure between the write and the reply, so the next
call reconnects. ``close`` (``Client.close``) disconnects it.

What the kept connection never does, the caller's ordinary path does: a call that finds the
connection busy (another thread's call in flight), a client that is no plain ``redis.Redis``
(a cluster, fakeredis, a single-connection client), a ``NOSCRIPT`` reply (a restarted server
lost its script cache) or a connection lost around the call (a server-side idle timeout, a
failover) answers ``NOT_SENT`` or raises ``Resend``, and the caller sends the same call the
ordinary way, which loads the script, checks the connection and reconnects. Sending a script
call again after a lost reply is safe: every Blueque script is idempotent on a repeat
(PROTOCOL.md 9), as redis-py's own retry of a lost connection already assumes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import redis

#: What ``DirectCalls.evalsha`` answers when it sent nothing (the caller sends the call).
NOT_SENT: Any = object()


def packed_evalsha(encoder: Any, sha: str, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
    """``EVALSHA sha len(keys) *keys *args`` in the Redis protocol, byte for byte as redis-py's
    ``pack_command`` writes it with ``encoder`` (str in its encoding, int and float as their
    repr, bytes as they are; bool, None and the rest refused with its DataError), without its
    checks per argument: a fifth of an enqueue's client CPU went there (issue 33)."""
    encoding, errors = encoder.encoding, encoder.encoding_errors
    parts = [b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + len(keys) + len(args))]
    for item in (sha, len(keys), *keys, *args):
        kind = type(item)
        if kind is str:
            data = item.encode(encoding, errors)
        elif kind is int or kind is float:
            data = repr(item).encode()
        else:
            data = encoder.encode(item)
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class Resend(Exception):
    """The kept connection failed around a call: send it the ordinary way."""


def eligible(client: Any) -> bool:
    """A plain redis-py client over a connection pool (Sentinel's too), whose connections
    are redis-py's own: where the kept connection behaves as the pool's would."""
    if not isinstance(client, redis.Redis) or getattr(client, "connection", None) is not None:
        return False
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, redis.ConnectionPool):
        return False
    kind = pool.connection_class
    return isinstance(kind, type) and kind.__module__.startswith("redis.")


class DirectCalls:
    """EVALSHA on a connection made as ``client``'s pool makes its own and kept apart from it
    (one per process, used by one thread at a time; a call that finds it busy goes the
    ordinary way)."""

    def __init__(self, client: Any) -> None:
        self._pool: Any = client.connection_pool if eligible(client) else None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._connection: Any = None

    def evalsha(self, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """The script's reply; ``NOT_SENT`` when nothing was sent (the caller sends it);
        ``Resend`` when the connection failed or the server lost the script."""
        if self._pool is None:
            return NOT_SENT
        if self._pid != os.getpid():
            # a forked child: the parent's socket is not its to use, and a lock another
            # thread of the parent held at the fork would stay held in it
            self._pid, self._lock, self._connection = os.getpid(), threading.Lock(), None
        if not self._lock.acquire(blocking=False):
            return NOT_SENT
        try:
            connection = self._connection
            if connection is None:
                connection = self._connection = self._pool.connection_class(
                    **self._pool.connection_kwargs)
            connection.send_packed_command([packed_evalsha(connection.encoder, sha, keys, args)])
            return connection.read_response()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.NoScriptError) as error:
            raise Resend(str(error)) from error
        finally:
            self._lock.release()

    def close(self) -> None:
        """Disconnect the kept connection (the next call connects again)."""
        connection = self._connection
        if connection is not None and connection.pid == os.getpid():
            connection.disconnect()
