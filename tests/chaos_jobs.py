"""The task the chaos test runs (tests.chaos_jobs:work): it journals every run to a file per
task, so the test can tell how often each task's work started and how often it finished.

Parameters: {"dir": journal directory, "seconds": how long the work takes}."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from blueque.task import Task
from blueque.task_process.child import report_progress


def _journal(task: Task, directory: str, event: str) -> None:
    line = f"{event} {task.attempts} {os.getpid()} {time.time():.6f}\n"
    # O_APPEND writes of one short line are atomic: runs of one task never mix their lines
    fd = os.open(Path(directory) / task.id, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def work(task: Task) -> str:
    params = json.loads(task.parameters or "{}")
    _journal(task, params["dir"], "start")
    seconds = float(params["seconds"])
    began = time.monotonic()
    while (elapsed := time.monotonic() - began) < seconds:
        # progress is best effort: a Redis restart must never fail the task from here
        report_progress(min(1.0, elapsed / seconds), f"{elapsed:.1f} of {seconds:g} s")
        time.sleep(min(0.2, max(0.0, seconds - elapsed)))
    _journal(task, params["dir"], "end")
    return "ok"
