"""Interoperability with the original blueque 1.0.1, on one Redis.

The original runs from PyPI in its own virtualenv (tests/interop/harness.py) and is driven by
tests/interop/driver.py, a program that uses only the 1.0.1 API. Each test lets one
implementation create or reserve tasks and the other pick them up, then asserts the final Redis
state: the task hashes' fields and the pending, scheduled, started, reserved and finished keys.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from interop.harness import Implementation, Running

import blueque
from blueque.jobs import job_parameters
from blueque.store import CHECKPOINT_KEEP
from blueque.testing import wait_for
from tests.daemons import Daemon, listen_command
from tests.job_registry import jobs

pytestmark = pytest.mark.interop

QUEUE = "interop"
HOST = socket.getfqdn()


@pytest.fixture(scope="session")
def original() -> Implementation:
    """blueque 1.0.1 in a cached virtualenv (built from PyPI on the first run)."""
    return Implementation.original()


@pytest.fixture(scope="session")
def ours() -> Implementation:
    """This repository's Blueque, run as a separate process through the same driver."""
    return Implementation.ours()


@pytest.fixture
def drivers(redis_url: str) -> Iterator[list[Running]]:
    """Driver processes a test starts in the background; each is stopped by pid afterwards."""
    running: list[Running] = []
    yield running
    for process in running:
        process.stop()


def layout(client: blueque.Client, queue: str = QUEUE) -> dict[str, Any]:
    """Every 1.0.1 collection of a queue, read straight from Redis."""
    r, keys = client.redis, client.keys
    return {
        "pending": r.lrange(keys.pending(queue), 0, -1),
        "scheduled": r.zrange(keys.scheduled(queue), 0, -1),
        "started": r.smembers(keys.started(queue)),
        "complete": r.lrange(keys.complete(queue), 0, -1),
        "failed": r.lrange(keys.failed(queue), 0, -1),
    }


def fields(client: blueque.Client, task_id: str) -> dict[str, str]:
    data: dict[str, str] = client.redis.hgetall(client.keys.task(task_id))
    return data


def reserved(client: blueque.Client, listener_id: str, queue: str = QUEUE) -> list[str]:
    ids: list[str] = client.redis.lrange(client.keys.reserved(queue, listener_id), 0, -1)
    return ids


def wait_finished(client: blueque.Client, count: int, timeout: float = 30) -> None:
    def finished() -> bool:
        state = layout(client)
        return len(state["complete"]) + len(state["failed"]) >= count

    wait_for(finished, timeout)


def process_with_ours(client: blueque.Client, listener: Any) -> blueque.Task:
    """Our Listener.listen() + Processor, inline: what a 1.0.1-style worker does."""
    task = listener.listen(timeout=10)
    assert task is not None, "our listener reserved nothing within 10 s"
    assert task.status == "reserved" and task.node == listener.id
    processor = client.get_processor(task)
    processor.start(os.getpid())
    assert task.parameters is not None
    if task.parameters.startswith("fail"):
        processor.fail(f"ours failed: {task.parameters}")
    else:
        processor.complete(f"ours result: {task.parameters}")
    return task


# --- tasks enqueued by one implementation, processed by the other ---------------------------


def test_original_enqueues_and_our_listener_processes(
    original: Implementation, client: blueque.Client, redis_url: str
) -> None:
    ids = original.run(redis_url, "enqueue", QUEUE, "a", "b", "fail-c")["ids"]
    assert layout(client)["pending"] == ids[::-1]  # LPUSH in, taken from the right

    listener = client.get_listener(QUEUE)
    processed = [process_with_ours(client, listener).id for _ in ids]
    listener.close()

    assert processed == ids  # first in, first out
    assert layout(client) == {
        "pending": [], "scheduled": [], "started": set(),
        "complete": [ids[1], ids[0]], "failed": [ids[2]],
    }
    assert reserved(client, listener.id) == []
    assert fields(client, ids[0])["result"] == "ours result: a"
    assert fields(client, ids[2])["error"] == "ours failed: fail-c"
    assert fields(client, ids[2])["status"] == "failed"

    # The original reads what ours wrote, with its own types.
    seen = original.run(redis_url, "get-task", *ids)["tasks"]
    for view, task_id in zip(seen, ids, strict=True):
        assert view["task"]["id"] == task_id
        assert view["task"]["queue"] == QUEUE
        assert view["task"]["node"] == listener.id
        assert view["task"]["pid"] == os.getpid()
        assert view["types"]["pid"] == "int"
        assert view["types"]["created"] == view["types"]["updated"] == "float"
    assert [v["task"]["status"] for v in seen] == ["complete", "complete", "failed"]
    assert seen[1]["task"]["result"] == "ours result: b"


