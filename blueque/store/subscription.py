"""Subscriptions that outlive their connection (a restart, a failover, a NAT that drops an
idle connection without a word): what Task.wait, blueque.waiting and the listener's
subscriber thread listen through."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import redis

from blueque.retry import Backoff, is_transient
from blueque.store.errors import translate

if TYPE_CHECKING:
    from blueque.store.core import StoreCore
    from blueque.store.health import Health

log = logging.getLogger("blueque.store")

#: How long a new subscription waits for Redis to confirm its channels before it listens
#: anyway (its callers re-read what they wait for, which covers a confirmation that is late).
CONFIRM_WAIT = 1.0
#: The waits before subscribing again while Redis stays away: 0.1 s, doubling up to 5 s.
RESUBSCRIBE_BACKOFF = (0.1, 5.0)


@dataclass(frozen=True)
class Message:
    """What a Subscription hears: ``data`` published on ``channel``; or, with ``missed`` set
    (``channel`` and ``data`` empty), word that its connection was lost and a new one
    subscribed, so that whatever was published in between never arrived: look at Redis."""

    channel: str
    data: str
    missed: bool = False


MISSED = Message("", "", missed=True)
#: What redis-py lets through, instead of a ConnectionError, when another thread closes a
#: pub/sub connection under a reader (a client closed while its subscriber thread reads).
CLOSED_UNDER_US = (OSError, TypeError, AttributeError, ValueError)


def lost_connection(error: Exception) -> redis.exceptions.ConnectionError:
    return redis.exceptions.ConnectionError(f"connection closed under the reader ({error!r})")


def published(raw: dict[str, Any], count: int) -> tuple[Message | None, bool]:
    """A redis-py pub/sub reply as a Message (None for a confirmation or a PONG), and whether
    it is the first confirmation of a new connection's subscription (``count``: how many
    channels the subscription has): redis-py, reconnecting on its own, subscribes again."""
    kind = raw.get("type")
    if kind in ("message", "pmessage"):
        return Message(str(raw["channel"]), str(raw["data"])), False
    return None, kind == "subscribe" and raw.get("data") == 1 and count > 0


class Confirmation:
    """A new connection's subscription, until Redis confirms each of its ``channels`` or
    CONFIRM_WAIT passes; what is published meanwhile joins ``heard`` in order. The sync and
    the asyncio Subscription read the replies and hand them to ``take``."""

    def __init__(self, channels: int, heard: list[Message]) -> None:
        self._unconfirmed = channels
        self._heard = heard
        self._until = time.monotonic() + CONFIRM_WAIT

    def wait(self) -> float | None:
        """How long to wait for the next reply; None once all are confirmed or time is up."""
        left = self._until - time.monotonic()
        return left if self._unconfirmed > 0 and left > 0 else None

    def take(self, raw: dict[str, Any] | None) -> None:
        if raw is None:
            return
        if raw.get("type") == "subscribe":
            self._unconfirmed -= 1
        message, _ = published(raw, 0)
        if message is not None:  # published on a channel confirmed already
            self._heard.append(message)


class _Watched(Protocol):
    """What Resubscribing needs of a store (sync or asyncio): where it is, and its Health."""

    @property
    def where(self) -> str: ...

    @property
    def health(self) -> Health: ...


class Resubscribing:
    """What the sync and the asyncio Subscription decide without any IO of their own: when a
    lost connection may be subscribed again (RESUBSCRIBE_BACKOFF), a new one's confirmation,
    MISSED once subscribed again, and what a loss means (a transient one is counted in the
    store's Health, another is raised as a Blueque error)."""

    def __init__(self, store: _Watched, channels: Sequence[str]) -> None:
        self._store = store
        self.channels = list(channels)
        self.heard: list[Message] = []  # messages read, not handed out yet
        self._subscribed_once = False
        self._retry_at = 0.0
        self._delays: Iterator[float] | None = None

    def pause(self, deadline: float) -> float:
        """How long to wait before subscribing: the backoff left, at most until ``deadline``."""
        return max(0.0, min(self._retry_at, deadline) - time.monotonic())

    def due(self) -> bool:
        """Whether the backoff after a loss has passed."""
        return time.monotonic() >= self._retry_at

    def confirmation(self) -> Confirmation:
        return Confirmation(len(self.channels), self.heard)

    def subscribed(self) -> None:
        if self._subscribed_once:
            self.heard.insert(0, MISSED)
        self._subscribed_once, self._delays = True, None

    def lost(self, error: redis.exceptions.RedisError | redis.exceptions.RedisClusterException
             ) -> None:
        """The connection is lost (and closed): subscribe again after the next delay."""
        if self._delays is None:
            self._delays = Backoff(*RESUBSCRIBE_BACKOFF, jitter=True)
        self._retry_at = time.monotonic() + next(self._delays)
        if not is_transient(error):
            raise translate(error, self._store.where) from error
        self._store.health.disrupted()
        log.debug("subscription to %s lost (%s); subscribing again", self.channels, error)


class Subscription:
    """A pub/sub subscription to ``channels`` that outlives its connection (RedisStore.subscribe).

    ``get_message(timeout)`` returns the next Message, or None once ``timeout`` seconds passed
    without one (or at once when it has just lost its connection, so a caller's loop can
    check whether it should stop). The first call subscribes and waits for Redis to confirm
    every channel (at most CONFIRM_WAIT), so nothing published after it is missed. A lost
    connection (a restart, a failover) is subscribed again on a new one at a later call,
    after a backoff while Redis stays away (RESUBSCRIBE_BACKOFF); once it is, ``get_message``
    returns MISSED (``missed``): what
    was published in between is lost. With ``keepalive`` (seconds), a connection silent that
    long gets a PING, and one that does not answer within another ``keepalive`` is taken for
    dropped (a NAT or load balancer may drop an idle connection without a word) and
    subscribed again on a new one; so is a connection closed under it by another thread. An
    error that is not transient is raised as a Blueque error (the connection is closed; a
    later call subscribes again after the backoff).
    ``close()`` unsubscribes and gives the connection back."""

    def __init__(self, store: StoreCore, channels: Sequence[str],
                 keepalive: float | None = None) -> None:
        self._store = store
        self._state = Resubscribing(store, channels)
        self._keepalive = keepalive
        self._pubsub: Any = None
        self._silent_since = 0.0  # the connection's last reply of any kind
        self._pinged: float | None = None  # a PING not answered yet

    def get_message(self, timeout: float) -> Message | None:
        deadline = time.monotonic() + max(0.0, timeout)
        try:
            if self._pubsub is None and not self._subscribe(deadline):
                return None
            heard = self._state.heard
            return heard.pop(0) if heard else self._next(deadline)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException
                ) as error:
            self._lost(error)
        except CLOSED_UNDER_US as error:
            self._lost(lost_connection(error))
        return None

    def _subscribe(self, deadline: float) -> bool:
        """Subscribe on a new connection, unless the backoff says not before ``deadline``."""
        pause = self._state.pause(deadline)
        if pause > 0:
            time.sleep(pause)
        if not self._state.due():
            return False
        pubsub = self._pubsub = self._store.redis.pubsub()
        pubsub.subscribe(*self._state.channels)
        confirmation = self._state.confirmation()
        while (patience := confirmation.wait()) is not None:
            confirmation.take(pubsub.get_message(timeout=patience))
        self._state.subscribed()
        self._silent_since, self._pinged = time.monotonic(), None
        return True

    def _next(self, deadline: float) -> Message | None:
        while True:
            wait = deadline - time.monotonic()
            if self._keepalive is not None:
                wait = min(wait, self._keep_alive())
            raw = self._pubsub.get_message(timeout=max(0.0, wait))
            if raw is not None:
                self._silent_since, self._pinged = time.monotonic(), None
                message, again = published(raw, len(self._state.channels))
                if message is not None or again:
                    return message or MISSED
            elif time.monotonic() >= deadline:
                return None

    def _keep_alive(self) -> float:
        """PING a connection silent for ``keepalive`` seconds; raise ConnectionError when the
        PING is not answered within another. Returns how long to listen before asking again."""
        assert self._keepalive is not None
        current = time.monotonic()
        if self._pinged is not None:
            if current - self._pinged >= self._keepalive:
                raise redis.exceptions.ConnectionError(
                    f"no reply to PING within {self._keepalive:g} s")
            return self._pinged + self._keepalive - current
        if current - self._silent_since >= self._keepalive:
            self._pubsub.ping()
            self._pinged = current
            return self._keepalive
        return self._silent_since + self._keepalive - current

    def _lost(self, error: redis.exceptions.RedisError | redis.exceptions.RedisClusterException
              ) -> None:
        self.close()
        self._state.lost(error)

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except redis.exceptions.RedisError as error:
                log.debug("closing a lost subscription: %s", error)
