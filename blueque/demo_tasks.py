"""Example task functions for ``blueque demo`` (and for trying ``blueque listen`` by hand).

    blueque listen demo blueque.demo_tasks:work --concurrency 3
    blueque enqueue demo '{"seconds": 2}'

Parameters are JSON: ``seconds`` to work for (reporting progress as it goes) and
``fail_attempts``: how many first attempts fail (to show retries).
"""

from __future__ import annotations

import json
import time

from blueque.task import Task
from blueque.task_process.child import report_progress

#: How often work() reports progress.
STEP = 0.25


def work(task: Task) -> dict[str, object]:
    """Sleep for ``seconds`` in steps, reporting progress; fail the first ``fail_attempts``
    attempts; return what was done (recorded as JSON)."""
    parameters = json.loads(task.parameters or "{}")
    seconds = float(parameters.get("seconds", 1.0))
    attempt = task.attempts or 1
    steps = max(1, round(seconds / STEP))
    for step in range(1, steps + 1):
        time.sleep(seconds / steps)
        report_progress(step / steps, f"step {step} of {steps}")
    if attempt <= int(parameters.get("fail_attempts", 0)):
        raise RuntimeError(f"simulated failure of attempt {attempt}")
    return {"seconds": seconds, "attempt": attempt}