def test_ours_enqueues_and_original_listener_processes(
    original: Implementation, client: blueque.Client, redis_url: str
) -> None:
    queue = client.get_queue(QUEUE)
    ids = [
        queue.enqueue("a"),
        queue.enqueue("fail-b"),
        queue.enqueue("c", task_id="caller-chosen-id", max_attempts=2),
    ]
    assert ids[2] == "caller-chosen-id"

    report = original.run(redis_url, "process", QUEUE, "3")
    assert report["ids"] == ids
    node = f"{HOST}_{report['pid']}"

    assert layout(client) == {
        "pending": [], "scheduled": [], "started": set(),
        "complete": [ids[2], ids[0]], "failed": [ids[1]],
    }
    assert reserved(client, node) == []
    for task_id in ids:
        task = client.get_task(task_id)
        assert task.node == node and task.pid == report["pid"]
        assert task.created is not None and task.updated is not None
        assert task.updated >= task.created
    assert client.get_task(ids[0]).result == "orig result: a"
    assert client.get_task(ids[1]).error == "orig failed: fail-b"
    assert client.get_task(ids[2]).status == "complete"
    assert fields(client, ids[2])["max_attempts"] == "2"  # our field survives the original


def test_original_forking_runner_processes_what_ours_enqueued(
    original: Implementation, client: blueque.Client, redis_url: str, drivers: list[Running]
) -> None:
    queue = client.get_queue(QUEUE)
    ids = [queue.enqueue("one"), queue.enqueue("fail-two")]
    ids += queue.enqueue_many(["three", "four"]).task_ids

    runner = original.start(redis_url, "runner", QUEUE)
    drivers.append(runner)
    runner_pid = runner.report()["pid"]
    wait_finished(client, len(ids))
    runner.stop()

    node = f"{HOST}_{runner_pid}"
    state = layout(client)
    assert state["pending"] == [] and state["started"] == set()
    assert sorted(state["complete"]) == sorted([ids[0], ids[2], ids[3]])
    assert state["failed"] == [ids[1]]
    assert reserved(client, node) == []
    for task_id in ids:
        task = client.get_task(task_id)
        assert task.node == node
        assert task.pid is not None and task.pid != runner_pid  # a forked child ran it
    result = client.get_task(ids[0]).result
    assert result is not None and result.startswith("orig result: one (runner pid ")
    assert client.get_task(ids[1]).error == "orig failed: fail-two"


def test_our_forking_runner_processes_what_the_original_enqueued(
    original: Implementation,
    ours: Implementation,
    client: blueque.Client,
    redis_url: str,
    drivers: list[Running],
) -> None:
    ids = original.run(redis_url, "enqueue", QUEUE, "one", "fail-two", "three")["ids"]

    runner = ours.start(redis_url, "runner", QUEUE)
    drivers.append(runner)
    runner_pid = runner.report()["pid"]
    wait_finished(client, len(ids))
    runner.stop()

    state = layout(client)
    assert state["pending"] == [] and state["started"] == set()
    assert sorted(state["complete"]) == sorted([ids[0], ids[2]])
    assert state["failed"] == [ids[1]]
    seen = original.run(redis_url, "get-task", *ids)["tasks"]
    for view in seen:
        assert view["task"]["node"].startswith(f"{HOST}_")
        assert isinstance(view["task"]["pid"], int) and view["task"]["pid"] != runner_pid
        assert reserved(client, view["task"]["node"]) == []
    assert seen[0]["task"]["status"] == "complete"
    assert seen[0]["task"]["result"].startswith("ours result: one (runner pid ")
    assert seen[1]["task"]["status"] == "failed"
    assert "ours failed: fail-two" in seen[1]["task"]["error"]


