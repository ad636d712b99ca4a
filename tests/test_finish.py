"""Contract tests: start, complete, fail, retry, fencing, progress, delete, purge, result TTL and
stats (PROTOCOL.md sections 5.5-5.8, 5.10, 5.15)."""

from __future__ import annotations

import time

import pytest
import redis

import blueque
from blueque.endings import RunEnd
from blueque.errors import InvalidTaskState, StaleAttempt
from blueque.fencing import is_current_run
from blueque.keys import Keys
from blueque.listener import Listener
from blueque.processor import Processor

K = Keys()


def reserved_task(client: blueque.Client, parameters: str = "p", queue: str = "q",
                  identity: str | None = None) -> tuple[blueque.Task, Listener]:
    client.get_queue(queue).enqueue(parameters)
    listener = Listener(queue, client.store, identity=identity)
    task = listener.reserve()
    assert task is not None
    return task, listener


def test_start_records_the_process(any_client: blueque.Client) -> None:
    r = any_client.redis
    task, listener = reserved_task(any_client, "params")
    assert any_client.get_processor(task).start(4242, pid_created=1234.5) == "params"
    data = r.hgetall(K.task(task.id))
    assert (data["status"], data["pid"], data["pid_created"]) == ("started", "4242", "1234.5")
    assert float(data["started_at"]) == float(data["updated"])
    assert r.smembers(K.started("q")) == {f"{listener.id} 4242 {task.id}"}
    assert r.lrange(K.reserved("q", listener.id), 0, -1) == [task.id]
    assert any_client.get_task(task.id).pid == 4242


def test_complete_records_the_result_and_cleans_up(any_client: blueque.Client) -> None:
    r = any_client.redis
    task, listener = reserved_task(any_client)
    processor = any_client.get_processor(task)
    processor.start(4242)
    processor.complete('{"answer": 42}')
    data = r.hgetall(K.task(task.id))
    assert (data["status"], data["result"]) == ("complete", '{"answer": 42}')
    # the hash holds no field twice (PROTOCOL.md 3, 3.2): no finished_at (its updated), no
    # history (its fields), no pid_created (its process is gone)
    assert not {"finished_at", "history", "pid_created"} & set(data)
    assert any_client.get_task(task.id).finished_at == float(data["updated"])
    assert r.lrange(K.complete("q"), 0, -1) == [task.id]
    assert r.llen(K.reserved("q", listener.id)) == 0
    assert r.scard(K.started("q")) == 0
    assert r.ttl(K.task(task.id)) == -1  # kept until deleted (no result TTL)


def test_fail_records_the_error(any_client: blueque.Client) -> None:
    r = any_client.redis
    task, listener = reserved_task(any_client)
    processor = any_client.get_processor(task)
    processor.start(4242)
    processor.fail("it broke")
    data = r.hgetall(K.task(task.id))
    assert (data["status"], data["error"]) == ("failed", "it broke")
    assert "result" not in data
    assert r.lrange(K.failed("q"), 0, -1) == [task.id]
    assert r.llen(K.reserved("q", listener.id)) == 0
    assert r.scard(K.started("q")) == 0


def test_a_reserved_task_can_fail_without_starting(any_client: blueque.Client) -> None:
    task, listener = reserved_task(any_client)
    any_client.get_processor(task).fail("could not fork")
    assert any_client.get_task(task.id).status == "failed"
    assert any_client.redis.llen(K.reserved("q", listener.id)) == 0


def test_retry_schedules_the_next_attempt(any_client: blueque.Client) -> None:
    r = any_client.redis
    task, _ = reserved_task(any_client)
    processor = any_client.get_processor(task)
    processor.start(4242)
    eta = time.time() + 30
    processor.retry("transient", eta)
    data = r.hgetall(K.task(task.id))
    assert (data["status"], data["error"], float(data["eta"])) == ("scheduled", "transient", eta)
    assert r.zscore(K.scheduled("q"), task.id) == eta
    assert r.llen(K.failed("q")) == 0 and r.scard(K.started("q")) == 0


