"""Riding out Redis restarts and failovers: which errors are transient, the one backoff
schedule (``Backoff``), and the retry policy every store (sync and asyncio) wraps around each
operation.

One schedule, two ways to wait: ``RetryPolicy.call`` sleeps with ``time.sleep`` between
tries, ``RetryPolicy.acall`` awaits ``asyncio.sleep``; both ask the same ``_Tries`` whether
to try again and for how long to wait. A loop that retries on its own terms (the
scheduler's steps) takes its waits from a ``Backoff`` too. This module formats no key and
sends no command.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

import redis
from redis.sentinel import MasterNotFoundError

log = logging.getLogger("blueque.retry")

T = TypeVar("T")

#: Reply prefixes that mean "this node cannot serve you right now", not "your command is wrong".
#: BUSY (another client's script runs too long) is one too: the command was not run, and the
#: server answers again once that script ends or is killed.
TRANSIENT_REPLIES = ("READONLY", "MASTERDOWN", "UNBLOCKED", "NOREPLICAS", "LOADING", "TRYAGAIN",
                     "CLUSTERDOWN", "MOVED", "ASK", "BUSY", "MISCONF", "OOM")

#: Replies of a server that refuses every write until an operator frees memory or disk (or a
#: replica comes back), and what each means: an outage (PROTOCOL.md 6.5), never a bad command.
WRITE_REFUSALS = {
    "OOM": "Redis is out of memory (maxmemory reached, maxmemory-policy noeviction)",
    "MISCONF": "Redis cannot persist (disk full, or an AOF/RDB write error)",
    "NOREPLICAS": "Redis has fewer replicas than its min-replicas-to-write asks for",
}

_PERMANENT = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)
_TRANSIENT = (
    redis.exceptions.ConnectionError,  # includes MasterNotFoundError, BusyLoadingError
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterError,  # ClusterDownError, MasterDownError, "TTL exhausted"
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,  # and MovedError
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.OutOfMemoryError,  # OOM: writes refused (PROTOCOL.md 6.5)
)


def certificate_refused(error: BaseException) -> ssl.SSLCertVerificationError | None:
    """The TLS verification failure behind a connection error (redis-py chains it): a server
    certificate this client does not accept. Waiting will not change it."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _reply(error: BaseException) -> str:
    """The first word of a server's error reply (a pipeline prefixes the reply with "Command #
    1 (...) of pipeline caused error: ")."""
    return str(error).rpartition("caused error: ")[2].split(" ", 1)[0]


def write_refusal(error: BaseException) -> str | None:
    """What a refusal of every write means (out of memory, cannot persist...), or None."""
    if isinstance(error, redis.exceptions.OutOfMemoryError):  # redis-py drops its "OOM "
        return WRITE_REFUSALS["OOM"]
    if isinstance(error, redis.exceptions.ResponseError):
        return WRITE_REFUSALS.get(_reply(error))
    return None


def is_transient(error: BaseException) -> bool:
    """True if ``error`` is what a failover, a restart or a resharding looks like."""
    if isinstance(error, _PERMANENT) or certificate_refused(error) is not None:
        return False
    if isinstance(error, MasterNotFoundError) and "AuthenticationError" in str(error):
        return False  # the sentinels refused our credentials: waiting will not help
    if isinstance(error, _TRANSIENT):
        return True
    if isinstance(error, redis.exceptions.ResponseError):
        return _reply(error) in TRANSIENT_REPLIES
    return False


class Backoff:
    """The waits of a loop that retries on its own: ``initial`` (at most ``maximum``), then
    each wait twice the previous one, up to ``maximum``. With ``jitter`` each wait is scaled
    by a random factor in [0.5, 1], so that a crowd of clients does not retry in step.

    ``next()`` after each failure gives the wait before the next try; ``reset()`` after a
    success starts again from ``initial``. It is also an endless iterator of those waits.
    The one backoff schedule of Blueque: RetryPolicy and the scheduler take their waits from
    one, and so should any loop that retries Redis on its own terms."""

    def __init__(self, initial: float, maximum: float, *, jitter: bool = False) -> None:
        if not (initial > 0 and maximum > 0):
            raise ValueError(f"backoff waits must be more than 0 s, not {initial!r} and "
                             f"{maximum!r}")
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self._delay = min(initial, maximum)

    def next(self) -> float:
        """The wait before the next try; the following one is twice as long (capped)."""
        delay = self._delay
        self._delay = min(delay * 2, self.maximum)
        return delay * random.uniform(0.5, 1.0) if self.jitter else delay

    def reset(self) -> None:
        """A try succeeded: the next failure waits ``initial`` again."""
        self._delay = min(self.initial, self.maximum)

    def __iter__(self) -> Iterator[float]:
        return self

    def __next__(self) -> float:
        return self.next()


