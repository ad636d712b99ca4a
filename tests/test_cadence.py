"""The listener loop's timers (blueque.daemon.wakeup.Cadence), step by step on a made-up clock: each
periodic job comes due at its own period, a Redis outage suspends them for a growing backoff,
and the lease is renewed first once Redis is back (PROTOCOL.md 6, "Outages")."""

from __future__ import annotations

import pytest

from blueque.daemon.wakeup import Cadence, Timer


@pytest.mark.parametrize(("timer", "period"), [("renew", 5.0), ("sweep", 10.0), ("due", 1.0)])
def test_each_timer_is_due_at_once_then_every_period(timer: Timer, period: float) -> None:
    cadence = Cadence(interval=10.0, poll=1.0)
    assert cadence.due(timer, 100.0)  # a new listener does everything at its first step
    cadence.done(timer, 100.0)
    assert not cadence.due(timer, 100.0 + period - 0.01)
    assert cadence.due(timer, 100.0 + period)
    assert 100.0 + period in cadence.deadlines()
    cadence.soon(timer)
    assert cadence.due(timer, 100.0)


def test_an_outage_waits_a_growing_backoff_and_renews_first_when_redis_is_back() -> None:
    cadence = Cadence(interval=10.0, poll=1.0)
    for timer in ("renew", "sweep", "due"):
        cadence.done(timer, 100.0)
    assert cadence.back() is False  # no outage to end
    news, first = cadence.outage(101.0)
    assert news and cadence.down_since == 101.0
    again, second = cadence.outage(101.5)
    assert not again and cadence.down_since == 101.0  # said once per outage
    assert 0 < first < second <= 5.0  # half an interval at most
    assert cadence.deadlines() == []  # overdue timers do not cut the backoff short
    assert cadence.due("renew", 101.6)  # before its period: Redis was away
    assert not cadence.due("sweep", 101.6)
    assert cadence.back() is True and cadence.down_since is None
    assert not cadence.due("renew", 101.6)
    assert cadence.outage(102.0)[1] == first  # the backoff starts again for the next outage
