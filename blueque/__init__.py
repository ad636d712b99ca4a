"""Blueque: a Redis job queue for very long jobs, wire-compatible with blueque 1.0.1.

The errors are imported with the package; a producer's other names (Client, Queue, Task) and a
task function author's (``from blueque import report_progress, preempted, on_preempt, ...``)
are imported when first used (PEP 562), so that ``import blueque`` in a producer does not load
the task process's machinery (blueque.task_process.child, the listener's frames, preemption,
progress), nor
``import blueque.task_process.child`` in the fork server (PROTOCOL.md 6.8) redis-py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from blueque.errors import (
    AuthenticationFailed,
    BluequeError,
    CallbackError,
    CheckpointTooLarge,
    ConfigurationError,
    CorruptTask,
    DependencyError,
    EvictingServer,
    InvalidJob,
    InvalidTaskState,
    MissingTaskWarning,
    Preempted,
    RedisUnavailable,
    StaleAttempt,
    TaskNotFound,
    UnsupportedServer,
    WaitTimeout,
    WritesRefused,
    WrongType,
)

if TYPE_CHECKING:
    from blueque.client import Client, ListenerStatus
    from blueque.jobs import Jobs, job_parameters
    from blueque.preemption import on_preempt, preempt_deadline, preempted
    from blueque.processor import check_result
    from blueque.queue import BulkEnqueue, Queue, QueueStats
    from blueque.task import CheckpointInfo, Task
    from blueque.task_process.child import TaskFunction
    from blueque.task_process.progress import report_progress

#: A producer's names that need redis-py, and the module each comes from (imported on first
#: use, so that a process that only runs tasks, the fork server, does not load redis-py).
_PRODUCER_NAMES = {
    "Client": "blueque.client",
    "ListenerStatus": "blueque.client",
    "Queue": "blueque.queue",
    "BulkEnqueue": "blueque.queue",
    "QueueStats": "blueque.queue",
    "Task": "blueque.task",
    "CheckpointInfo": "blueque.task",
}
#: What a task function's author uses, and the module each comes from (imported on first use).
_TASK_AUTHOR_NAMES = {
    "report_progress": "blueque.task_process.progress",
    "preempted": "blueque.preemption",
    "on_preempt": "blueque.preemption",
    "preempt_deadline": "blueque.preemption",
    "TaskFunction": "blueque.task_process.child",
    "check_result": "blueque.processor",
    # a registry is made where its jobs are, in the task module: no redis-py in it
    "Jobs": "blueque.jobs",
    "job_parameters": "blueque.jobs",
}

if not TYPE_CHECKING:  # mypy reads the imports above; an unknown name stays an error for it

    def __getattr__(name: str) -> Any:
        module = _PRODUCER_NAMES.get(name) or _TASK_AUTHOR_NAMES.get(name)
        if module is None:
            raise AttributeError(f"module 'blueque' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # imported once
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(_PRODUCER_NAMES) | set(_TASK_AUTHOR_NAMES))


__all__ = [
    "AuthenticationFailed",
    "BluequeError",
    "BulkEnqueue",
    "CallbackError",
    "CheckpointInfo",
    "CheckpointTooLarge",
    "Client",
    "ConfigurationError",
    "CorruptTask",
    "DependencyError",
    "EvictingServer",
    "InvalidJob",
    "InvalidTaskState",
    "Jobs",
    "ListenerStatus",
    "MissingTaskWarning",
    "Preempted",
    "Queue",
    "QueueStats",
    "RedisUnavailable",
    "StaleAttempt",
    "Task",
    "TaskFunction",
    "TaskNotFound",
    "UnsupportedServer",
    "WaitTimeout",
    "WritesRefused",
    "WrongType",
    "check_result",
    "job_parameters",
    "on_preempt",
    "preempt_deadline",
    "preempted",
    "report_progress",
]
