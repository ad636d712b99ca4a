"""Waiting on a condition with a deadline, instead of sleeping and hoping."""

from __future__ import annotations

import time


def wait_for(predicate: object, timeout: float = 10.0, interval: float = 0.01) -> None:
    """Poll ``predicate()`` until it is truthy; raise TimeoutError after ``timeout`` seconds."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s: {predicate!r}")
        time.sleep(interval)
