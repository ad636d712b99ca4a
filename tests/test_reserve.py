"""Contract tests: reserving (BLMOVE/LMOVE + stamp.lua), the reserved window and its recovery,
leases, recover.lua verdicts and 1.0.1's orphan claim (PROTOCOL.md sections 5.4, 5.12-5.14)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import redis

import blueque
from blueque.keys import Keys
from blueque.listener import Listener, hostname
from blueque.recovery import Recovery, RecoveryReport
from blueque.testing import wait_for

K = Keys()


def listener_as(client: blueque.Client, identity: str, queue: str = "q") -> Listener:
    return Listener(queue, client.store, identity=identity)


def test_listen_blocks_and_wakes_on_enqueue(
    client: blueque.Client, redis_client: redis.Redis
) -> None:
    listener = client.get_listener("q")
    got: list[blueque.Task | None] = []
    woke_at: list[float] = []

    def listen() -> None:
        got.append(listener.listen(timeout=30))
        woke_at.append(time.perf_counter())

    thread = threading.Thread(target=listen)
    thread.start()
    try:
        # the listener is parked in BLMOVE (not polling): Redis reports it as a blocked client
        wait_for(lambda: int(redis_client.info("clients")["blocked_clients"]) >= 1, timeout=10)
        enqueued_at = time.perf_counter()
        task_id = client.get_queue("q").enqueue("wake up")
    finally:
        thread.join(timeout=30)
    assert not thread.is_alive()
    task = got[0]
    assert task is not None and task.id == task_id
    assert (task.status, task.node, task.attempts) == ("reserved", listener.id, 1)
    print(f"listen() woke {1000 * (woke_at[0] - enqueued_at):.2f} ms after the enqueue")


def test_listen_returns_none_after_its_timeout(any_client: blueque.Client) -> None:
    listener = any_client.get_listener("q")
    assert listener.listen(timeout=0.05) is None


def test_a_listener_registers_as_1_0_1_does(any_client: blueque.Client) -> None:
    r = any_client.redis
    listener = any_client.get_listener("q")
    assert listener.id == f"{hostname()}_{listener.pid}"
    assert r.smembers(K.listeners("q")) == {listener.id}
    assert r.zscore(K.queues(), "q") == 1.0
    listener.close()
    assert r.smembers(K.listeners("q")) == set()
    assert r.zscore(K.queues(), "q") == 0.0


def test_reserve_moves_the_id_and_stamps_the_hash(any_client: blueque.Client) -> None:
    r = any_client.redis
    task_id = any_client.get_queue("q").enqueue("p")
    listener = any_client.get_listener("q")
    task = listener.reserve()
    assert task is not None and task.id == task_id
    data = r.hgetall(K.task(task_id))
    assert (data["status"], data["node"], data["attempts"]) == ("reserved", listener.id, "1")
    assert "pid" not in data
    assert r.llen(K.pending("q")) == 0
    assert r.lrange(K.reserved("q", listener.id), 0, -1) == [task_id]


def test_a_retried_stamp_does_not_count_a_second_attempt(any_client: blueque.Client) -> None:
    task_id = any_client.get_queue("q").enqueue("p")
    store = any_client.store
    assert store.move_pending("q", "L_1", block=None) == task_id
    first = store.stamp("q", "L_1", task_id, time.time())
    again = store.stamp("q", "L_1", task_id, time.time())  # its first reply was lost
    assert (first.verdict, first.attempt) == ("ok", 1)
    assert (again.verdict, again.attempt) == ("ok", 1)
    assert any_client.redis.lrange(K.reserved("q", "L_1"), 0, -1) == [task_id]


# --- the reserved window -------------------------------------------------------------------
def test_a_crash_between_move_and_stamp_is_recovered(any_client: blueque.Client) -> None:
    r, store = any_client.redis, any_client.store
    task_id = any_client.get_queue("q").enqueue("p")
    dead = listener_as(any_client, "deadhost_4242")
    assert store.move_pending("q", dead.id, block=None) == task_id
    # ... and the listener dies before stamp.lua runs: the window PROTOCOL.md 5.4 describes
    assert r.lrange(K.reserved("q", dead.id), 0, -1) == [task_id]
    assert r.hget(K.task(task_id), "status") == "pending"
    assert r.llen(K.pending("q")) == 0

    attempts_seen = r.hget(K.task(task_id), "attempts") or ""
    counts = store.recover("q", dead.id, [(task_id, attempts_seen, "pending", None, "")],
                           time.time(), mode="host")
    assert counts == [1, 0, 0, 0, 0]
    assert r.lrange(K.pending("q"), 0, -1) == [task_id]
    assert r.llen(K.reserved("q", dead.id)) == 0
    assert r.hget(K.task(task_id), "status") == "pending"
    assert dead.id not in r.smembers(K.listeners("q"))
    assert r.zscore(K.queues(), "q") == 0.0

    task = any_client.get_listener("q").reserve()
    assert task is not None and task.id == task_id and task.attempts == 1


def test_recovered_tasks_go_to_the_head_of_the_line(any_client: blueque.Client) -> None:
    queue = any_client.get_queue("q")
    first = queue.enqueue("first")
    dead = listener_as(any_client, "deadhost_1")
    assert dead.reserve() is not None
    second = queue.enqueue("second")
    any_client.store.recover("q", dead.id, [(first, "1", "pending", None, "")], time.time(),
                             mode="host")
    live = any_client.get_listener("q")
    taken = [live.reserve(), live.reserve()]
    assert [t.id for t in taken if t is not None] == [first, second]


# --- stamp.lua on bad input: every case ends in a recorded state ---------------------------
def _bad_input(r: redis.Redis, case: str) -> None:
    key = K.task("t")
    if case == "missing hash":
        pass
    elif case == "not a hash":
        r.set(key, "a string")
    elif case == "no status":
        r.hset(key, mapping={"queue": "q", "parameters": "p"})
    elif case == "unknown status":
        r.hset(key, mapping={"status": "weird", "queue": "q"})
    r.lpush(K.pending("q"), "t")


@pytest.mark.parametrize("case", ["missing hash", "not a hash", "no status", "unknown status"])
def test_stamp_records_a_task_it_cannot_run_as_failed(
    any_client: blueque.Client, case: str
) -> None:
    r, store = any_client.redis, any_client.store
    _bad_input(r, case)
    assert store.move_pending("q", "L_1", block=None) == "t"
    reservation = store.stamp("q", "L_1", "t", time.time())
    assert reservation.verdict == "bad" and not reservation.runnable
    assert r.llen(K.reserved("q", "L_1")) == 0
    assert r.lrange(K.failed("q"), 0, -1) == ["t"]
    if case == "not a hash":
        assert r.get(K.task("t")) == "a string"  # a foreign key is left alone
    else:
        data = r.hgetall(K.task("t"))
        assert data["status"] == "failed" and data["error"]
        assert data["queue"] == "q"


def test_stamp_skips_a_duplicate_id_of_a_running_task(any_client: blueque.Client) -> None:
    r, store = any_client.redis, any_client.store
    task_id = any_client.get_queue("q").enqueue("p")
    r.lpush(K.pending("q"), task_id)  # the same id twice in the pending list
    listener = any_client.get_listener("q")
    task = listener.reserve()
    assert task is not None
    any_client.get_processor(task).start(4321)
    assert store.move_pending("q", listener.id, block=None) == task_id
    reservation = store.stamp("q", listener.id, task_id, time.time())
    assert (reservation.verdict, reservation.detail) == ("skip", "started")
    assert r.lrange(K.reserved("q", listener.id), 0, -1) == [task_id]  # one entry: the run
    assert r.hget(K.task(task_id), "status") == "started"
    assert r.hget(K.task(task_id), "attempts") == "1"


def test_stamp_skips_a_task_cancelled_during_the_reserved_window(
    any_client: blueque.Client,
) -> None:
    r, store = any_client.redis, any_client.store
    task_id = any_client.get_queue("q").enqueue("p")
    assert store.move_pending("q", "L_1", block=None) == task_id
    assert any_client.cancel_task(task_id) == "cancelled"
    reservation = store.stamp("q", "L_1", task_id, time.time())
    assert (reservation.verdict, reservation.detail) == ("skip", "failed")
    assert r.llen(K.reserved("q", "L_1")) == 0
    assert r.hget(K.task(task_id), "status") == "failed"
    assert r.hget(K.task(task_id), "cancelled")
    assert r.lrange(K.cancelled("q"), 0, -1) == [task_id] and r.llen(K.failed("q")) == 0


def test_listener_reserve_passes_over_bad_ids_to_the_next_task(
    any_client: blueque.Client,
) -> None:
    r = any_client.redis
    r.lpush(K.pending("q"), "ghost")
    good = any_client.get_queue("q").enqueue("p")
    task = any_client.get_listener("q").reserve()
    assert task is not None and task.id == good
    assert r.hget(K.task("ghost"), "status") == "failed"


# --- leases ---------------------------------------------------------------------------------
def _server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_lease_register_renew_release(any_client: blueque.Client) -> None:
    r, store = any_client.redis, any_client.store
    before = _server_ms(r)
    deadline = store.lease("q", "L_1", 60_000, "register")
    assert before + 60_000 <= deadline <= _server_ms(r) + 60_000
    assert r.zscore(K.leases("q"), "L_1") == deadline
    renewed = store.lease("q", "L_1", 120_000, "renew")
    assert renewed >= deadline + 60_000 - 1000
    assert store.lease("q", "L_1", 0, "release") == 0
    assert r.zscore(K.leases("q"), "L_1") is None
    assert store.lease("q", "L_1", 60_000, "renew") == -1  # released: renew must not revive it


def test_an_expired_lease_is_found_and_recovered_once(any_client: blueque.Client) -> None:
    r, store = any_client.redis, any_client.store
    task_id = any_client.get_queue("q").enqueue("p")
    dead = listener_as(any_client, "otherhost_7")
    assert dead.reserve() is not None
    store.lease("q", dead.id, 60_000, "register")
    verdict = [(task_id, "1", "pending", None, "")]
    assert store.expired_listeners("q") == []
    assert store.recover("q", dead.id, verdict, time.time(), mode="lease") == [-1]  # live
    assert r.lrange(K.reserved("q", dead.id), 0, -1) == [task_id]  # untouched

    store.lease("q", dead.id, 1, "register")
    wait_for(lambda: store.expired_listeners("q") == [dead.id], timeout=5)
    assert store.recover("q", dead.id, verdict, time.time(), mode="lease") == [1, 0, 0, 0, 0]
    assert store.recover("q", dead.id, verdict, time.time(), mode="lease") == [-1]  # claimed
    assert r.lrange(K.pending("q"), 0, -1) == [task_id]
    assert r.zscore(K.leases("q"), dead.id) is None
    # the listener comes back: its renew says it was declared dead
    assert store.lease("q", dead.id, 60_000, "renew") == -1


# --- recover.lua verdicts ------------------------------------------------------------------
def test_recover_applies_each_verdict(any_client: blueque.Client) -> None:
    r, store = any_client.redis, any_client.store
    queue = any_client.get_queue("q")
    dead = listener_as(any_client, "deadhost_99")
    ids = [queue.enqueue(name) for name in ("requeue", "retry", "fail", "drop", "stale")]
    tasks = [dead.reserve() for _ in ids]
    assert [t.id for t in tasks if t is not None] == ids
    for task in tasks[1:]:
        assert task is not None
        any_client.get_processor(task).start(1000 + len(task.id))
    # "drop": the task finished already but its id is still listed (e.g. cancelled + crash)
    r.hset(K.task(ids[3]), "status", "complete")
    eta = time.time() + 600
    verdicts = [
        (ids[0], "1", "pending", None, ""),
        (ids[1], "1", "retry", eta, "listener died"),
        (ids[2], "1", "failed", None, "listener died for good"),
        (ids[3], "1", "drop", None, ""),
        (ids[4], "0", "failed", None, "computed from a stale read"),
    ]
    counts = store.recover("q", dead.id, verdicts, time.time(), mode="host")
    assert counts == [1, 1, 1, 1, 0]
    status = {i: r.hgetall(K.task(i)) for i in ids}
    assert status[ids[0]]["status"] == "pending" and "node" not in status[ids[0]]
    assert r.lrange(K.pending("q"), 0, -1) == [ids[0]]
    assert (status[ids[1]]["status"], float(status[ids[1]]["eta"])) == ("scheduled", eta)
    assert status[ids[1]]["error"] == "listener died"
    assert r.zscore(K.scheduled("q"), ids[1]) == eta
    assert status[ids[2]]["status"] == "failed" and "pid_created" not in status[ids[2]]
    assert r.lrange(K.failed("q"), 0, -1) == [ids[2]]
    assert status[ids[3]]["status"] == "complete"
    assert status[ids[4]]["status"] == "started"  # skipped: attempts did not match
    assert r.lrange(K.reserved("q", dead.id), 0, -1) == [ids[4]]
    assert r.smembers(K.started("q")) == {f"{dead.id} {1000 + len(ids[4])} {ids[4]}"}


def test_recover_stamps_cancelled_as_the_caller_decided(any_client: blueque.Client) -> None:
    """The cancelled stamp is the verdict's (endings.decide, called by Recovery), one rule for
    finish and recover: recover.lua no longer looks for cancel_requested itself."""
    r, store = any_client.redis, any_client.store
    queue = any_client.get_queue("q")
    dead = listener_as(any_client, "deadhost_98")
    ids = [queue.enqueue(name) for name in ("cancelled", "failed")]
    for _ in ids:
        task = dead.reserve()
        assert task is not None
        any_client.get_processor(task).start(4000)
        r.hset(K.task(task.id), "cancel_requested", "5")
    counts = store.recover("q", dead.id, [(ids[0], "1", "cancelled", None, "cancelled: x"),
                                          (ids[1], "1", "failed", None, "died")],
                           time.time(), mode="host")
    assert counts == [0, 0, 2, 0, 1]
    cancelled, failed = (r.hgetall(K.task(i)) for i in ids)
    assert cancelled["status"] == failed["status"] == "failed"
    assert "cancelled" in cancelled and "cancelled" not in failed
    assert r.hgetall(K.outcome_counts("q")) == {"cancelled": "1", "failed": "1"}


def test_recovery_turns_a_cancelled_run_of_a_dead_listener_into_a_cancelled_verdict(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    task_id = client.get_queue("work").enqueue("{}", max_attempts=3)
    listener = client.get_listener("work")
    client.store.lease("work", listener.id, 1, "register")  # a 1 ms lease, never renewed
    task = listener.reserve()
    assert task is not None
    client.get_processor(task).start(4242)
    client.cancel_task(task_id, "wrong input")
    wait_for(lambda: listener.id in client.store.expired_listeners("work"), timeout=5)
    report = RecoveryReport()
    Recovery(client.store, host="another-host.example").recover_expired("work", report)
    data = redis_client.hgetall(K.task(task_id))
    assert data["status"] == "failed" and "cancelled" in data  # not retried: cancelled wins
    assert data["error"].startswith("cancelled: wrong input ("), data["error"]
    assert redis_client.hget(K.outcome_counts("work"), "cancelled") == "1"


def test_recover_in_host_mode_backs_off_when_the_listener_was_claimed(
    any_client: blueque.Client,
) -> None:
    store = any_client.store
    task_id = any_client.get_queue("q").enqueue("p")
    dead = listener_as(any_client, "deadhost_5")
    assert dead.reserve() is not None
    assert store.remove_listener("q", dead.id)  # e.g. a 1.0.1 claim_orphan won it
    counts = store.recover("q", dead.id, [(task_id, "1", "pending", None, "")], time.time(),
                           mode="host")
    assert counts == [-1]
    assert any_client.redis.hget(K.task(task_id), "status") == "reserved"


# --- blueque 1.0.1's orphan claim ------------------------------------------------------------
def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_claim_orphan_takes_a_dead_local_listeners_task_once(any_client: blueque.Client) -> None:
    r = any_client.redis
    task_id = any_client.get_queue("q").enqueue("p")
    dead = listener_as(any_client, f"{hostname()}_{_dead_pid()}")
    assert dead.reserve() is not None
    claimer = any_client.get_listener("q")
    assert r.zscore(K.queues(), "q") == 2.0
    task = claimer.claim_orphan()
    assert task is not None and task.id == task_id
    assert r.hget(K.task(task_id), "reclaimed_node") == claimer.id
    assert r.smembers(K.listeners("q")) == {claimer.id}
    assert r.zscore(K.queues(), "q") == 1.0
    assert claimer.claim_orphan() is None  # claimed once
    # the claimer processes it as 1.0.1 does: against the dead listener's reserved list
    processor = any_client.get_processor(task)
    processor.start(12345)
    processor.complete("done")
    assert r.hget(K.task(task_id), "status") == "complete"
    assert r.llen(K.reserved("q", dead.id)) == 0


def test_claim_orphan_ignores_live_and_remote_listeners(any_client: blueque.Client) -> None:
    any_client.get_queue("q").enqueue("p")
    remote = listener_as(any_client, f"elsewhere.example_{_dead_pid()}")
    assert remote.reserve() is not None
    claimer = any_client.get_listener("q")
    assert claimer.claim_orphan() is None
    assert remote.id in any_client.redis.smembers(K.listeners("q"))
