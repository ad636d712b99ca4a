"""Cancelled means never (issue 21 items 1 and 2): a cancelled task is counted, listed and shown
apart from the failed ones, and bulk retries leave it alone; asked for by its id, it runs.

Contract tests on both clients (and fakeredis), then the listener daemon's own cancels, the
counts under retries, deletes, purges and expiry, and an operator's day end to end: a real
listener, the `blueque` command as a process."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import redis

import blueque
from blueque.endings import RunEnd
from blueque.keys import Keys
from blueque.recovery import ended_text
from blueque.statuses import state_of
from tests.conftest import Run
from tests.daemons import Daemon, lines, listen_command, wait_until
from tests.test_cli import cli
from tests.test_operations import failed_task

K = Keys()


def counts(client: blueque.Client, queue: str = "q") -> tuple[int, int]:
    stats = client.get_queue(queue).stats()
    return stats.failed, stats.cancelled


# --- counted and listed apart -----------------------------------------------------------------
def test_cancelled_tasks_are_counted_and_listed_apart_from_failed_ones(
        contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue("q")
    broken = failed_task(contract_client, "q")
    cancelled = [queue.enqueue("{}") for _ in range(3)]
    later = queue.schedule("{}", time.time() + 3600)
    for task_id in [*cancelled, later]:
        assert contract_client.cancel_task(task_id, "never run this") == "cancelled"
    assert counts(contract_client) == (1, 4)
    assert queue.task_ids("failed") == [broken]
    assert queue.task_ids("cancelled") == [later, *cancelled[::-1]]  # newest first
    for task_id in cancelled:
        task = contract_client.get_task(task_id)
        # what blueque 1.0.1 reads is unchanged: a failed task with its error
        assert (task.status, task.error) == ("failed", "cancelled: never run this")
        assert task.cancelled and task.state == "cancelled"
    assert contract_client.get_task(broken).state == "failed"


def test_a_cancelled_run_is_listed_as_cancelled_by_finish_and_by_recovery(
        client: blueque.Client) -> None:
    r = client.redis
    queue = client.get_queue("q")
    queue.enqueue("{}")
    queue.enqueue("{}")
    listener = client.get_listener("q")
    stopped, orphan = listener.reserve(), listener.reserve()
    assert stopped is not None and orphan is not None
    for task in (stopped, orphan):
        client.get_processor(task).start(os.getpid())
        assert client.cancel_task(task.id, "wrong input") == "requested"
    # its listener stopped it: finish.lua records a failed run stamped cancelled
    ending = RunEnd("q", stopped.id, listener.id, os.getpid(), stopped.attempts,
                                    "failed", "cancelled: wrong input (stopped)", time.time(),
                                    cancelled=True)
    assert client.store.finish(ending) == "failed"
    # its listener died: recover.lua, verdict cancelled
    r.zadd(K.leases("q"), {listener.id: 1})
    assert client.store.recover("q", listener.id, [
        (orphan.id, str(orphan.attempts), "cancelled", None, "cancelled: wrong input (gone)")],
        time.time(), mode="lease") == [0, 0, 1, 0, 1]
    assert sorted(r.lrange(K.cancelled("q"), 0, -1)) == sorted([stopped.id, orphan.id])
    assert r.llen(K.failed("q")) == 0 and counts(client) == (0, 2)
    assert r.hget(K.outcome_counts("q"), "cancelled") == "2"


def test_the_cancelled_count_stays_exact_through_retries_deletes_purges_and_expiry(
        contract_client: blueque.Client) -> None:
    r = contract_client.redis
    queue = contract_client.get_queue("q")
    ids = [queue.enqueue("{}") for _ in range(5)]
    for task_id in ids:
        contract_client.cancel_task(task_id)
    assert counts(contract_client) == (0, 5)
    contract_client.retry_task(ids[0])  # asked for by its id: it runs after all
    assert counts(contract_client) == (0, 4) and queue.stats().pending == 1
    assert contract_client.get_task(ids[0]).status == "pending"
    queue.delete_task(contract_client.get_task(ids[1]))
    assert counts(contract_client) == (0, 3) and r.exists(K.task(ids[1])) == 0
    r.delete(K.task(ids[2]))  # its result TTL ran out: the entry stays until a purge
    assert counts(contract_client) == (0, 3)
    assert queue.purge("failed", 0) == 0  # the failed list is not the cancelled one
    assert queue.purge("cancelled", 3600) == 1  # the expired one only: the others are new
    assert counts(contract_client) == (0, 2)
    assert queue.purge("cancelled", 0) == 2
    assert counts(contract_client) == (0, 0) and r.llen(K.cancelled("q")) == 0
    assert r.exists(*(K.task(i) for i in ids[3:])) == 0


# --- bulk retries leave cancelled tasks alone -------------------------------------------------
def test_a_bulk_retry_leaves_cancelled_tasks_alone_unless_asked(
        contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue("q")
    broken = failed_task(contract_client, "q")
    cancelled = queue.enqueue("{}")
    contract_client.cancel_task(cancelled, "never run this")
    assert queue.retry_failed() == [broken]
    task = contract_client.get_task(cancelled)
    assert task.state == "cancelled" and counts(contract_client) == (0, 1)
    assert queue.task_ids("pending") == [broken]
    assert queue.retry_failed(include_cancelled=True) == [cancelled]
    assert contract_client.get_task(cancelled).status == "pending"
    assert counts(contract_client) == (0, 0)
    history = contract_client.get_task(cancelled).history
    assert [h["outcome"] for h in history] == ["cancelled", "retried"]
    assert history[-1]["was"] == "cancelled"


def test_a_task_cancelled_by_an_earlier_blueque_is_left_alone_too(
        any_client: blueque.Client) -> None:
    """Before the cancelled list, a cancelled task's id went to the failed list."""
    r = any_client.redis
    queue = any_client.get_queue("q")
    old = queue.enqueue("{}")
    r.lrem(K.pending("q"), 1, old)
    r.hset(K.task(old), mapping={"status": "failed", "error": "cancelled: old",
                                 "cancelled": repr(time.time())})
    r.lpush(K.failed("q"), old)
    broken = failed_task(any_client, "q")
    assert queue.retry_failed() == [broken]
    assert r.hget(K.task(old), "status") == "failed" and r.lrange(K.failed("q"), 0, -1) == [old]
    any_client.retry_task(old)  # by its id: found in the failed list
    assert r.llen(K.failed("q")) == 0 and r.hget(K.task(old), "status") == "pending"


