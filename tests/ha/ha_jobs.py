"""Task functions for the HA end-to-end tests (``tests.ha.ha_jobs:NAME`` in real daemons).

``record`` appends "task_id pid attempt" to the file named in its JSON parameters before it
sleeps, so a test can count how many times each task really ran."""

from __future__ import annotations

import json
import os
import time

from blueque.task import Task


def record(task: Task) -> str:
    params = json.loads(task.parameters or "{}")
    with open(params["log"], "a", encoding="utf-8") as handle:
        handle.write(f"{task.id} {os.getpid()} {task.attempts}\n")
    time.sleep(float(params.get("seconds", 0.05)))
    return f"done {params.get('n', '')}"