# --- scheduled tasks moved by the other implementation ------------------------------------


def test_tasks_the_original_scheduled_are_moved_by_ours(
    original: Implementation, client: blueque.Client, redis_url: str
) -> None:
    due = original.run(redis_url, "schedule", QUEUE, "soon", "0.5")
    later = original.run(redis_url, "schedule", QUEUE, "later", "3600")
    assert fields(client, due["id"])["status"] == "scheduled"
    assert layout(client)["scheduled"] == [due["id"], later["id"]]

    # (No "nothing is due yet" check: starting a driver can take longer than the 0.5 s; the
    # task due in an hour shows that the eta is respected.)
    queue = client.get_queue(QUEUE)
    wait_for(lambda: time.time() > due["eta"], timeout=5)
    assert queue.enqueue_due_tasks() == [due["id"]]

    state = layout(client)
    assert state["pending"] == [due["id"]] and state["scheduled"] == [later["id"]]
    assert fields(client, due["id"])["status"] == "pending"
    assert fields(client, later["id"])["status"] == "scheduled"
    # no longer scheduled: its eta goes (1.0.1 reads no eta), the other keeps its own
    assert client.get_task(due["id"]).eta is None
    assert client.get_task(later["id"]).eta == pytest.approx(later["eta"])

    listener = client.get_listener(QUEUE)
    assert process_with_ours(client, listener).id == due["id"]
    listener.close()
    assert fields(client, due["id"])["result"] == "ours result: soon"
    assert layout(client)["complete"] == [due["id"]]


def test_tasks_ours_scheduled_are_moved_by_the_original(
    original: Implementation, client: blueque.Client, redis_url: str
) -> None:
    queue = client.get_queue(QUEUE)
    eta = time.time() + 0.5
    due = queue.schedule("soon", eta)
    later = queue.schedule("later", time.time() + 3600, task_id="later-id")

    assert layout(client)["scheduled"] == [due, later]
    wait_for(lambda: time.time() > eta, timeout=5)
    original.run(redis_url, "enqueue-due", QUEUE)

    state = layout(client)
    assert state["pending"] == [due] and state["scheduled"] == [later]
    assert client.get_task(due).status == "pending"
    assert client.get_task(later).status == "scheduled"

    report = original.run(redis_url, "process", QUEUE, "1")
    assert report["ids"] == [due]
    task = client.get_task(due)
    assert task.status == "complete" and task.result == "orig result: soon"
    assert task.eta == pytest.approx(eta)
    assert layout(client)["complete"] == [due]


def test_a_retry_ours_scheduled_is_moved_and_run_by_the_original(
    original: Implementation, client: blueque.Client, redis_url: str
) -> None:
    task_id = client.get_queue(QUEUE).enqueue("flaky", max_attempts=2)
    listener = client.get_listener(QUEUE)
    task = listener.listen(timeout=10)
    assert task is not None and task.id == task_id and task.attempts == 1
    processor = client.get_processor(task)
    processor.start(os.getpid())
    eta = time.time() + 0.5
    processor.retry("first attempt failed", eta)
    listener.close()

    assert layout(client)["scheduled"] == [task_id]
    assert fields(client, task_id)["status"] == "scheduled"
    assert reserved(client, listener.id) == []

    wait_for(lambda: time.time() > eta, timeout=5)
    original.run(redis_url, "enqueue-due", QUEUE)
    assert layout(client)["pending"] == [task_id]
    original.run(redis_url, "process", QUEUE, "1")

    done = client.get_task(task_id)
    assert done.status == "complete" and done.result == "orig result: flaky"
    assert layout(client) == {
        "pending": [], "scheduled": [], "started": set(), "complete": [task_id], "failed": [],
    }


# --- orphans claimed across implementations ------------------------------------------------


