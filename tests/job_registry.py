"""A ``blueque.Jobs`` registry the end-to-end tests run in real listener daemons
(``blueque listen QUEUE tests.job_registry:jobs``). Each job appends a line to the file named
``marker`` when it is given one, to prove how often, and in which process, it ran."""

from __future__ import annotations

import os

import blueque
from blueque.task import Task

jobs = blueque.Jobs()


def _mark(marker: str | None, text: str) -> None:
    if marker:
        with open(marker, "a", encoding="utf-8") as handle:
            handle.write(f"{text} {os.getpid()}\n")


@jobs.job
def resize(task: Task, width: int, height: int = 0, marker: str | None = None) -> dict[str, int]:
    _mark(marker, f"resize {width}x{height}")
    return {"width": width, "height": height or width}


@jobs.job(name="images.thumbnail")
def thumbnail(task: Task, path: str, marker: str | None = None) -> str:
    _mark(marker, f"thumbnail {path}")
    return f"thumbnail of {path} (task {task.id}, attempt {task.attempts})"


@jobs.job
def flaky(task: Task, succeed_on: int, marker: str | None = None) -> str:
    """A job's own exception is an ordinary failure: retried by the task's policy."""
    _mark(marker, f"flaky attempt {task.attempts}")
    if (task.attempts or 0) < succeed_on:
        raise RuntimeError(f"attempt {task.attempts} failed")
    return f"succeeded on attempt {task.attempts}"