def test_results_that_are_not_strings_are_stored_as_json(any_client: blueque.Client) -> None:
    task, _ = reserved_task(any_client)
    processor = any_client.get_processor(task)
    processor.start(1)
    processor.complete({"rows": [1, 2]})
    assert any_client.get_task(task.id).result == '{"rows": [1, 2]}'


def test_finishing_a_task_that_is_not_running_is_refused(any_client: blueque.Client) -> None:
    task, _ = reserved_task(any_client)
    processor = any_client.get_processor(task)
    processor.start(1)
    processor.complete("once")
    unfenced = any_client.store
    with pytest.raises(InvalidTaskState, match="only a reserved or started task can finish"):
        unfenced.finish(RunEnd("q", task.id, task.node or "", 1, None, "failed", "late",
                               time.time()))
    assert any_client.get_task(task.id).status == "complete"


def test_a_repeated_fenced_complete_returns_the_recorded_status(
    any_client: blueque.Client,
) -> None:
    task, listener = reserved_task(any_client)
    processor = any_client.get_processor(task)
    processor.start(1)
    processor.complete("r")
    status = any_client.store.finish(RunEnd("q", task.id, listener.id, 1, 1, "complete", "r",
                                            time.time()))
    assert status == "complete"
    assert any_client.redis.lrange(K.complete("q"), 0, -1) == [task.id]  # listed once


def test_start_is_refused_for_another_listener(any_client: blueque.Client) -> None:
    r = any_client.redis
    task, listener = reserved_task(any_client)
    with pytest.raises(InvalidTaskState, match="cannot start"):
        any_client.store.start("q", task.id, "someone-else_1", 7, time.time())
    assert r.hget(K.task(task.id), "status") == "reserved"
    assert r.scard(K.started("q")) == 0
    processor = any_client.get_processor(task)
    processor.start(7)
    processor.start(7)  # a retried start of the same process is harmless
    assert r.smembers(K.started("q")) == {f"{listener.id} 7 {task.id}"}


# --- fencing ------------------------------------------------------------------------------
def test_a_superseded_attempt_cannot_record_anything(any_client: blueque.Client) -> None:
    r, store = any_client.redis, any_client.store
    task, old_listener = reserved_task(any_client, identity="oldhost_1")
    old = any_client.get_processor(task)
    old.start(111)
    # the old listener is declared dead; its task is requeued and run again elsewhere
    assert store.recover("q", old_listener.id, [(task.id, "1", "pending", None, "")],
                         time.time(), mode="host") == [1, 0, 0, 0, 0]
    new_task = any_client.get_listener("q").reserve()
    assert new_task is not None and new_task.attempts == 2
    new = any_client.get_processor(new_task)
    new.start(222)

    with pytest.raises(StaleAttempt, match="attempt 2, not 1"):
        old.complete("stale result")
    with pytest.raises(StaleAttempt):
        old.fail("stale error")
    with pytest.raises(StaleAttempt):
        old.progress(0.5, "stale progress")
    data = r.hgetall(K.task(task.id))
    assert (data["status"], data["pid"], data["attempts"]) == ("started", "222", "2")
    assert "result" not in data and "progress" not in data
    assert r.llen(K.complete("q")) == 0

    new.complete("fresh result")
    assert r.hget(K.task(task.id), "result") == "fresh result"
    assert isinstance(StaleAttempt("x"), InvalidTaskState)


def test_a_superseded_start_is_refused_and_leaves_the_reserved_list(
    any_client: blueque.Client,
) -> None:
    r = any_client.redis
    task, listener = reserved_task(any_client)
    r.hset(K.task(task.id), "attempts", "5")  # as if re-reserved meanwhile
    with pytest.raises(StaleAttempt):
        any_client.get_processor(task).start(1)
    assert r.llen(K.reserved("q", listener.id)) == 0
    assert r.scard(K.started("q")) == 0


def test_progress_is_recorded_for_the_running_attempt(any_client: blueque.Client) -> None:
    task, _ = reserved_task(any_client)
    processor = any_client.get_processor(task)
    with pytest.raises(StaleAttempt):
        processor.progress(0.1)  # not started yet
    processor.start(1)
    processor.progress(0.25, "a quarter")
    with pytest.raises(ValueError, match="between 0 and 1"):
        processor.progress(1.5)
    seen = any_client.get_task(task.id)
    assert (seen.progress, seen.progress_message) == (0.25, "a quarter")