def _hold_and_crash(impl: Implementation, client: blueque.Client, redis_url: str,
                    drivers: list[Running], status: str = "reserved") -> tuple[str, str]:
    """A listener of ``impl`` reserves (and, for status "started", starts) one task and is
    SIGKILLed; returns (task id, the dead listener's id)."""
    holder = impl.start(redis_url, "hold", QUEUE, *(["started"] if status == "started" else []))
    drivers.append(holder)
    report = holder.report()
    dead = f"{HOST}_{holder.pid}"
    assert report["status"] == status
    holder.kill()
    assert reserved(client, dead) == [report["id"]]
    assert dead in client.redis.smembers(client.keys.listeners(QUEUE))
    return report["id"], dead


def test_original_listener_orphan_is_claimed_by_ours(
    original: Implementation, client: blueque.Client, redis_url: str, drivers: list[Running]
) -> None:
    queue = client.get_queue(QUEUE)
    orphan_parameters = "orphaned"
    first = queue.enqueue(orphan_parameters)
    second = queue.enqueue("still pending")
    task_id, dead = _hold_and_crash(original, client, redis_url, drivers)
    assert task_id == first

    listener = client.get_listener(QUEUE)
    claimed = listener.claim_orphan()
    assert claimed is not None and claimed.id == first
    assert claimed.status == "reserved" and claimed.node == dead
    assert fields(client, first)["reclaimed_node"] == listener.id
    assert dead not in client.redis.smembers(client.keys.listeners(QUEUE))
    assert listener.claim_orphan() is None  # claimed once only

    processor = client.get_processor(claimed)
    processor.start(os.getpid())
    processor.complete("ours finished the orphan")
    listener.close()

    assert reserved(client, dead) == []
    assert layout(client) == {
        "pending": [second], "scheduled": [], "started": set(), "complete": [first], "failed": [],
    }
    assert fields(client, first)["result"] == "ours finished the orphan"


def test_our_listener_orphan_is_claimed_by_the_original(
    original: Implementation,
    ours: Implementation,
    client: blueque.Client,
    redis_url: str,
    drivers: list[Running],
) -> None:
    first = client.get_queue(QUEUE).enqueue("orphaned")
    task_id, dead = _hold_and_crash(ours, client, redis_url, drivers)
    assert task_id == first
    assert fields(client, first)["attempts"] == "1"

    report = original.run(redis_url, "claim-orphan", QUEUE)
    claimed = report["claimed"]
    assert claimed is not None, "the original found no orphan"
    assert claimed["task"]["id"] == first
    assert claimed["task"]["status"] == "reserved" and claimed["task"]["node"] == dead
    assert fields(client, first)["reclaimed_node"] == f"{HOST}_{report['pid']}"
    assert dead not in client.redis.smembers(client.keys.listeners(QUEUE))

    assert reserved(client, dead) == []
    assert layout(client) == {
        "pending": [], "scheduled": [], "started": set(), "complete": [first], "failed": [],
    }
    task = client.get_task(first)
    assert task.result == "orig result: orphaned" and task.pid == report["pid"]


def test_original_forking_runner_claims_our_orphan_at_start(
    original: Implementation,
    ours: Implementation,
    client: blueque.Client,
    redis_url: str,
    drivers: list[Running],
) -> None:
    first = client.get_queue(QUEUE).enqueue("orphaned")
    _, dead = _hold_and_crash(ours, client, redis_url, drivers)

    runner = original.start(redis_url, "runner", QUEUE)
    drivers.append(runner)
    runner.report()
    wait_finished(client, 1)
    runner.stop()

    assert reserved(client, dead) == []
    assert layout(client)["complete"] == [first]
    assert client.get_task(first).result.startswith("orig result: orphaned")  # type: ignore[union-attr]


def test_our_forking_runner_requeues_and_runs_a_dead_original_listeners_task(
    original: Implementation,
    ours: Implementation,
    client: blueque.Client,
    redis_url: str,
    drivers: list[Running],
) -> None:
    first = client.get_queue(QUEUE).enqueue("orphaned")
    _, dead = _hold_and_crash(original, client, redis_url, drivers)

    runner = ours.start(redis_url, "runner", QUEUE)
    drivers.append(runner)
    runner.report()
    wait_finished(client, 1)
    runner.stop()

    assert reserved(client, dead) == []
    assert dead not in client.redis.smembers(client.keys.listeners(QUEUE))
    assert layout(client) == {
        "pending": [], "scheduled": [], "started": set(), "complete": [first], "failed": [],
    }
    result = client.get_task(first).result
    assert result is not None and result.startswith("ours result: orphaned")


