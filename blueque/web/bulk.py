"""The dashboard's bulk actions on the tasks selected in a list: retry, cancel, delete, each
task through the operation the CLI and the library use for one (Client.retry_task,
Client.cancel_task, Queue.delete_task). A task that cannot take the action (gone, or in a
state that refuses it) is named in the answer; the others are done."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from blueque.client import Client
from blueque.errors import InvalidTaskState, TaskNotFound

#: Tasks one bulk action takes at most (a page shows 50).
BULK_LIMIT = 500


class PartlyDone(ValueError):
    """Some selected tasks could not take the action; the message says which and why."""


def task_ids(body: dict[str, Any]) -> list[str]:
    given = body.get("task_ids")
    if (not isinstance(given, list) or not given
            or not all(isinstance(task_id, str) and task_id for task_id in given)):
        raise ValueError("give task_ids as a non-empty list of task ids")
    if len(given) > BULK_LIMIT:
        raise ValueError(f"at most {BULK_LIMIT} tasks at once, not {len(given)}")
    return list(dict.fromkeys(given))  # each once, in the order given


def _each(body: dict[str, Any], verb: str, act: Callable[[str], None]) -> str:
    done, refused = 0, []
    for task_id in task_ids(body):
        try:
            act(task_id)
            done += 1
        except (TaskNotFound, InvalidTaskState) as error:
            refused.append(f"{task_id} ({error})")
    message = f"{done} task(s) {verb}"
    if refused:
        shown = "; ".join(refused[:5]) + (f"; and {len(refused) - 5} more" if
                                           len(refused) > 5 else "")
        raise PartlyDone(f"{message}; {len(refused)} refused: {shown}")
    return message


def retry(client: Client, body: dict[str, Any]) -> str:
    """Each selected task that failed (or was cancelled: asked for by its id) pending again."""
    return _each(body, "pending again", client.retry_task)


def cancel(client: Client, body: dict[str, Any]) -> str:
    """Each selected waiting task cancelled; a running one's listener told to stop it."""
    def one(task_id: str) -> None:
        client.cancel_task(task_id, "cancelled from the dashboard")

    return _each(body, "cancelled (running ones are being stopped)", one)


def delete(client: Client, body: dict[str, Any]) -> str:
    """Each selected finished task deleted (its hash and its list entry)."""
    def one(task_id: str) -> None:
        task = client.get_task(task_id, missing_ok=True)
        if task.queue is None:
            raise TaskNotFound(task_id)
        client.get_queue(task.queue).delete_task(task)

    return _each(body, "deleted", one)