# --- delete and purge ---------------------------------------------------------------------
def finished_task(client: blueque.Client, status: str) -> blueque.Task:
    task, _ = reserved_task(client)
    processor = client.get_processor(task)
    processor.start(1)
    if status == "complete":
        processor.complete("r")
    else:
        processor.fail("e")
    return client.get_task(task.id)


@pytest.mark.parametrize("status", ["complete", "failed"])
def test_delete_removes_the_hash_and_the_list_entry(
    contract_client: blueque.Client, status: str
) -> None:
    r = contract_client.redis
    task = finished_task(contract_client, status)
    other = finished_task(contract_client, status)
    contract_client.get_queue("q").delete_task(task)
    assert r.exists(K.task(task.id)) == 0
    assert r.lrange(K.finished("q", status), 0, -1) == [other.id]
    assert contract_client.get_task(task.id, missing_ok=True).status is None


def test_delete_refuses_an_unfinished_task_with_a_value_error(
    contract_client: blueque.Client,
) -> None:
    r = contract_client.redis
    task_id = contract_client.get_queue("q").enqueue("p")
    with pytest.raises(InvalidTaskState, match="Cannot delete task with status pending"
                       ) as raised:
        contract_client.get_queue("q").delete_task(contract_client.get_task(task_id))
    assert isinstance(raised.value, ValueError)  # as 1.0.1 raised
    assert r.hget(K.task(task_id), "status") == "pending"
    assert r.lrange(K.pending("q"), 0, -1) == [task_id]


def test_delete_refuses_a_task_of_another_queue(contract_client: blueque.Client) -> None:
    task = finished_task(contract_client, "complete")
    with pytest.raises(InvalidTaskState, match="not in queue other"):
        contract_client.get_queue("other").delete_task(task)
    assert contract_client.redis.exists(K.task(task.id)) == 1


def test_delete_refuses_when_the_status_changed_since_it_was_read(
    contract_client: blueque.Client,
) -> None:
    task = finished_task(contract_client, "failed")
    contract_client.redis.hset(K.task(task.id), "status", "pending")  # e.g. retried meanwhile
    with pytest.raises(InvalidTaskState, match="only finished tasks can be deleted"):
        contract_client.get_queue("q").delete_task(task)
    assert contract_client.redis.exists(K.task(task.id)) == 1


def _fill_finished(r: redis.Redis, count: int) -> list[str]:
    """``count`` complete tasks, oldest at the right end as finish.lua leaves them."""
    ids = [f"done-{i}" for i in range(count)]
    for start in range(0, count, 10_000):
        pipe = r.pipeline(transaction=False)
        for task_id in ids[start : start + 10_000]:
            pipe.hset(K.task(task_id), mapping={"status": "complete", "queue": "q",
                                                "result": "r", "finished_at": "1.0"})
        pipe.lpush(K.complete("q"), *ids[start : start + 10_000])
        pipe.execute()
    return ids


def test_delete_oldest_newest_and_middle_of_100k_finished_tasks(
    client: blueque.Client, redis_client: redis.Redis
) -> None:
    r = redis_client
    ids = _fill_finished(r, 100_000)
    queue = client.get_queue("q")
    oldest, newest, middle = ids[0], ids[-1], ids[50_000]
    assert r.lindex(K.complete("q"), -1) == oldest and r.lindex(K.complete("q"), 0) == newest
    for task_id in (oldest, newest, middle):
        task = client.get_task(task_id)
        began = time.perf_counter()
        queue.delete_task(task)
        print(f"delete {task_id} of 100k: {1000 * (time.perf_counter() - began):.2f} ms")
        assert r.exists(K.task(task_id)) == 0
        assert r.lpos(K.complete("q"), task_id) is None
    assert r.llen(K.complete("q")) == 100_000 - 3
    assert r.lindex(K.complete("q"), -1) == ids[1]
    assert r.lindex(K.complete("q"), 0) == ids[-2]


