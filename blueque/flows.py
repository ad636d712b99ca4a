"""Chains and groups, built on ``after=`` (PROTOCOL.md 5.21): what a pipeline of long jobs
needs without bookkeeping of its own.

``chain(client, [(queue, parameters), ...])`` enqueues each step after the one before (A ->
B -> C): a step reads the previous result through ``task.parents()``. ``group(client,
queue, parameters, then=(queue, parameters))`` enqueues many tasks at enqueue_many's speed
and one callback after all of them (a fan-in, Celery's chord). ``achain`` and ``agroup`` are
the same for blueque.aio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import blueque.aio
from blueque.client import Client
from blueque.errors import ConfigurationError
from blueque.queue import TaskId

#: One step: (queue name, parameters).
Step = tuple[str, object]


@dataclass(frozen=True)
class Group:
    """What ``group`` enqueued: the tasks, and the callback that runs after them."""

    task_ids: list[str]
    callback: TaskId


def _steps(steps: Sequence[Step]) -> list[Step]:
    if not steps or any(not isinstance(s, tuple) or len(s) != 2 for s in steps):
        raise ConfigurationError("a chain is a non-empty list of (queue, parameters) steps")
    return list(steps)


def chain(client: Client, steps: Sequence[Step], after: object = None) -> list[TaskId]:
    """Enqueue ``steps`` so that each runs after the one before (the first after ``after``,
    when given); a step that fails (or is cancelled) ends the rest as failed. Returns their
    ids, in order."""
    ids: list[TaskId] = []
    for queue, parameters in _steps(steps):
        previous = ids[-1] if ids else after
        ids.append(client.get_queue(queue).enqueue(parameters, after=previous))
    return ids


def group(client: Client, queue: str, parameters: Sequence[object], then: Step,
          after_any: bool = False) -> Group:
    """Enqueue the tasks of ``parameters`` on ``queue`` (enqueue_many: 1,000 per script
    call), then ``then`` (queue, parameters) after all of them; ``after_any``: the callback
    runs however they ended (else only if every one completed)."""
    tasks = client.get_queue(queue).enqueue_many(parameters)
    callback_queue, callback_parameters = then
    callback = client.get_queue(callback_queue).enqueue(
        callback_parameters, after=tasks.task_ids, after_any=after_any)
    return Group(tasks.task_ids, callback)


async def achain(client: blueque.aio.Client, steps: Sequence[Step], after: object = None
                 ) -> list[TaskId]:
    """``chain`` through the asyncio client."""
    ids: list[TaskId] = []
    for queue, parameters in _steps(steps):
        previous = ids[-1] if ids else after
        ids.append(await client.get_queue(queue).enqueue(parameters, after=previous))
    return ids


async def agroup(client: blueque.aio.Client, queue: str, parameters: Sequence[object],
                 then: Step, after_any: bool = False) -> Group:
    """``group`` through the asyncio client."""
    tasks = await client.get_queue(queue).enqueue_many(parameters)
    callback_queue, callback_parameters = then
    callback = await client.get_queue(callback_queue).enqueue(
        callback_parameters, after=tasks.task_ids, after_any=after_any)
    return Group(tasks.task_ids, callback)
