"""Task functions the Blueque listener daemon runs in the benchmarks (``bench_tasks:noop``).

The daemon imports this module by name, so the benchmark puts this folder on PYTHONPATH. It
imports nothing heavy itself (benchcommon, which holds redis-py, only in the functions that
need it): the listener's fork server imports it (PROTOCOL.md 6.8), and a module that pulled
in redis-py would make every forked task process as big as a listener, which a no-op task
module in real use is not.
"""

from __future__ import annotations

import time


def noop(task: object) -> None:
    return None


def line(task: object) -> None:
    """The memory scenario's task that prints one line (benchcommon.LINE_BYTES)."""
    print("x" * 99, flush=True)


def record(task: object) -> None:
    """Pickup: say when this run started. The clock is read before benchcommon (redis-py) is
    imported: the task function's first line, as the peers' record it."""
    started = time.time()
    import benchcommon as bc

    bc.record_first_line(started)


def record_then_sleep(task: object) -> None:
    """Recovery: say when this run started, then hold the task until killed."""
    started = time.time()
    import benchcommon as bc

    bc.record_first_line(started)
    time.sleep(3600)
