"""blueque.retry: the one backoff schedule, and RetryPolicy.acall (the awaiting twin of
call, which tests/ha/test_ha_settings.py covers) deciding exactly as call does."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import redis

from blueque.retry import RetryPolicy, backoff_delays


def test_backoff_doubles_to_its_cap_with_jitter_in_the_lower_half() -> None:
    assert list(itertools.islice(backoff_delays(0.05, 0.5, jitter=False), 6)) == [
        0.05, 0.1, 0.2, 0.4, 0.5, 0.5]
    for delay, full in zip(backoff_delays(0.05, 0.5), backoff_delays(0.05, 0.5, jitter=False),
                           strict=False):
        assert full / 2 <= delay <= full
        if full == 0.5:
            break


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