def test_our_forking_runner_fails_a_task_whose_original_process_died(
    original: Implementation,
    ours: Implementation,
    client: blueque.Client,
    redis_url: str,
    drivers: list[Running],
) -> None:
    first = client.get_queue(QUEUE).enqueue("killed mid-run")
    task_id, dead = _hold_and_crash(original, client, redis_url, drivers, status="started")
    pid = int(dead.rsplit("_", 1)[1])
    assert client.redis.smembers(client.keys.started(QUEUE)) == {f"{dead} {pid} {first}"}

    runner = ours.start(redis_url, "runner", QUEUE)
    drivers.append(runner)
    runner.report()
    wait_finished(client, 1)
    runner.stop()

    # Started by a process that is gone, with the default policy (one attempt): failed.
    assert reserved(client, dead) == []
    assert layout(client) == {
        "pending": [], "scheduled": [], "started": set(), "complete": [], "failed": [first],
    }
    view = original.run(redis_url, "get-task", task_id)["tasks"][0]["task"]
    assert view["status"] == "failed" and view["pid"] == pid
    assert f"listener {dead} died" in view["error"]
    original.run(redis_url, "delete-task", QUEUE, task_id)
    assert fields(client, task_id) == {} and layout(client)["failed"] == []


def test_our_forking_runner_leaves_a_live_original_listener_alone(
    original: Implementation,
    ours: Implementation,
    client: blueque.Client,
    redis_url: str,
    drivers: list[Running],
) -> None:
    queue = client.get_queue(QUEUE)
    held = queue.enqueue("held by the original")
    holder = original.start(redis_url, "hold", QUEUE, "started")
    drivers.append(holder)
    assert holder.report()["id"] == held
    live = f"{HOST}_{holder.pid}"
    other = queue.enqueue("for ours")

    runner = ours.start(redis_url, "runner", QUEUE)
    drivers.append(runner)
    runner.report()
    wait_finished(client, 1)  # after its first recovery sweep, which comes before reserving
    runner.stop()

    assert layout(client)["complete"] == [other]
    assert reserved(client, live) == [held]
    assert fields(client, held)["status"] == "started"
    assert fields(client, held)["node"] == live
    assert client.redis.smembers(client.keys.started(QUEUE)) == {f"{live} {holder.pid} {held}"}
    holder.stop()


def test_our_forking_runner_runs_a_task_the_original_scheduled_when_due(
    original: Implementation,
    ours: Implementation,
    client: blueque.Client,
    redis_url: str,
    drivers: list[Running],
) -> None:
    due = original.run(redis_url, "schedule", QUEUE, "soon", "0.5")["id"]
    later = original.run(redis_url, "schedule", QUEUE, "later", "3600")["id"]

    runner = ours.start(redis_url, "runner", QUEUE)
    drivers.append(runner)
    runner.report()
    wait_finished(client, 1)
    runner.stop()

    assert layout(client)["complete"] == [due] and layout(client)["scheduled"] == [later]
    result = client.get_task(due).result
    assert result is not None and result.startswith("ours result: soon")


# --- the original reads and deletes what ours finished --------------------------------------


