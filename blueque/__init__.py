"""Blueque: a Redis job queue for very long jobs, wire-compatible with blueque 1.0.1."""

from blueque.client import Client
from blueque.errors import (
    AuthenticationFailed,
    BluequeError,
    CallbackError,
    CheckpointTooLarge,
    ConfigurationError,
    CorruptTask,
    InvalidTaskState,
    RedisUnavailable,
    StaleAttempt,
    TaskNotFound,
    UnsupportedServer,
    WaitTimeout,
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
    "InvalidTaskState",
    "Queue",
    "QueueStats",
    "RedisUnavailable",
    "StaleAttempt",
    "Task",
    "TaskNotFound",
    "UnsupportedServer",
    "WaitTimeout",
    "WrongType",
]
