"""The library's operator reads and actions that `blueque status`, `preempt` and `retry
--failed` are built on: Client.listeners(), Queue.retry_failed(), blueque.report_progress."""

from __future__ import annotations

import os
import socket
import time

import pytest

import blueque
import blueque.child
from blueque.keys import Keys
from blueque.reporting import ParentLink
from blueque.task_process.progress import ParentProgress, ProgressReporter
from blueque.testing import wait_for

KEYS = Keys()


def failed_task(client: blueque.Client, queue: str, error: str = "boom") -> str:
    """A task of ``queue`` reserved, started and failed through the library."""
    task_id = client.get_queue(queue).enqueue("{}")
    listener = client.get_listener(queue)
    task = listener.reserve()
    assert task is not None and task.id == task_id
    processor = client.get_processor(task)
    processor.start(os.getpid())
    processor.fail(error)
    listener.close()
    return task_id


# --- Client.listeners() -----------------------------------------------------------------------
def register(client: blueque.Client, queue: str, listener: str, lease_ms: int,
             info: dict[str, str] | None = None) -> None:
    store = client.store
    store.add_listener(queue, listener)
    store.lease(queue, listener, lease_ms, "register")
    if info is not None:
        store.write_listener_info(listener, info, 60)


def test_listeners_are_typed_records_with_their_leases(any_client: blueque.Client) -> None:
    renewed = time.time() - 5
    register(any_client, "jobs", "alive.example_11", 60_000,
             {"host": "alive.example", "pid": "11", "renewed": repr(renewed)})
    register(any_client, "mail", "alive.example_11", 30_000)  # one listener, two queues
    register(any_client, "jobs", "dead.example_22", 1)
    any_client.store.add_listener("jobs", "lost.example_33")  # registered, never leased
    wait_for(lambda: "dead.example_22" in any_client.store.expired_listeners("jobs"),
             timeout=5)

    found = any_client.listeners()
    assert all(isinstance(item, blueque.ListenerStatus) for item in found)
    assert sorted((item.queue, item.listener) for item in found) == [
        ("jobs", "alive.example_11"), ("jobs", "dead.example_22"), ("jobs", "lost.example_33"),
        ("mail", "alive.example_11")]
    by_key = {(item.queue, item.listener): item for item in found}
    alive = by_key["jobs", "alive.example_11"]
    assert alive.lease_remaining is not None and 55 < alive.lease_remaining <= 60
    assert alive.lease_deadline_ms is not None and not alive.expired
    assert (alive.host, alive.info["pid"]) == ("alive.example", "11")
    assert alive.renewed_age is not None and 4 < alive.renewed_age < 60
    assert alive.preempting_until is None
    mail = by_key["mail", "alive.example_11"]
    assert mail.lease_remaining is not None and 25 < mail.lease_remaining <= 30
    assert mail.info == alive.info  # its one description
    dead = by_key["jobs", "dead.example_22"]
    assert dead.expired and dead.lease_remaining is not None and dead.lease_remaining < 0
    assert (dead.info, dead.host, dead.renewed_age) == ({}, None, None)
    lost = by_key["jobs", "lost.example_33"]
    assert (lost.lease_deadline_ms, lost.lease_remaining, lost.expired) == (None, None, False)
    assert [item.queue for item in any_client.listeners(["mail"])] == ["mail"]


def test_a_preempted_listener_says_when_its_node_goes_away(any_client: blueque.Client
                                                          ) -> None:
    deadline = time.time() + 80
    register(any_client, "jobs", "spot.example_7", 60_000,
             {"host": "spot.example", "preempting_until": repr(deadline)})
    register(any_client, "jobs", "odd.example_8", 60_000,
             {"host": "odd.example", "preempting_until": "soon"})
    by_id = {item.listener: item for item in any_client.listeners()}
    assert by_id["spot.example_7"].preempting_until == deadline
    assert by_id["odd.example_8"].preempting_until is None  # unreadable: not preempting


def test_no_queues_no_listeners(any_client: blueque.Client) -> None:
    assert any_client.listeners() == []
    any_client.get_queue("empty").enqueue("{}")
    assert any_client.listeners() == []


# --- Queue.retry_failed() ---------------------------------------------------------------------
def test_retry_failed_retries_the_oldest_first(any_client: blueque.Client) -> None:
    failed = [failed_task(any_client, "r", f"boom {n}") for n in range(4)]
    queue = any_client.get_queue("r")
    assert queue.retry_failed(limit=1) == failed[:1]
    assert queue.retry_failed() == failed[1:]
    assert queue.retry_failed() == []
    assert sorted(queue.task_ids("pending")) == sorted(failed)
    task = any_client.get_task(failed[2]).refresh()
    assert (task.status, task.attempts, task.data["last_error"]) == ("pending", 1, "boom 2")


def test_retry_failed_skips_a_task_gone_meanwhile(any_client: blueque.Client) -> None:
    failed = [failed_task(any_client, "r") for _ in range(3)]
    any_client.redis.delete(KEYS.task(failed[0]))  # expired or deleted after the listing
    assert any_client.get_queue("r").retry_failed() == failed[1:]
    assert sorted(any_client.get_queue("r").task_ids("pending")) == sorted(failed[1:])


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_retry_failed_refuses_a_limit_below_one(any_client: blueque.Client, limit: object
                                                ) -> None:
    task_id = failed_task(any_client, "r")
    with pytest.raises(blueque.ConfigurationError, match="limit"):
        any_client.get_queue("r").retry_failed(limit)  # type: ignore[arg-type]
    assert any_client.get_task(task_id).status == "failed"


# --- report_progress --------------------------------------------------------------------------
def test_report_progress_is_exported_from_blueque() -> None:
    assert blueque.report_progress is blueque.child.report_progress
    assert "report_progress" in blueque.__all__
    with pytest.raises(blueque.BluequeError, match="only available inside a running task"):
        blueque.report_progress(0.5, "half")


@pytest.mark.parametrize("fraction", [-0.1, 1.5, float("nan")])
def test_every_progress_reporter_refuses_a_fraction_outside_0_to_1(
        any_client: blueque.Client, fraction: float) -> None:
    """One rule for a progress value: the Processor, a task's reporter writing to Redis and a
    listener daemon's child reporting to its listener all refuse it, and nothing is sent."""
    task_id = any_client.get_queue("p").enqueue("{}")
    listener = any_client.get_listener("p")
    task = listener.reserve()
    assert task is not None and task.id == task_id
    processor = any_client.get_processor(task)
    processor.start(os.getpid())
    child_end, listener_end = socket.socketpair()
    with child_end, listener_end:
        to_listener = ParentProgress(ParentLink(child_end, 5.0),
                                     lambda: ProgressReporter(processor))
        for report in (processor.progress, ProgressReporter(processor).report,
                       to_listener.report):
            with pytest.raises(blueque.ConfigurationError, match="between 0 and 1"):
                report(fraction, "too far")
        to_listener.close()
        listener_end.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener_end.recv(1)  # no frame reached the listener
    assert any_client.get_task(task_id).progress is None
    listener.close()
