"""blueque.retry: which errors are transient, the one backoff schedule (Backoff), and
RetryPolicy's call and acall (its awaiting twin) deciding alike."""

from __future__ import annotations

import asyncio
import itertools
import logging
import typing

import pytest
import redis

import blueque
import blueque.aio
import blueque.ha
from blueque.aio.store import AsyncRedisStore
from blueque.ha import Durability, NotReplicated
from blueque.retry import Backoff, RetryPolicy, is_transient, write_refusal


def test_backoff_doubles_to_its_cap_with_jitter_in_the_lower_half() -> None:
    assert list(itertools.islice(Backoff(0.05, 0.5), 6)) == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]
    for delay, full in zip(Backoff(0.05, 0.5, jitter=True), Backoff(0.05, 0.5), strict=False):
        assert full / 2 <= delay <= full
        if full == 0.5:
            break


def test_backoff_starts_again_after_a_reset_and_never_exceeds_its_cap() -> None:
    backoff = Backoff(0.1, 5.0)
    assert [backoff.next() for _ in range(3)] == [0.1, 0.2, 0.4]
    backoff.reset()
    assert backoff.next() == 0.1
    # a first wait above the cap is the cap (the scheduler's twice-the-interval start)
    assert list(itertools.islice(Backoff(40.0, 30.0), 2)) == [30.0, 30.0]
    with pytest.raises(ValueError, match="more than 0"):
        Backoff(0.0, 1.0)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


def policy(fake: FakeTime, deadline: float) -> RetryPolicy:
    return RetryPolicy(deadline_s=deadline, sleep=fake.sleep, clock=fake.clock,
                       async_sleep=fake.async_sleep)


@pytest.mark.parametrize("mode", ["call", "acall"])
def test_acall_rides_through_transient_failures_as_call_does(mode: str) -> None:
    fake = FakeTime()
    failures = [redis.exceptions.ConnectionError("down"), redis.exceptions.ReadOnlyError("RO")]

    def operation() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    async def coroutine() -> str:
        return operation()

    retry = policy(fake, 10)
    result = retry.call(operation) if mode == "call" else asyncio.run(retry.acall(coroutine))
    assert result == "done"
    assert len(fake.sleeps) == 2 and all(0 < s <= 0.5 for s in fake.sleeps)


def test_acall_gives_up_at_the_deadline_and_never_repeats_a_refusal() -> None:
    fake = FakeTime()
    calls: list[float] = []

    async def down() -> None:
        calls.append(fake.now)
        raise redis.exceptions.ConnectionError("down")

    with pytest.raises(redis.exceptions.ConnectionError):
        asyncio.run(policy(fake, 3).acall(down))
    assert fake.now == pytest.approx(3.0) and len(calls) > 6

    refused: list[int] = []

    async def refusal() -> None:
        refused.append(1)
        raise redis.exceptions.ResponseError("BLUEQUE_STATE task t is complete")

    with pytest.raises(redis.exceptions.ResponseError):
        asyncio.run(policy(FakeTime(), 10).acall(refusal))
    assert refused == [1]


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (redis.exceptions.ConnectionError("refused"), True),
        (redis.exceptions.TimeoutError("slow"), True),
        (redis.exceptions.ReadOnlyError("READONLY You can't write against a replica."), True),
        (redis.exceptions.ResponseError("UNBLOCKED force unblock"), True),
        (redis.exceptions.ResponseError("MASTERDOWN Link with MASTER is down"), True),
        (redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"), True),
        (redis.exceptions.TryAgainError("TRYAGAIN"), True),
        (NotReplicated("0 of 1"), True),
        (redis.exceptions.AuthenticationError("WRONGPASS"), False),
        (redis.exceptions.ResponseError("BLUEQUE_STATE task x is complete"), False),
        (ValueError("bug"), False),
    ],
)
def test_transient_errors(error: Exception, transient: bool) -> None:
    assert is_transient(error) is transient


