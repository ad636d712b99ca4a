"""The fencing rule (blueque.fencing), case by case: whether a run is its task's current run,
which the recorder, the renewal, a child whose listener died and recovery all ask; and the
verdict of a task that no run of a listener ran (recovery, the heal, a child never told to go)."""

from __future__ import annotations

import json

import pytest
import redis

import blueque
from blueque.fencing import is_current_run, may_reclaim, unstarted_verdict
from blueque.keys import Keys
from blueque.listener import Listener
from blueque.recovery import Recovery, RecoveryReport
from blueque.statuses import Verdict

A, B = "listener-a", "listener-b"
KEYS = Keys()


def task(status: str, node: str = A, attempts: str | None = "2",
         pid: str | None = "100") -> dict[str, str]:
    fields = {"status": status, "node": node}
    if attempts is not None:
        fields["attempts"] = attempts
    if pid is not None:
        fields["pid"] = pid
    return fields


@pytest.mark.parametrize("fields, listener, attempt, pid, expected", [
    # the run that the stamp started, by its attempt (int, or as a node record says it: text)
    (task("started"), A, 2, 100, True),
    (task("started"), A, "2", None, True),
    (task("reserved", pid=None), A, 2, None, True),  # stamped without a process (Processor)
    # an older attempt (retried, reserved again), or one the task never reached
    (task("started", attempts="3"), A, 2, 100, False),
    (task("started", attempts="1"), A, 2, 100, False),
    (task("started", attempts=None), A, 2, 100, False),  # a hash without its counter
    # held by another listener, at the same attempt: not ours
    (task("started", node=B), A, 2, 100, False),
    (task("reserved", node=B), A, 2, None, False),
    # the task moved on: it has no current run (recovered, finished, cancelled)
    (task("pending"), A, 2, 100, False),
    (task("scheduled"), A, 2, 100, False),
    (task("complete"), A, 2, 100, False),
    (task("failed"), A, 2, 100, False),
    ({"attempts": "2", "node": A, "pid": "100"}, A, 2, 100, False),  # no status field
    ({}, A, 2, 100, False),  # its hash is gone
    # a run that does not know its attempt: by the pid the stamp wrote as it started the task
    (task("started"), A, None, 100, True),
    (task("started"), A, None, 101, False),  # another process's run
    (task("started", pid=None), A, None, 100, False),
    (task("started"), A, None, None, False),  # nothing to tell it by
    (task("started", node=B), A, None, 100, False),  # same pid, another listener
    (task("reserved"), A, None, 100, False),  # not started: a pid left by an earlier run
    (task("pending"), A, None, 100, False),
    ({}, A, None, 100, False),
])
def test_is_current_run(fields, listener, attempt, pid, expected) -> None:  # type: ignore[no-untyped-def]
    assert is_current_run(fields, listener, attempt, pid) is expected


def recovered(status: str, outcome: str = "retry", node: str = A, attempt: int = 2,
              **more: str) -> dict[str, str]:
    """A task recover took from run ``attempt`` of ``node`` while it lived (5.6, 5.12b)."""
    entry = {"attempt": attempt, "outcome": outcome, "node": node, "recovered": True}
    return {"status": status, "attempts": "2", "history": json.dumps([entry]), **more}


@pytest.mark.parametrize("fields, expected", [
    # waiting for the retry recover gave it (scheduled, or pending once due): reclaimed
    (recovered("scheduled"), True),
    (recovered("pending"), True),
    (recovered("pending", outcome="preempted"), True),
    # recorded failed: its late ending (5.6) follows, no attempt to withdraw
    (recovered("failed", outcome="failed"), False),
    # a newer attempt was stamped (it started, or a Processor reserved it)
    (recovered("started", attempts="3"), False),
    (recovered("reserved", attempts="3"), False),
    ({**recovered("pending"), "attempts": "3"}, False),
    # not recover's ending of this very run
    (recovered("scheduled", node=B), False),
    (recovered("scheduled", attempt=1), False),
    (recovered("pending", outcome="requeued"), False),  # put back before it ran
    ({**recovered("scheduled"), "history": "[]"}, False),
    ({**recovered("scheduled"), "history": "not json"}, False),
    # cancelled meanwhile; its hash gone
    (recovered("failed", outcome="retry", cancelled="1795000000"), False),
    ({}, False),
])
def test_may_reclaim(fields, expected) -> None:  # type: ignore[no-untyped-def]
    assert may_reclaim(fields, A, 2) is expected
    if expected:  # reclaimed, the run is its task's current run again
        assert not is_current_run(fields, A, 2)
        assert is_current_run({**fields, "status": "started", "node": A}, A, 2)


@pytest.mark.parametrize("fields, pid, expected", [
    # waiting: moved into the list and never stamped, or stamped without a process by us
    (task("pending", node="", pid=None), None, "pending"),
    (task("reserved", pid=None), None, "pending"),
    ({}, None, "pending"),  # its hash is gone (recover.lua takes it out of the list)
    # started for this very process, which never ran it (never told to go)
    (task("started"), 100, "pending"),
    # moved on: started by a run of ours (recovery and the heal judge it by its policy
    # before; here it is not this process's), by another listener, or over
    (task("started"), None, "drop"),
    (task("started"), 101, "drop"),
    (task("started", node=B), 100, "drop"),
    (task("reserved", node=B, pid=None), None, "drop"),
    (task("scheduled"), None, "drop"),
    (task("complete"), None, "drop"),
    (task("failed"), 100, "drop"),
])
def test_unstarted_verdict(fields, pid, expected) -> None:  # type: ignore[no-untyped-def]
    assert unstarted_verdict("t1", fields, A, pid) == Verdict(
        "t1", fields.get("attempts", ""), expected, None, "")


def test_verdict_is_what_recover_lua_reads() -> None:
    """A Verdict is the five values recover.lua takes per task, in its order."""
    assert tuple(Verdict("t1", "3", "retry", 12.5, "boom")) == ("t1", "3", "retry", 12.5,
                                                                "boom")


def test_recovery_leaves_a_task_another_listener_holds_to_it(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    """A dead listener's reserved list names a task that another listener reserved (an id
    in two lists): recovery drops it from the dead one's list and leaves it reserved by the
    other, as the recorder always did; it once put it back in pending, to be run twice."""
    task_id = client.get_queue("work").enqueue("{}")
    holder = Listener("work", client.store, identity="host-b_2")
    assert holder.reserve() is not None  # reserved by host-b_2
    Listener("work", client.store, identity="host-a_1")
    redis_client.lpush(KEYS.reserved("work", "host-a_1"), task_id)
    seconds, micros = redis_client.time()
    redis_client.zadd(KEYS.leases("work"), {"host-a_1": (seconds + micros / 1e6 - 1) * 1000})
    report = RecoveryReport()
    Recovery(client.store, host="me.example", lease_ms=1000).recover_expired("work", report)
    assert report.listeners == ["host-a_1"] and report.requeued == 0
    data = redis_client.hgetall(KEYS.task(task_id))
    assert (data["status"], data["node"]) == ("reserved", "host-b_2")
    assert redis_client.lrange(KEYS.pending("work"), 0, -1) == []
    assert redis_client.lrange(KEYS.reserved("work", "host-a_1"), 0, -1) == []
    assert redis_client.lrange(KEYS.reserved("work", "host-b_2"), 0, -1) == [task_id]