def test_retry_failed_with_a_limit_counts_the_cancelled_ones_it_takes(
        contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue("q")
    broken = failed_task(contract_client, "q")
    cancelled = [queue.enqueue("{}") for _ in range(2)]
    for task_id in cancelled:
        contract_client.cancel_task(task_id)
    assert queue.retry_failed(limit=2, include_cancelled=True) == [broken, cancelled[0]]
    assert counts(contract_client) == (0, 1)


# --- an operator's day, end to end ------------------------------------------------------------
@pytest.mark.slow
def test_retry_failed_from_the_command_line_never_runs_a_cancelled_task(
        redis_url: str, client: blueque.Client, redis_client: redis.Redis, tmp_path: Path,
        started: list[Daemon]) -> None:
    """The issue's own steps: `blueque cancel T --reason "never run this"`, then `blueque
    retry --failed documents` while a listener serves the queue."""
    marker, never_ran = tmp_path / "runs", tmp_path / "never"
    queue = client.get_queue("documents")
    never = queue.enqueue(json.dumps({"marker": str(never_ran), "succeed_on": 1}))
    cancelled = cli(redis_url, "cancel", never, "--reason", "never run this")
    assert cancelled.returncode == 0, cancelled.stderr
    broken = queue.enqueue(json.dumps({"marker": str(marker)}))
    started.append(Daemon(listen_command(redis_url, "documents", "tests.jobs:flaky",
                                         "--interval", "0.5", "--poll", "0.1"),
                          tmp_path / "listener.log"))
    wait_until(lambda: client.get_task(broken).status == "failed", what="the broken task fails")
    retried = cli(redis_url, "retry", "--failed", "documents")
    assert retried.returncode == 0, retried.stderr
    wait_until(lambda: client.get_task(broken).attempts == 2
               and client.get_task(broken).status == "failed", what="the broken task re-run")
    assert not never_ran.exists()  # the cancelled task's function never ran
    assert client.get_task(never).status == "failed" and not client.get_task(never).attempts
    assert [line.split()[0] for line in lines(marker)] == ["attempt1", "attempt2"]
    assert "1 failed task(s) of documents are pending again" in retried.stdout
    assert "1 cancelled task(s) left alone" in retried.stdout
    task = client.get_task(never)
    assert task.state == "cancelled" and task.error == "cancelled: never run this"
    assert redis_client.lrange(K.cancelled("documents"), 0, -1) == [never]
    # counted apart: `blueque status` as text and as JSON
    status = json.loads(cli(redis_url, "status", "--json").stdout)["queues"][0]
    assert (status["failed"], status["cancelled"]) == (1, 1)
    shown = cli(redis_url, "status").stdout.splitlines()
    assert shown[0].split()[6:8] == ["FAILED", "CANCELLED"] and shown[1].split()[6:8] == ["1", "1"]

    # by its id, the operator may still run it: it is asked for
    again = cli(redis_url, "retry", never)
    assert again.returncode == 0 and "(it had been cancelled)" in again.stdout
    wait_until(lambda: client.get_task(never).status == "complete", what="it runs by id")
    assert [line.split()[0] for line in lines(never_ran)] == ["attempt1"]
    assert counts(client, "documents") == (1, 0)


@pytest.mark.slow
def test_a_running_task_cancelled_through_its_listener_counts_as_cancelled(
        redis_url: str, client: blueque.Client, redis_client: redis.Redis, tmp_path: Path,
        started: list[Daemon]) -> None:
    marker, release = tmp_path / "marks", tmp_path / "release"
    started.append(Daemon(listen_command(redis_url, "work", "tests.jobs:waits_for_release",
                                         "--interval", "0.5", "--poll", "0.1"),
                          tmp_path / "listener.log"))
    task_id = client.get_queue("work").enqueue(json.dumps(
        {"marker": str(marker), "release": str(release)}))
    wait_until(lambda: lines(marker), what="the task to start")
    assert client.cancel_task(task_id, "wrong input") == "requested"
    wait_until(lambda: client.get_task(task_id).status == "failed", what="it to be stopped")
    assert redis_client.llen(K.failed("work")) == 0  # not counted as a failure
    assert client.get_queue("work").stats().failed == 0
    assert client.get_task(task_id).state == "cancelled"
    assert redis_client.lrange(K.cancelled("work"), 0, -1) == [task_id]
    assert counts(client, "work") == (0, 1)
    assert redis_client.hget(K.outcome_counts("work"), "cancelled") == "1"
    assert state_of(redis_client.hgetall(K.task(task_id))) == "cancelled"


def test_show_and_recovery_say_cancelled_where_they_said_failed(
        client: blueque.Client, run: Run) -> None:
    """`blueque show` read "status failed" for a cancelled task, and a recovery's log line
    counted it among the failed: each now says cancelled."""
    task_id = client.get_queue("q").enqueue("{}")
    client.cancel_task(task_id, "wrong input")
    shown = run("show", task_id).stdout
    assert "failed (cancelled: listed and counted as cancelled)" in shown
    assert json.loads(run("show", task_id, "--json").stdout)["state"] == "cancelled"
    assert ended_text([0, 0, 3, 0, 1]) == "2 failed, 1 cancelled"
    assert ended_text([0, 0, 3, 0]) == "3 failed, 0 cancelled"  # an older script's answer