def test_retry_policy_rides_through_transient_failures() -> None:
    fake = FakeTime()
    policy = RetryPolicy(deadline_s=10, sleep=fake.sleep, clock=fake.clock)
    failures = [redis.exceptions.ConnectionError("down"), redis.exceptions.ReadOnlyError("RO")]

    def operation() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    assert policy.call(operation) == "done"
    assert len(fake.sleeps) == 2 and all(0 < s <= 0.5 for s in fake.sleeps)


def test_retries_are_logged_under_blueque_retry(caplog: pytest.LogCaptureFixture) -> None:
    """Where the policy lives (it was logged as blueque.ha, a module it left)."""
    fake = FakeTime()
    failures = [redis.exceptions.ConnectionError("down")]

    def operation() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    with caplog.at_level(logging.INFO):
        assert policy(fake, 10).call(operation) == "done"
    assert {record.name for record in caplog.records} == {"blueque.retry"}
    assert [record.levelname for record in caplog.records] == ["WARNING", "INFO"]


def test_retry_policy_gives_up_at_its_deadline() -> None:
    fake = FakeTime()
    policy = RetryPolicy(deadline_s=3, sleep=fake.sleep, clock=fake.clock)
    calls = []

    def operation() -> None:
        calls.append(fake.now)
        raise redis.exceptions.ConnectionError("down")

    with pytest.raises(redis.exceptions.ConnectionError):
        policy.call(operation)
    assert fake.now == pytest.approx(3.0)
    assert max(fake.sleeps) <= 0.5 and len(calls) > 6


def test_retry_policy_never_repeats_a_permanent_error() -> None:
    calls = []

    def operation() -> None:
        calls.append(1)
        raise redis.exceptions.ResponseError("BLUEQUE_STATE task t is complete")

    with pytest.raises(redis.exceptions.ResponseError):
        RetryPolicy(deadline_s=10).call(operation)
    assert calls == [1]


def test_the_retry_policy_is_still_importable_from_blueque_ha_with_a_warning() -> None:
    """README named it blueque.ha.RetryPolicy until the policy got a module of its own."""
    with pytest.warns(DeprecationWarning, match="import it from blueque.retry"):
        from blueque.ha import RetryPolicy as Moved
    assert Moved is RetryPolicy
    with pytest.raises(AttributeError):
        blueque.ha.no_such_name  # noqa: B018 (only the moved names are forwarded)


@pytest.mark.parametrize("constructor", [blueque.Client.__init__, blueque.aio.Client.__init__,
                                         AsyncRedisStore.__init__])
def test_retry_policy_and_durability_are_typed_where_they_are_given(constructor: object) -> None:
    """Issue 14 item 3: `Any` there let mypy pass anything (a Retry of redis-py's for a
    RetryPolicy, a replica count for a Durability)."""
    hints = typing.get_type_hints(constructor)
    retry = hints.get("retry_policy", hints.get("retry"))
    assert RetryPolicy in typing.get_args(retry) and typing.Any not in typing.get_args(retry)
    assert hints["durability"] == Durability | None


@pytest.mark.parametrize(("reply", "cause"), [
    ("OOM command not allowed when used memory > 'maxmemory'.", "out of memory"),
    ("MISCONF Errors writing to the AOF file: No space left on device", "cannot persist"),
    ("Command # 1 (EVALSHA x) of pipeline caused error: MISCONF Redis is configured to save "
     "RDB snapshots, but it's currently unable to persist to disk.", "cannot persist"),
    ("NOREPLICAS Not enough good replicas to write.", "replicas"),
])
def test_refused_writes_are_transient_and_say_why(reply: str, cause: str) -> None:
    """A Redis refusing writes is waited out as an outage (issue 19), never a bad command."""
    error = redis.exceptions.ResponseError(reply)
    assert is_transient(error)
    assert cause in (write_refusal(error) or "")
    # redis-py's own class for OOM, whose message has lost its "OOM "
    error = redis.exceptions.OutOfMemoryError("command not allowed when used memory > ...")
    assert is_transient(error) and "out of memory" in (write_refusal(error) or "")
    assert write_refusal(redis.exceptions.ResponseError("READONLY replica")) is None
