"""Task functions the Blueque listener daemon runs in the benchmarks (``bench_tasks:noop``).

The daemon imports this module by name, so the benchmark puts this folder on PYTHONPATH.
"""

from __future__ import annotations

import time

import benchcommon as bc


def noop(task: object) -> None:
    return None


def record(task: object) -> None:
    bc.record_first_line()


def record_then_sleep(task: object) -> None:
    """Recovery: say when this run started, then hold the task until killed."""
    bc.record_first_line()
    time.sleep(3600)