def test_delete_cleans_a_dangling_entry_of_an_expired_task(contract_client: blueque.Client) -> None:
    r = contract_client.redis
    task = finished_task(contract_client, "complete")
    r.delete(K.task(task.id))  # as a result TTL would
    assert contract_client.store.delete("q", task.id, "complete") is False
    assert r.llen(K.complete("q")) == 0


def test_purge_deletes_old_finished_tasks_oldest_first(contract_client: blueque.Client) -> None:
    r = contract_client.redis
    tasks = [finished_task(contract_client, "complete") for _ in range(5)]
    failed = finished_task(contract_client, "failed")
    queue = contract_client.get_queue("q")
    assert queue.purge("complete", older_than=3600) == 0
    for task in tasks[:2]:  # the two oldest finished a day ago
        r.hset(K.task(task.id), "finished_at", repr(time.time() - 86_400))
    assert queue.purge("complete", older_than=3600) == 2
    assert r.lrange(K.complete("q"), 0, -1) == [t.id for t in reversed(tasks[2:])]
    assert all(r.exists(K.task(t.id)) == 0 for t in tasks[:2])
    assert queue.purge("complete", older_than=0) == 3
    assert r.llen(K.complete("q")) == 0
    assert r.lrange(K.failed("q"), 0, -1) == [failed.id]  # other status untouched
    with pytest.raises(InvalidTaskState):
        queue.purge("pending", older_than=0)


def test_result_ttl_expires_the_finished_hash(any_client: blueque.Client) -> None:
    r = any_client.redis
    task, _ = reserved_task(any_client)
    processor = any_client.get_processor(task)
    processor.start(1)
    processor.complete("r", result_ttl_ms=60_000)
    assert 0 < r.pttl(K.task(task.id)) <= 60_000
    failing, _ = reserved_task(any_client)
    Processor(failing, any_client.store).fail("e", result_ttl_ms=5_000)
    assert 0 < r.pttl(K.task(failing.id)) <= 5_000


