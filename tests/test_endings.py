"""The one rule for how a run ends (blueque.endings.decide), case by case: every path that
records a run's end (the listener, an orphaned child, recovery) calls it."""

from __future__ import annotations

import random

import pytest

from blueque.endings import Ending, decide
from blueque.policy import Policy

NOW = 1000.0
RETRYING = Policy(max_attempts=3, retry_backoff=10.0, retry_backoff_max=3600.0)


class Fixed(random.Random):
    def random(self) -> float:
        return 0.5


@pytest.mark.parametrize("policy, task, ran, stopped, retry, expected", [
    # a run that returned completes, whatever else happened meanwhile
    (RETRYING, {"attempts": "1", "cancel_requested": "5"}, "complete", "cancelled", True,
     Ending("complete", "boom")),
    # a failure is retried while attempts remain: 10 s, half fixed, half jittered
    (RETRYING, {"attempts": "1"}, "failed", "", True, Ending("retry", "boom", NOW + 7.5)),
    (RETRYING, {"attempts": "2"}, "failed", "time limit", True,
     Ending("retry", "boom", NOW + 15.0)),
    (RETRYING, {"attempts": "3"}, "failed", "", True, Ending("failed", "boom")),
    # the work finished but its value cannot be recorded: running it again would not help
    (RETRYING, {"attempts": "1"}, "failed", "", False, Ending("failed", "boom")),
    # preempted runs are no attempts: attempt 3 after two preemptions is the first used
    (RETRYING, {"attempts": "3", "preemptions": "2"}, "failed", "", True,
     Ending("retry", "boom", NOW + 7.5)),
    # cancelled wins over a retry, keeping the operator's reason
    (RETRYING, {"attempts": "1", "cancel_requested": "5", "cancel_reason": "cancelled: dup"},
     "failed", "", True, Ending("failed", "cancelled: dup (boom)", cancelled=True)),
    (RETRYING, {"attempts": "1"}, "failed", "cancelled", True,
     Ending("failed", "cancelled (boom)", cancelled=True)),
    # a preemption puts the task back, reported or stopped at the deadline
    (Policy(), {"attempts": "1"}, "preempted", "", True, Ending("preempted", "boom")),
    (Policy(), {"attempts": "4", "preemptions": "3"}, "failed", "preempted", True,
     Ending("preempted", "boom")),
    # ... until max_preemptions: then it fails instead of looping
    (Policy(max_preemptions=2), {"attempts": "3", "preemptions": "2"}, "preempted", "", True,
     Ending("failed", "preempted 3 times, more than its max_preemptions of 2: stopped so that "
                      "it does not loop (boom)")),
    # a corrupt counter counts as none
    (RETRYING, {"attempts": "x", "preemptions": "?"}, "failed", "", True,
     Ending("retry", "boom", NOW + 7.5)),
])
def test_decide(policy, task, ran, stopped, retry, expected) -> None:  # type: ignore[no-untyped-def]
    assert decide(policy, task, ran, "boom", NOW, retry=retry, stopped=stopped,
                  rng=Fixed()) == expected
