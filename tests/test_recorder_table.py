"""The Recorder's endings and put-back, and Membership's heal, driven in-process: one table row a
case, on the private redis-server and on fakeredis, with a fake clock and no process forked
(as huey drives its consumer's loop). The daemon tests show the same paths end to end."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

import blueque
from blueque.daemon.membership import Membership
from blueque.daemon.recorder import Recorder
from blueque.daemon.running import Running
from blueque.endings import Stopped
from blueque.listener import Listener
from blueque.policy import Policy

LISTENER = "table.example_1"
PID = 4242


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reserved(client: blueque.Client, **options: Any) -> str:
    """A task enqueued and moved into our reserved list (the stamp not sent yet)."""
    task_id = client.get_queue("work").enqueue("{}", **options)
    task = Listener("work", client.store, LISTENER).reserve()  # registered: see recover.lua
    assert task is not None and task.id == task_id
    return task_id


def stamped_task(client: blueque.Client, pid: int = PID, **options: Any) -> str:
    """A task reserved by us and stamped for ``pid``'s attempt 1."""
    task_id = client.get_queue("work").enqueue("{}", **options)
    task = Listener("work", client.store, LISTENER).reserve()  # registered: see recover.lua
    assert task is not None and task.id == task_id
    client.get_processor(task).start(pid)
    return task_id


def recorder(client: blueque.Client) -> Recorder:
    return Recorder(client.store, LISTENER, "node-identity", FakeClock(), random.Random(1),
                    client.store.queue_config)


def fields(client: blueque.Client, task_id: str) -> dict[str, str]:
    return client.store.task_data(task_id)


def pending_ids(client: blueque.Client) -> list[str]:
    return list(client.store.redis.lrange(client.store.keys.pending("work"), 0, -1))


# --- endings of runs that reported nothing (Recorder.record_exit) ---------------------------
@dataclass(frozen=True)
class Exit:
    name: str
    error: str
    exit_code: int | None = None
    reason: Stopped = ""
    options: dict[str, Any] = field(default_factory=dict)
    status: str = "failed"  # what the task's hash says once it is recorded
    cancelled: bool = False
    recorded_error: str | None = None  # None: ``error`` itself


EXITS = [
    Exit("killed by a signal", "process killed by signal 9"),
    Exit("a crash retried by its policy", "process exited with code 1", 1,
         options={"max_attempts": 2}, status="scheduled"),
    Exit("stopped for a cancel", "process killed by signal 15", reason="cancelled",
         cancelled=True, recorded_error="cancelled (process killed by signal 15)"),
    Exit("stopped at its node's preemption", "process killed by signal 15",
         reason="preempted", status="pending"),
]


@pytest.mark.parametrize("case", EXITS, ids=[c.name for c in EXITS])
def test_the_ending_of_a_run_that_reported_nothing(any_client: blueque.Client,
                                                    case: Exit) -> None:
    task_id = stamped_task(any_client, **case.options)
    rec = recorder(any_client)
    running = Running(task_id, "work", 1, 0.0, 0.0, 1.0, Policy(**case.options), PID,
                      reason=case.reason, exit_code=case.exit_code)
    rec.unrecorded.append((running, case.error))
    rec.record_unrecorded()
    data = fields(any_client, task_id)
    assert rec.unrecorded == []
    assert data["status"] == case.status
    assert bool(data.get("cancelled")) == case.cancelled
    if case.status != "pending":
        assert data["error"] == (case.recorded_error or case.error)
    assert running.ending is not None and running.ending["status"] == case.status


@pytest.mark.parametrize("exit_code", [0, 3], ids=["reported", "not started"])
def test_a_run_that_recorded_its_own_ending_is_left_as_it_recorded(
        any_client: blueque.Client, exit_code: int) -> None:
    """Exit codes 0 and 3 say the child recorded its outcome (or never started the task)
    itself, as it does when its listener is gone: the task's hash is not written again."""
    task_id = stamped_task(any_client)
    any_client.get_processor(any_client.get_task(task_id)).complete("done by the child")
    before = fields(any_client, task_id)
    rec = recorder(any_client)
    running = Running(task_id, "work", 1, 0.0, 0.0, 1.0, Policy(), PID, exit_code=exit_code)
    rec.unrecorded.append((running, f"process exited with code {exit_code}"))
    rec.record_unrecorded()
    assert fields(any_client, task_id) == before
    assert running.ending is not None and running.ending["status"] == "complete"


