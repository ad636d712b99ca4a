"""Blueque: a Redis job queue for very long jobs, wire-compatible with blueque 1.0.1."""

from blueque.client import Client
from blueque.errors import (
    BluequeError,
    CallbackError,
    ConfigurationError,
    CorruptTask,
    InvalidTaskState,
    RedisUnavailable,
    StaleAttempt,
    TaskNotFound,
)
from blueque.queue import BulkEnqueue, Queue, QueueStats
from blueque.task import Task

__all__ = [
    "BluequeError",
    "BulkEnqueue",
    "CallbackError",
    "Client",
    "ConfigurationError",
    "CorruptTask",
    "InvalidTaskState",
    "Queue",
    "QueueStats",
    "RedisUnavailable",
    "StaleAttempt",
    "Task",
    "TaskNotFound",
]