# --- stats --------------------------------------------------------------------------------
def test_stats_counts_every_state(contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue("q")
    finished_task(contract_client, "complete")
    finished_task(contract_client, "failed")
    finished_task(contract_client, "failed")
    started, _ = reserved_task(contract_client)
    contract_client.get_processor(started).start(1)
    reserved_task(contract_client)
    queue.enqueue_many(["a", "b", "c"])
    queue.schedule("later", time.time() + 3600)
    stats = queue.stats()
    assert (stats.pending, stats.scheduled, stats.reserved, stats.started) == (3, 1, 1, 1)
    assert (stats.complete, stats.failed, stats.listeners) == (1, 2, 1)
    assert stats.name == "q"
    assert contract_client.get_queue("empty").stats().pending == 0


def test_a_foreign_key_recorded_as_failed_does_not_block_purge_or_delete(
    contract_client: blueque.Client,
) -> None:
    """stamp.lua lists an id whose key is not a hash as failed (leaving the key alone);
    purging and deleting must get past it, not fail on WRONGTYPE forever."""
    r = contract_client.redis
    r.set(K.task("foreign"), "not a task")
    r.lpush(K.pending("q"), "foreign")
    assert contract_client.get_listener("q").reserve() is None
    real = finished_task(contract_client, "failed")
    assert r.lrange(K.failed("q"), 0, -1) == [real.id, "foreign"]
    assert contract_client.get_queue("q").purge("failed", older_than=0) == 2
    assert r.llen(K.failed("q")) == 0
    assert r.get(K.task("foreign")) == "not a task"  # still left alone
    assert r.exists(K.task(real.id)) == 0


def test_task_ids_lists_each_state(contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue("q")
    complete = finished_task(contract_client, "complete")
    failed = finished_task(contract_client, "failed")
    started, _ = reserved_task(contract_client)
    contract_client.get_processor(started).start(1)
    started_too, _ = reserved_task(contract_client)
    contract_client.get_processor(started_too).start(2)
    reserved, _ = reserved_task(contract_client)
    pending = queue.enqueue_many(["a", "b"]).task_ids
    scheduled = queue.schedule("later", time.time() + 3600)
    assert sorted(queue.task_ids("pending")) == sorted(pending)
    assert queue.task_ids("scheduled") == [scheduled]
    assert queue.task_ids("reserved") == [reserved.id]
    assert sorted(queue.task_ids("started")) == sorted([started.id, started_too.id])
    assert len(queue.task_ids("started", 0, 0)) == 1  # inclusive stop, as LRANGE
    assert queue.task_ids("complete") == [complete.id]
    assert queue.task_ids("failed") == [failed.id]
    with pytest.raises(InvalidTaskState, match="unknown status"):
        queue.task_ids("succeeded")


def test_a_task_reserved_the_1_0_1_way_is_processed_unfenced(any_client: blueque.Client) -> None:
    """blueque 1.0.1 reserves with RPOPLPUSH + HSET (no attempts field); our processor must
    still start and finish it, and leave the state 1.0.1 would leave."""
    r = any_client.redis
    task_id = any_client.get_queue("q").enqueue("p")
    assert r.rpoplpush(K.pending("q"), K.reserved("q", "oldhost_1")) == task_id
    r.hset(K.task(task_id), mapping={"status": "reserved", "node": "oldhost_1",
                                     "updated": time.time()})
    task = any_client.get_task(task_id)
    assert task.attempts is None
    processor = any_client.get_processor(task)
    processor.start(77)
    assert r.smembers(K.started("q")) == {f"oldhost_1 77 {task_id}"}
    processor.complete("ok")
    assert r.hget(K.task(task_id), "status") == "complete"
    assert r.llen(K.reserved("q", "oldhost_1")) == 0 and r.scard(K.started("q")) == 0
    assert r.lrange(K.complete("q"), 0, -1) == [task_id]


def test_purge_gets_past_corrupt_and_stale_entries(contract_client: blueque.Client) -> None:
    """A corrupt timestamp or an entry whose task now lives in another list (e.g. a task
    cancelled while reserved, then completed anyway by a 1.0.1 processor, which checks
    nothing) must not stop every later purge."""
    r = contract_client.redis
    corrupt = finished_task(contract_client, "failed")
    r.hset(K.task(corrupt.id), mapping={"finished_at": "yesterday", "updated": "?"})
    moved_on = finished_task(contract_client, "failed")
    r.hset(K.task(moved_on.id), "status", "complete")
    r.lpush(K.complete("q"), moved_on.id)
    newest = finished_task(contract_client, "failed")
    assert r.lrange(K.failed("q"), 0, -1) == [newest.id, moved_on.id, corrupt.id]
    assert contract_client.get_queue("q").purge("failed", older_than=0) == 2
    assert r.llen(K.failed("q")) == 0
    assert r.hget(K.task(moved_on.id), "status") == "complete"  # not deleted: not failed
    assert r.lrange(K.complete("q"), 0, -1) == [moved_on.id]
    assert r.exists(K.task(corrupt.id)) == 0 and r.exists(K.task(newest.id)) == 0


def test_a_preempted_run_puts_its_task_back_first_in_line_without_spending_an_attempt(
        any_client: blueque.Client) -> None:
    r = any_client.redis
    any_client.get_queue("q").enqueue("later")  # waiting behind it
    task, listener = reserved_task(any_client, "long job")
    processor = any_client.get_processor(task)
    processor.start(4242)
    task.save_checkpoint('{"done": 12}')
    processor.preempt("the node goes away")
    data = r.hgetall(K.task(task.id))
    assert data["status"] == "pending" and data["preemptions"] == "1"
    assert data["preempted_reason"] == "the node goes away" and "pid" not in data
    assert r.lrange(K.pending("q"), -1, -1) == [task.id]  # the next one taken
    assert r.lrange(K.reserved("q", listener.id), 0, -1) == []
    assert r.smembers(K.started("q")) == set()
    assert r.hget(K.outcome_counts("q"), "preempted") == "1"
    assert any_client.get_task(task.id).checkpoint == '{"done": 12}'  # kept for the re-run
    processor.preempt("the node goes away")  # repeated after a lost reply: nothing changes
    assert r.hget(K.task(task.id), "preemptions") == "1"
    assert r.hget(K.outcome_counts("q"), "preempted") == "1"
    again = listener.reserve()
    assert again is not None and again.id == task.id and again.attempts == 2
    with pytest.raises(StaleAttempt):
        processor.preempt("a superseded run cannot put it back")


# --- a late ending (PROTOCOL.md 5.6): a run recovered while it lived ------------------------
def recovered_alive(client: blueque.Client, verdict: str, **options: object
                    ) -> tuple[blueque.Task, Processor]:
    """A started run whose listener's lease lapsed (cut off from Redis) while the run went
    on: recover records ``verdict`` for it, as a sweep on another node does."""
    client.get_queue("q").enqueue("p", **options)  # type: ignore[arg-type]
    listener = Listener("q", client.store)
    task = listener.reserve()
    assert task is not None
    processor = client.get_processor(task)
    processor.start(4242)
    eta = time.time() + 60 if verdict == "retry" else None
    counts = client.store.recover("q", listener.id, [(task.id, "1", verdict, eta, "cut off")],
                                  time.time(), mode="host")
    assert counts != [-1]
    return task, processor


def test_a_late_ending_of_the_only_attempt_is_recorded(any_client: blueque.Client) -> None:
    """Issue 19 item 5: a node cut off longer than its lease; its max_attempts=1 task was
    recorded failed by the recovery, though its only run then completed normally."""
    r = any_client.redis
    task, processor = recovered_alive(any_client, "failed", max_attempts=1)
    assert r.hget(K.task(task.id), "status") == "failed"
    processor.complete("done late")
    data = r.hgetall(K.task(task.id))
    assert (data["status"], data["result"], data["attempts"]) == ("complete", "done late", "1")
    assert r.lrange(K.failed("q"), 0, -1) == []
    assert r.lrange(K.complete("q"), 0, -1) == [task.id]
    assert [entry["outcome"] for entry in any_client.get_task(task.id).history] == [
        "failed", "complete"]  # recover's guess, then what the run came to


def test_a_late_ending_takes_the_task_out_of_its_retry(any_client: blueque.Client) -> None:
    r = any_client.redis
    task, processor = recovered_alive(any_client, "retry", max_attempts=3)
    assert r.zscore(K.scheduled("q"), task.id) is not None
    processor.complete("done late")
    assert r.zscore(K.scheduled("q"), task.id) is None  # the retry that had not begun
    assert r.hget(K.task(task.id), "status") == "complete"


def test_no_late_ending_once_a_newer_attempt_started(any_client: blueque.Client) -> None:
    r = any_client.redis
    task, processor = recovered_alive(any_client, "pending")
    assert r.hget(K.task(task.id), "status") == "pending"
    again = any_client.get_listener("q").reserve()
    assert again is not None and again.id == task.id and again.attempts == 2
    with pytest.raises(StaleAttempt):
        processor.complete("too late")
    assert r.hget(K.task(task.id), "status") == "reserved"


def test_no_late_ending_for_a_cancelled_task(any_client: blueque.Client) -> None:
    r = any_client.redis
    task, processor = recovered_alive(any_client, "cancelled")
    with pytest.raises(InvalidTaskState):
        processor.complete("too late")
    assert r.hget(K.task(task.id), "status") == "failed"
    assert r.hget(K.task(task.id), "cancelled") is not None


def test_a_finished_task_is_no_late_ending(any_client: blueque.Client) -> None:
    """Only recover's endings of a started run (history ``recovered``) make room for a late
    one: a run's own recorded failure is not followed by another ending."""
    r = any_client.redis
    task, _ = reserved_task(any_client)
    processor = any_client.get_processor(task)
    processor.start(4242)
    processor.fail("broken")
    with pytest.raises(InvalidTaskState):
        processor.complete("a second ending")
    assert r.hget(K.task(task.id), "status") == "failed"


# --- reclaim (PROTOCOL.md 5.12b): the run goes on when its retry has not started ----------------
def test_a_run_reclaims_its_task_from_the_retry_that_had_not_begun(
        any_client: blueque.Client) -> None:
    """Issue 30 item 1: the listener back from a cut longer than its lease takes the task back
    for its live run, instead of killing hours of work to run it again from zero."""
    r, store = any_client.redis, any_client.store
    task, processor = recovered_alive(any_client, "retry", max_attempts=3)
    listener = task.node or ""
    started = any_client.get_task(task.id).history[-1]["started"]
    assert store.reclaim("q", task.id, listener, 1, 4242, 123.5, time.time()) == ("ok", "")
    data = r.hgetall(K.task(task.id))
    assert (data["status"], data["node"], data["pid"], data["attempts"]) == (
        "started", listener, "4242", "1")
    # when the run began, as recover's history entry kept it (to the millisecond: cjson's)
    assert data["pid_created"] == "123.5" and float(data["started_at"]) == pytest.approx(
        started, abs=0.001)
    assert not {"eta", "error"} & set(data)  # recover's guess is in the history only
    assert is_current_run(data, listener, 1)
    assert r.zscore(K.scheduled("q"), task.id) is None  # the retry is withdrawn
    assert r.lrange(K.reserved("q", listener), 0, -1) == [task.id]
    assert f"{listener} 4242 {task.id}" in r.smembers(K.started("q"))
    assert any_client.get_task(task.id).history[-1]["reclaimed"] > started
    # a repeat whose reply was lost changes nothing
    assert store.reclaim("q", task.id, listener, 1, 4242, 123.5, time.time()) == ("ok", "")
    assert r.lrange(K.reserved("q", listener), 0, -1) == [task.id]
    processor.complete("done")
    done = any_client.get_task(task.id)
    assert (done.status, done.attempts) == ("complete", 1)
    assert [entry["outcome"] for entry in done.history] == ["retry", "complete"]


def test_a_reclaimed_task_fences_out_the_attempt_a_listener_moved_but_did_not_stamp(
        any_client: blueque.Client) -> None:
    """The retry was due (pending) and another listener's LMOVE took it, not yet stamped: its
    stamp then finds the task started by the run that reclaimed it, and drops it."""
    r, store = any_client.redis, any_client.store
    task, _ = recovered_alive(any_client, "retry", max_attempts=3)
    store.enqueue_due("q", time.time() + 120)
    assert r.hget(K.task(task.id), "status") == "pending"
    assert store.move_pending("q", "other_2", None) == task.id  # the reserved window
    assert store.reclaim("q", task.id, task.node or "", 1, 4242, None, time.time()) == ("ok", "")
    assert "pid_created" not in r.hgetall(K.task(task.id))
    assert store.stamp("q", "other_2", task.id, time.time()).verdict == "skip"
    assert r.lrange(K.reserved("q", "other_2"), 0, -1) == []
    assert r.lrange(K.pending("q"), 0, -1) == []
    data = r.hgetall(K.task(task.id))
    assert (data["status"], data["node"], data["attempts"]) == ("started", task.node, "1")


def test_a_newer_attempt_supersedes_the_run_and_no_reclaim_undoes_it(
        any_client: blueque.Client) -> None:
    r, store = any_client.redis, any_client.store
    task, _ = recovered_alive(any_client, "retry", max_attempts=3)
    store.enqueue_due("q", time.time() + 120)
    again = any_client.get_listener("q").reserve()
    assert again is not None and again.attempts == 2
    assert store.reclaim("q", task.id, task.node or "", 1, 4242, None, time.time()) == (
        "stale", "2")
    assert r.hget(K.task(task.id), "node") == again.node


@pytest.mark.parametrize("case", ["attempts used up", "cancelled", "another listener's"])
def test_only_a_task_waiting_for_the_retry_of_this_very_run_is_reclaimed(
        any_client: blueque.Client, case: str) -> None:
    """A task recorded failed is left to its run's late ending (5.6); a cancelled one stays
    cancelled; a run is never reclaimed for a listener other than its own."""
    r, store = any_client.redis, any_client.store
    task, _ = recovered_alive(any_client, "failed" if case == "attempts used up" else "retry",
                              max_attempts=1 if case == "attempts used up" else 3)
    if case == "cancelled":
        any_client.cancel_task(task.id)
    before = r.hgetall(K.task(task.id))
    listener = "someone_7" if case == "another listener's" else task.node or ""
    verdict, status = store.reclaim("q", task.id, listener, 1, 4242, None, time.time())
    assert (verdict, status) == ("no", before["status"])
    assert r.hgetall(K.task(task.id)) == before
