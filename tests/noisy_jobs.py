"""A task module that is noisy at import, as some are (a model loaded, a library's warning):
for tests/test_task_logs.py, which checks the listener's JSON log stays JSON."""

from __future__ import annotations

import sys
import warnings

from blueque.task import Task

if "--log-format" in sys.argv:  # imported by a listener, not by the test process
    warnings.warn("a library warning at import", UserWarning, stacklevel=1)
    print("loading the model at import", flush=True)


def work(task: Task) -> str:
    print("the task's own output")
    return "ok"
