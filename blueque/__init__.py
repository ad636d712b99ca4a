"""Blueque: a Redis job queue for very long jobs, wire-compatible with blueque 1.0.1."""

from blueque.child import report_progress
from blueque.client import Client, ListenerStatus
from blueque.errors import (
    AuthenticationFailed,
    BluequeError,
    CallbackError,
    CheckpointTooLarge,
    ConfigurationError,
    CorruptTask,
    DependencyError,
    EvictingServer,
    InvalidTaskState,
    Preempted,
    RedisUnavailable,
    StaleAttempt,
    TaskNotFound,
    UnsupportedServer,
    WaitTimeout,
    WritesRefused,
    WrongType,
)
from blueque.queue import BulkEnqueue, Queue, QueueStats
from blueque.task import Task

__all__ = [
    "AuthenticationFailed",
    "BluequeError",
    "BulkEnqueue",
    "CallbackError",
    "CheckpointTooLarge",
    "Client",
    "ConfigurationError",
    "CorruptTask",
    "DependencyError",
    "EvictingServer",
    "InvalidTaskState",
    "ListenerStatus",
    "Preempted",
    "Queue",
    "QueueStats",
    "RedisUnavailable",
    "StaleAttempt",
    "Task",
    "TaskNotFound",
    "UnsupportedServer",
    "WaitTimeout",
    "WritesRefused",
    "WrongType",
    "report_progress",
]