def test_the_ending_of_a_run_taken_back_meanwhile_is_not_recorded(
        any_client: blueque.Client) -> None:
    """Its task was put back and runs again (attempt 2): the old run's ending (attempt 1) is
    not recorded over the new run's."""
    store = any_client.store
    task_id = stamped_task(any_client)
    store.recover("work", LISTENER, [(task_id, "1", "pending", None, "")], store.now(),
                  mode="host", release=False)
    task = Listener("work", store, LISTENER).reserve()
    assert task is not None and task.id == task_id
    any_client.get_processor(task).start(PID + 1)
    rec = recorder(any_client)
    old = Running(task_id, "work", 1, 0.0, 0.0, 1.0, Policy(), PID)
    rec.unrecorded.append((old, "process killed by signal 9"))
    rec.record_unrecorded()
    data = fields(any_client, task_id)
    assert (data["status"], data["attempts"], data["pid"]) == ("started", "2", str(PID + 1))
    assert rec.unrecorded == []


# --- a run that never was told to go (Recorder.put_back) -----------------------------------
@dataclass(frozen=True)
class PutBack:
    name: str
    stamped_by: int | None  # the pid the stamp started the task for; None: not stamped
    status: str  # the task's afterwards


PUT_BACKS = [
    PutBack("reserved, the stamp never sent", None, "pending"),
    PutBack("stamped for it, the reply lost", PID, "pending"),
    PutBack("stamped for another process", PID + 1, "started"),
]


@pytest.mark.parametrize("case", PUT_BACKS, ids=[c.name for c in PUT_BACKS])
def test_a_run_that_never_started_puts_its_task_back(any_client: blueque.Client,
                                                      case: PutBack) -> None:
    task_id = (reserved(any_client) if case.stamped_by is None
               else stamped_task(any_client, pid=case.stamped_by))
    rec = recorder(any_client)
    running = Running(task_id, "work", None, 0.0, 0.0, 1.0, Policy(), PID, state="starting",
                      exit_code=3)
    rec.unrecorded.append((running, "process exited with code 3"))
    rec.record_unrecorded()
    data = fields(any_client, task_id)
    assert data["status"] == case.status
    assert (task_id in pending_ids(any_client)) == (case.status == "pending")
    assert rec.unrecorded == []


# --- Membership.heal ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Heal:
    name: str
    state: str  # "reserved", "started" (by us), "gone" (its hash lost)
    ours: bool = False  # a run of ours holds it
    options: dict[str, Any] = field(default_factory=dict)
    status: str | None = None  # the task's afterwards
    kept: bool = False  # still in our reserved list


HEALS = [
    Heal("a reserve cut short", "reserved", status="pending"),
    Heal("a run of ours holds it", "started", ours=True, status="started", kept=True),
    Heal("started by us, its run lost", "started", status="failed"),
    Heal("started by us, its run lost, retried", "started", options={"max_attempts": 2},
         status="scheduled"),
    Heal("its hash lost: its id goes back in line", "gone", status="pending"),
]


@pytest.mark.parametrize("case", HEALS, ids=[c.name for c in HEALS])
def test_heal_settles_what_no_run_of_ours_holds(any_client: blueque.Client,
                                                case: Heal) -> None:
    store = any_client.store
    task_id = (reserved(any_client, **case.options) if case.state == "reserved"
               else stamped_task(any_client, **case.options))
    if case.state == "gone":
        store.redis.delete(store.keys.task(task_id))
    membership = Membership(store, LISTENER, "node-identity", "table.example", {"work": 1},
                            10.0, FakeClock())
    membership.heal({task_id} if case.ours else set())
    assert (task_id in store.reserved_ids("work", LISTENER)) == case.kept
    data = fields(any_client, task_id)
    assert data.get("status") == case.status
    assert (task_id in pending_ids(any_client)) == (case.status == "pending")
    if case.status == "failed":
        assert "has no run of it any more" in data["error"]