def test_original_reads_and_deletes_tasks_ours_finished(
    original: Implementation, client: blueque.Client, redis_url: str
) -> None:
    queue = client.get_queue(QUEUE)
    ok = queue.enqueue("fine", max_attempts=3, time_limit=60)
    bad = queue.enqueue("fail-bad", retry_backoff=1.5)
    kept = queue.enqueue("kept", result_ttl=3600)
    cancelled = queue.enqueue("never runs")
    assert client.cancel_task(cancelled) == "cancelled"

    listener = client.get_listener(QUEUE)
    for _ in range(3):
        task = listener.listen(timeout=10)
        assert task is not None
        processor = client.get_processor(task)
        processor.start(os.getpid())
        processor.progress(0.5, "half way")
        if task.id == bad:
            processor.fail("it broke")
        else:
            processor.complete('{"answer": 42}', result_ttl_ms=3_600_000 if task.id == kept
                               else None)
    listener.close()

    extra = {name for task_id in (ok, bad, kept, cancelled) for name in fields(client, task_id)}
    assert {"attempts", "max_attempts", "progress"} <= extra  # ours added fields

    ids = [ok, bad, kept, cancelled]
    seen = {v["task"]["id"]: v for v in original.run(redis_url, "get-task", *ids)["tasks"]}
    assert seen[ok]["task"]["status"] == "complete"
    assert seen[ok]["task"]["result"] == '{"answer": 42}'
    assert seen[ok]["task"]["pid"] == os.getpid() and seen[ok]["types"]["pid"] == "int"
    assert seen[bad]["task"]["status"] == "failed" and seen[bad]["task"]["error"] == "it broke"
    assert seen[kept]["task"]["status"] == "complete"
    assert seen[cancelled]["task"]["status"] == "failed"
    assert seen[cancelled]["task"]["parameters"] == "never runs"
    for task_id in ids:
        assert seen[task_id]["types"]["created"] == "float"
        assert seen[task_id]["task"]["created"] == pytest.approx(client.get_task(task_id).created)

    original.run(redis_url, "delete-task", QUEUE, *ids)
    for task_id in ids:
        assert fields(client, task_id) == {}
        assert not client.get_task(task_id, missing_ok=True).exists
    assert layout(client) == {
        "pending": [], "scheduled": [], "started": set(), "complete": [], "failed": [],
    }


def test_a_checkpoint_the_originals_delete_leaves_behind_expires(
    original: Implementation, client: blueque.Client, redis_url: str
) -> None:
    """1.0.1 knows no checkpoint key: it reads and deletes our checkpointed task as any other,
    and the checkpoint it leaves behind is bounded by the expiry every save sets."""
    task_id = client.get_queue(QUEUE).enqueue("resumable")
    listener = client.get_listener(QUEUE)
    task = listener.listen(timeout=10)
    assert task is not None and task.id == task_id
    processor = client.get_processor(task)
    processor.start(os.getpid())
    task.save_checkpoint('{"done": 7}')
    processor.complete("ok")
    listener.close()
    assert "checkpoint" not in str(fields(client, task_id))  # the task hash is 1.0.1's own
    seen = original.run(redis_url, "get-task", task_id)["tasks"][0]["task"]
    assert (seen["status"], seen["result"]) == ("complete", "ok")

    original.run(redis_url, "delete-task", QUEUE, task_id)
    assert fields(client, task_id) == {} and layout(client)["complete"] == []
    left = client.keys.checkpoint(task_id)
    assert client.redis.hget(left, "state") == '{"done": 7}'
    assert 0 < client.redis.pttl(left) <= CHECKPOINT_KEEP * 1000


# --- bulk and idempotent enqueue, seen and run by the original ------------------------------


def test_enqueue_many_and_idempotent_ids_are_run_by_the_original(
    original: Implementation, client: blueque.Client, redis_url: str
) -> None:
    queue = client.get_queue(QUEUE)
    ids = [f"job-{n}" for n in range(5)]
    first = queue.enqueue_many([f"p{n}" for n in range(5)], task_ids=ids)
    assert (first.created, first.existing) == (5, 0)
    again = queue.enqueue_many([f"p{n}" for n in range(6)], task_ids=[*ids, "job-5"])
    assert (again.created, again.existing) == (1, 5)
    assert queue.enqueue("ignored", task_id="job-0") == "job-0"
    anonymous = queue.enqueue_many(["x", "y"]).task_ids
    everything = [*ids, "job-5", *anonymous]
    assert layout(client)["pending"] == everything[::-1]

    seen = original.run(redis_url, "get-task", *everything)["tasks"]
    assert [v["task"]["status"] for v in seen] == ["pending"] * len(everything)
    assert [v["task"]["parameters"] for v in seen] == [
        "p0", "p1", "p2", "p3", "p4", "p5", "x", "y",
    ]

    report = original.run(redis_url, "process", QUEUE, str(len(everything)))
    assert report["ids"] == everything
    state = layout(client)
    assert state["pending"] == [] and state["complete"] == everything[::-1]
    assert client.get_task("job-0").result == "orig result: p0"
    assert client.get_task(anonymous[1]).result == "orig result: y"