class _Tries:
    """The bookkeeping of one operation under a RetryPolicy: how many tries failed, whether
    the next may go ahead and after how long, and the log lines that say so."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.started = policy.clock()
        self.deadline = self.started + policy.deadline_s
        #: made at the first failure: most operations never fail, and an enqueue is 30 us
        self.backoff: Backoff | None = None
        self.failures = 0

    def failed(self, error: Exception) -> float | None:
        """Seconds to wait before the next try, or None: give up (re-raise ``error``)."""
        self.failures += 1
        left = self.deadline - self.policy.clock()
        if not is_transient(error) or left <= 0:
            return None
        if self.backoff is None:
            self.backoff = Backoff(self.policy.initial_backoff_s, self.policy.max_backoff_s,
                                   jitter=True)
        wait = min(self.backoff.next(), left)
        log.log(logging.WARNING if self.failures == 1 and not self.policy.quiet
                else logging.DEBUG,
                "Redis operation failed (%s: %s); retry %d in %.2f s (retrying for up "
                "to %g s)", type(error).__name__, error, self.failures, wait,
                self.policy.deadline_s)
        return wait

    def succeeded(self) -> None:
        if self.failures:
            log.log(logging.DEBUG if self.policy.quiet else logging.INFO,
                    "Redis answered again after %d failed tr%s (%.1f s)", self.failures,
                    "y" if self.failures == 1 else "ies", self.policy.clock() - self.started)


@dataclass(frozen=True)
class RetryPolicy:
    """Repeat an operation that failed transiently until it succeeds or ``deadline_s`` passes.

    Every Blueque protocol operation is idempotent when repeated after a lost reply (see
    PROTOCOL.md), so the stores wrap each one in ``call`` (``acall`` in blueque.aio). The
    waits grow from ``initial_backoff_s`` to ``max_backoff_s`` with jitter, so that a crowd
    of listeners does not stampede the new master. The first failure of an operation is
    logged as a warning, the following ones at debug level (a 30-s restart would otherwise
    log 60 lines per call), and a success after failures says how long it took."""

    deadline_s: float = 30.0
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 0.5
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    async_sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False,
                                                            compare=False)
    #: its failures and recoveries at debug level only: a loop that says itself, once, that
    #: Redis is away and back (the listener's, PROTOCOL.md 6 "Outages")
    quiet: bool = False

    def __post_init__(self) -> None:
        # the waits are checked here, once: a try makes its Backoff only when it fails
        Backoff(self.initial_backoff_s, self.max_backoff_s)

    def bounded(self, seconds: float, quiet: bool | None = None) -> RetryPolicy:
        """The same policy with a deadline of at most ``seconds`` (a daemon's loop, which
        must keep enforcing time limits and hearing signals, retries in its own steps);
        ``quiet``: see the field (None keeps this policy's)."""
        return replace(self, deadline_s=min(self.deadline_s, seconds),
                       quiet=self.quiet if quiet is None else quiet)

    def call(self, operation: Callable[[], T]) -> T:
        tries = _Tries(self)
        while True:
            try:
                result = operation()
            except Exception as error:
                wait = tries.failed(error)
                if wait is None:
                    raise
                self.sleep(wait)
            else:
                tries.succeeded()
                return result

    async def acall(self, operation: Callable[[], Awaitable[T]]) -> T:
        """``call`` for a coroutine function: the same tries and waits, awaited (a cancelled
        caller stops at once, in the operation or in the wait)."""
        tries = _Tries(self)
        while True:
            try:
                result = await operation()
            except Exception as error:
                wait = tries.failed(error)
                if wait is None:
                    raise
                await self.async_sleep(wait)
            else:
                tries.succeeded()
                return result


class NoRetry:
    """Run once (a ready redis-py client, or ``retry_deadline=0``); URLs bring a
    RetryPolicy, which rides through restarts and failovers."""

    def call(self, operation: Callable[[], T]) -> T:
        return operation()

    async def acall(self, operation: Callable[[], Awaitable[T]]) -> T:
        return await operation()

    def bounded(self, seconds: float, quiet: bool | None = None) -> NoRetry:
        return self