def test_a_jobs_parameters_are_text_the_original_reads_and_writes(
    original: Implementation, client: blueque.Client, redis_url: str, tmp_path: Path,
    started: list[Daemon]
) -> None:
    """blueque.Jobs keeps parameters a JSON string: 1.0.1 reads a job's task as any other,
    and a 1.0.1 producer can enqueue a job (its parameters written by hand) that a listener
    of the registry runs."""
    queue = client.get_queue(QUEUE)
    ours = jobs.enqueue(queue, "resize", width=10, height=5)
    seen = original.run(redis_url, "get-task", ours)["tasks"][0]
    assert seen["types"]["parameters"] == "str" and seen["task"]["status"] == "pending"
    assert json.loads(seen["task"]["parameters"]) == {
        "job": "resize", "arguments": {"width": 10, "height": 5}}

    theirs = original.run(redis_url, "enqueue", QUEUE,
                          job_parameters("images.thumbnail", path="b.png"))["ids"][0]
    started.append(Daemon(listen_command(redis_url, QUEUE, "tests.job_registry:jobs",
                                         "--interval", "0.5", "--poll", "0.1"),
                          tmp_path / "listener.log"))
    assert client.get_task(ours).wait(30).result == '{"width": 10, "height": 5}'
    assert client.get_task(theirs).wait(30).result == (
        f"thumbnail of b.png (task {theirs}, attempt 1)")
    done = original.run(redis_url, "get-task", ours, theirs)["tasks"]
    assert [view["task"]["status"] for view in done] == ["complete", "complete"]


def test_original_forking_runner_runs_bulk_enqueued_tasks(
    original: Implementation, client: blueque.Client, redis_url: str, drivers: list[Running]
) -> None:
    ids = client.get_queue(QUEUE).enqueue_many(
        [f"bulk {n}" for n in range(20)], task_ids=[f"bulk-{n}" for n in range(20)]
    ).task_ids

    runner = original.start(redis_url, "runner", QUEUE)
    drivers.append(runner)
    runner.report()
    wait_finished(client, len(ids))
    runner.stop()

    state = layout(client)
    assert sorted(state["complete"]) == sorted(ids) and state["failed"] == []
    for n, task_id in enumerate(ids):
        result = client.get_task(task_id).result
        assert result is not None and result.startswith(f"orig result: bulk {n} ")


def test_both_forking_runners_share_one_queue_and_run_each_task_once(
    original: Implementation,
    ours: Implementation,
    client: blueque.Client,
    redis_url: str,
    drivers: list[Running],
) -> None:
    queue = client.get_queue(QUEUE)
    runners = [original.start(redis_url, "runner", QUEUE), ours.start(redis_url, "runner", QUEUE)]
    drivers.extend(runners)
    for runner in runners:
        runner.report()
    ids = queue.enqueue_many([f"shared {n}" for n in range(30)]).task_ids
    ids += original.run(redis_url, "enqueue", QUEUE, *[f"shared {n}" for n in range(30, 40)])["ids"]
    wait_finished(client, len(ids))
    for runner in runners:
        runner.stop()

    state = layout(client)
    assert sorted(state["complete"]) == sorted(ids)  # every task once, none twice
    assert state["failed"] == [] and state["pending"] == [] and state["started"] == set()
    ran_by = {
        (client.get_task(task_id).result or "").split(" ", 1)[0] for task_id in ids
    }
    assert ran_by <= {"orig", "ours"}
    for runner in runners:
        assert reserved(client, f"{HOST}_{runner.pid}") == []


def test_driver_imports_the_intended_implementation(
    original: Implementation, ours: Implementation, redis_url: str, redis_client: redis.Redis
) -> None:
    """The harness really runs two different packages: the original from its virtualenv."""
    orig = original.run(redis_url, "enqueue-due", QUEUE)
    mine = ours.run(redis_url, "enqueue-due", QUEUE)
    assert orig["impl"] == "orig" and "interop-venv" in orig["blueque"]
    assert mine["impl"] == "ours" and "interop-venv" not in mine["blueque"]
    assert redis_client.ping()
