"""Contract tests of checkpoints (PROTOCOL.md 5.20): save and read, fencing by attempt, the
size limit, and the checkpoint key's life (delete, purge, result TTL, operator retry)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
import redis
from redis.crc import key_slot

import blueque
from blueque.errors import (
    CheckpointTooLarge,
    ConfigurationError,
    InvalidTaskState,
    StaleAttempt,
    WrongType,
)
from blueque.keys import Keys
from blueque.listener import Listener
from blueque.store import CHECKPOINT_KEEP, CHECKPOINT_MAX_BYTES
from blueque.task import CheckpointInfo
from tests.conftest import Run
from tests.daemons import between
from tests.readme import block

K = Keys()
MIB = 1024 * 1024


def started_task(client: blueque.Client, queue: str = "q", identity: str | None = None,
                 **options: object) -> blueque.Task:
    """A task reserved by a listener and started, as a task function receives it."""
    client.get_queue(queue).enqueue("p", **options)  # type: ignore[arg-type]
    task = Listener(queue, client.store, identity=identity).reserve()
    assert task is not None
    client.get_processor(task).start(4242)
    return task.refresh()


def test_a_saved_checkpoint_is_what_the_next_reader_gets(any_client: blueque.Client) -> None:
    r = any_client.redis
    task = started_task(any_client)
    assert task.checkpoint is None and task.checkpoint_info is None
    before = time.time()
    info = task.save_checkpoint(json.dumps({"done": 3}))
    assert info == CheckpointInfo(size=11, saved_at=info.saved_at, attempt=1)
    assert between(before, info.saved_at, time.time())
    stored = r.hgetall(K.checkpoint(task.id))
    assert stored == {"state": '{"done": 3}', "saved_at": repr(info.saved_at), "attempt": "1",
                      "size": "11"}
    assert task.checkpoint == '{"done": 3}'  # this object knows what it saved
    fresh = any_client.get_task(task.id)  # a re-run reads it
    assert fresh.checkpoint == '{"done": 3}' and fresh.checkpoint_info == info
    # the task hash itself carries nothing of it: readers of task hashes never pay for it
    assert not {"state", "checkpoint"} & set(r.hgetall(K.task(task.id)))

    task.save_checkpoint("é" * 10)  # the size is in UTF-8 bytes; a save replaces the last
    assert any_client.get_task(task.id).checkpoint == "é" * 10
    assert any_client.get_task(task.id).checkpoint_info.size == 20  # type: ignore[union-attr]


def test_each_save_renews_the_bounded_life_of_the_key(any_client: blueque.Client) -> None:
    r = any_client.redis
    task = started_task(any_client)
    task.save_checkpoint("1")
    r.pexpire(K.checkpoint(task.id), 5_000)  # as if saved long ago
    task.save_checkpoint("2")
    keep_ms = int(CHECKPOINT_KEEP * 1000)
    assert keep_ms - 60_000 < r.pttl(K.checkpoint(task.id)) <= keep_ms


def test_the_checkpoint_is_read_once_and_only_when_used(client: blueque.Client) -> None:
    """Per-task overhead: a task that never touches its checkpoint sends no command for it;
    the first use sends one, later uses none."""
    r = client.redis
    task = started_task(client)
    task.save_checkpoint("resume here")

    def calls(command: str) -> int:
        stats = r.info("commandstats").get(f"cmdstat_{command}", {})
        return int(stats.get("calls", 0))

    r.config_resetstat()
    seen = client.get_task(task.id)
    assert (seen.status, seen.attempts, seen.parameters) == ("started", 1, "p")
    seen.refresh()
    assert (calls("hgetall"), calls("hmget")) == (2, 0)  # the task hash twice, nothing else
    assert seen.checkpoint == "resume here"
    assert seen.checkpoint == "resume here" and seen.checkpoint_info is not None
    assert (calls("hgetall"), calls("hmget")) == (3, 0)
    other = client.get_task(task.id)
    assert other.checkpoint_info is not None and other.checkpoint_info.size == 11
    assert calls("hmget") == 1  # the info alone leaves the state in Redis


def test_only_text_is_saved(any_client: blueque.Client) -> None:
    task = started_task(any_client)
    for bad in (b"bytes", {"done": 1}, 42, None):
        with pytest.raises(WrongType, match=r"json\.dumps"):
            task.save_checkpoint(bad)  # type: ignore[arg-type]
    with pytest.raises(WrongType, match="UTF-8"):  # a BluequeError the task may catch
        task.save_checkpoint('{"name": "caf\udce9"}')
    assert any_client.redis.exists(K.checkpoint(task.id)) == 0


# --- fencing ------------------------------------------------------------------------------
def test_a_superseded_run_cannot_overwrite_the_newer_attempts_checkpoint(
        any_client: blueque.Client) -> None:
    r, store = any_client.redis, any_client.store
    old = started_task(any_client, identity="oldhost_1")
    old.save_checkpoint("old 1")
    # its listener is declared dead: the task is requeued and attempt 2 runs elsewhere
    assert store.recover("q", "oldhost_1", [(old.id, "1", "pending", None, "")], time.time(),
                         mode="host") == [1, 0, 0, 0, 0]
    with pytest.raises(StaleAttempt, match="is pending"):
        old.save_checkpoint("old, while pending")  # same attempts number, but not its run
    new = any_client.get_listener("q").reserve()
    assert new is not None and new.attempts == 2
    any_client.get_processor(new).start(5151)
    assert new.refresh().checkpoint == "old 1"  # attempt 2 resumes from attempt 1's save
    new.save_checkpoint("new 2")

    with pytest.raises(StaleAttempt, match="attempt 1 of oldhost_1 is not saved") as refused:
        old.save_checkpoint("old 2")
    assert "started on attempt 2" in str(refused.value)
    old.refresh()  # re-reading its task does not make the old run the current one
    assert old.attempts == 2
    with pytest.raises(StaleAttempt):
        old.save_checkpoint("old 3")
    stored = r.hgetall(K.checkpoint(old.id))
    assert (stored["state"], stored["attempt"]) == ("new 2", "2")
    assert isinstance(refused.value, InvalidTaskState)


def test_another_listeners_run_and_an_ended_run_are_refused(any_client: blueque.Client) -> None:
    r = any_client.redis
    task = started_task(any_client, identity="hosta_1")
    r.hset(K.task(task.id), "node", "hostb_2")  # reserved again by another listener
    with pytest.raises(StaleAttempt, match="of hostb_2"):
        task.save_checkpoint("x")
    r.hset(K.task(task.id), "node", "hosta_1")
    task.save_checkpoint("last")
    any_client.get_processor(task).complete("done")
    with pytest.raises(StaleAttempt, match="is complete"):
        task.save_checkpoint("after the end")
    assert r.hget(K.checkpoint(task.id), "state") == "last"


def test_tasks_that_are_not_running_cannot_save(any_client: blueque.Client) -> None:
    r = any_client.redis
    pending = any_client.get_task(any_client.get_queue("q").enqueue("p"))
    with pytest.raises(InvalidTaskState, match="is pending: only a reserved or started"):
        pending.save_checkpoint("x")
    with pytest.raises(InvalidTaskState, match="is missing"):
        any_client.get_task("no-such-task", missing_ok=True).save_checkpoint("x")
    # blueque 1.0.1 reserves without an attempt number: nothing to fence by, nothing saved
    task_id = any_client.get_queue("old").enqueue("p")
    r.rpoplpush(K.pending("old"), K.reserved("old", "oldhost_1"))
    r.hset(K.task(task_id), mapping={"status": "reserved", "node": "oldhost_1"})
    with pytest.raises(InvalidTaskState, match=r"blueque 1\.0\.1 reserved it"):
        any_client.get_task(task_id).save_checkpoint("x")
    assert not r.keys("blueque_checkpoint_*")


# --- the size limit -----------------------------------------------------------------------
def test_the_default_limit_is_one_mebibyte(any_client: blueque.Client) -> None:
    r = any_client.redis
    task = started_task(any_client)
    assert CHECKPOINT_MAX_BYTES == MIB
    task.save_checkpoint("small")
    with pytest.raises(CheckpointTooLarge, match="Store large state elsewhere") as refused:
        task.save_checkpoint("x" * (MIB + 1))
    assert f"{MIB + 1} bytes, more than its limit of {MIB}" in str(refused.value)
    assert "checkpoint a reference to it" in str(refused.value)
    assert r.hget(K.checkpoint(task.id), "state") == "small"  # nothing was written
    assert task.checkpoint == "small"
    assert task.save_checkpoint("x" * MIB).size == MIB
    assert isinstance(refused.value, blueque.BluequeError)


def test_the_limit_comes_from_the_task_its_queue_or_the_client(
        redis_client: redis.Redis) -> None:
    client = blueque.Client(redis_client, checkpoint_max_bytes=8)
    client.get_queue("configured").configure(checkpoint_max_bytes=16)
    by_client = started_task(client, queue="plain")
    by_queue = started_task(client, queue="configured")
    by_task = started_task(client, queue="configured", checkpoint_max_bytes=4)
    for task, limit in ((by_client, 8), (by_queue, 16), (by_task, 4)):
        task.save_checkpoint("x" * limit)
        with pytest.raises(CheckpointTooLarge, match=f"limit of {limit} "):
            task.save_checkpoint("y" * (limit + 1))
        assert redis_client.hget(K.checkpoint(task.id), "state") == "x" * limit
    assert redis_client.hget(K.task(by_task.id), "checkpoint_max_bytes") == "4"


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1", True])
def test_a_bad_limit_is_refused(client: blueque.Client, bad: object) -> None:
    with pytest.raises(ConfigurationError):
        blueque.Client(client.redis, checkpoint_max_bytes=bad)  # type: ignore[arg-type]
    if isinstance(bad, int) and not isinstance(bad, bool):
        with pytest.raises(ConfigurationError, match="out of range"):
            client.get_queue("q").enqueue("p", checkpoint_max_bytes=bad)


# --- the key's life -----------------------------------------------------------------------
def finished(client: blueque.Client, outcome: str, result_ttl_ms: int | None = None
             ) -> blueque.Task:
    task = started_task(client)
    task.save_checkpoint(f"state of {task.id}")
    processor = client.get_processor(task)
    if outcome == "complete":
        processor.complete("r", result_ttl_ms=result_ttl_ms)
    else:
        processor.fail("e", result_ttl_ms=result_ttl_ms)
    return client.get_task(task.id)


@pytest.mark.parametrize("outcome", ["complete", "failed"])
def test_the_checkpoint_is_kept_until_its_task_is_deleted(any_client: blueque.Client,
                                                          outcome: str) -> None:
    r = any_client.redis
    task = finished(any_client, outcome)
    kept = finished(any_client, outcome)
    assert any_client.get_task(task.id).checkpoint == f"state of {task.id}"
    any_client.get_queue("q").delete_task(task)
    assert r.exists(K.checkpoint(task.id), K.task(task.id)) == 0
    assert r.exists(K.checkpoint(kept.id)) == 1


def test_purge_deletes_checkpoints_with_their_tasks(any_client: blueque.Client) -> None:
    r = any_client.redis
    tasks = [finished(any_client, "complete") for _ in range(3)]
    assert any_client.get_queue("q").purge("complete", older_than=0) == 3
    assert r.exists(*(K.checkpoint(t.id) for t in tasks)) == 0


@pytest.mark.parametrize("outcome", ["complete", "failed"])
def test_the_checkpoint_follows_the_result_ttl(any_client: blueque.Client,
                                               outcome: str) -> None:
    r = any_client.redis
    task = finished(any_client, outcome, result_ttl_ms=60_000)
    assert 0 < r.pttl(K.checkpoint(task.id)) <= 60_000
    assert 0 < r.pttl(K.task(task.id)) <= 60_000


def test_a_retry_keeps_the_checkpoint_and_its_bounded_life(any_client: blueque.Client) -> None:
    r = any_client.redis
    task = started_task(any_client, max_attempts=2, retry_backoff=0.01)
    task.save_checkpoint("half way")
    any_client.get_processor(task).retry("crashed", eta=time.time() - 1)
    assert r.exists(K.checkpoint(task.id)) == 1  # a scheduled retry keeps it (no TTL yet)
    failed = finished(any_client, "failed", result_ttl_ms=1_000)
    assert r.pttl(K.checkpoint(failed.id)) <= 1_000
    # the operator re-runs the failed task: its hash is kept again, and so is its checkpoint,
    # from which the re-run resumes, with the life a save gives it
    any_client.store.retry_failed("q", failed.id, time.time())
    assert r.pttl(K.task(failed.id)) == -1
    assert r.pttl(K.checkpoint(failed.id)) > int(CHECKPOINT_KEEP * 1000) - 60_000
    assert any_client.get_task(failed.id).checkpoint == f"state of {failed.id}"


def test_in_the_cluster_layout_the_checkpoint_shares_its_tasks_slot() -> None:
    keys = Keys(hash_tags=True)
    for queue in ("reports", "a", "queue-with-a-long-name"):
        task_id = keys.new_task_id(queue)
        slot = key_slot(keys.task(task_id).encode())
        assert key_slot(keys.checkpoint(task_id).encode()) == slot
        assert key_slot(keys.pending(queue).encode()) == slot


# --- the blueque command ------------------------------------------------------------------
def test_show_prints_the_checkpoints_size_time_and_attempt(client: blueque.Client,
                                                           run: Run) -> None:
    task = started_task(client)
    state = json.dumps({"done": 7, "pad": "x" * 2000})
    info = task.save_checkpoint(state)
    shown = run("show", task.id)
    assert shown.returncode == 0, shown.stderr
    saved = datetime.fromtimestamp(info.saved_at, UTC).strftime("%Y-%m-%d %H:%M")
    line = shown.stdout.splitlines()[-1]
    assert line.startswith("checkpoint: 2.0 KiB saved " + saved) and "by attempt 1" in line
    assert "xxxx" not in shown.stdout  # the state itself is not printed
    assert json.loads(run("show", task.id, "--json").stdout)["checkpoint"] == {
        "size": len(state), "saved_at": info.saved_at, "attempt": 1}
    printed = run("show", task.id, "--checkpoint")
    assert (printed.returncode, printed.stdout) == (0, state + "\n")
    assert json.loads(run("show", task.id, "--checkpoint", "--json").stdout)[
        "state"] == state

    plain = client.get_queue("q").enqueue("p")
    assert run("show", plain).stdout.splitlines()[-1] == "checkpoint: none"
    missing = run("show", plain, "--checkpoint")
    assert missing.returncode == 1 and "has no checkpoint" in missing.stderr


def test_the_limit_is_an_option_of_enqueue_and_configure(redis_client: redis.Redis,
                                                         run: Run) -> None:
    done = run("enqueue", "q", "{}", "--checkpoint-max-bytes", "4096")
    assert done.returncode == 0, done.stderr
    assert redis_client.hget(K.task(done.stdout.strip()), "checkpoint_max_bytes") == "4096"
    assert run("configure", "q", "--checkpoint-max-bytes", "65536").returncode == 0
    assert redis_client.hget(K.queue_config("q"), "checkpoint_max_bytes") == "65536"
    assert run("configure", "q", "--checkpoint-max-bytes", "none").returncode == 0
    assert redis_client.hget(K.queue_config("q"), "checkpoint_max_bytes") is None
    refused = run("enqueue", "q", "{}", "--checkpoint-max-bytes", "0")
    assert refused.returncode == 2 and "out of range" in refused.stderr


# --- the tutorial's example ---------------------------------------------------------------
def readme_example() -> tuple[str, str]:
    """The two ```python blocks of the tutorial's "Checkpoints" (docs/tutorial.md)."""
    return (block("Checkpoints", 1, "tutorial.md").text,
            block("Checkpoints", 2, "tutorial.md").text)


def test_the_readme_example_resumes_where_it_left_off(client: blueque.Client) -> None:
    """Run as written: its first attempt dies at frame 25, the second renders from 20 on."""
    function, enqueue = readme_example()
    rendered: list[tuple[int, int]] = []
    attempt = [1]

    def render(frame: int) -> None:
        if attempt[0] == 1 and frame == 25:
            raise MemoryError("killed at frame 25")
        rendered.append((attempt[0], frame))

    namespace: dict[str, object] = {"render": render}
    exec(function, namespace)  # the tutorial's own code
    queue = client.get_queue("frames")
    exec(enqueue.replace("5000", "42"), {"queue": queue, "json": json})
    job = namespace["render_frames"]
    assert callable(job)
    first = reserve_and_start(client, "frames", attempt=1)
    with pytest.raises(MemoryError):
        job(first)
    client.get_processor(first).retry("killed", eta=time.time() - 1)
    queue.enqueue_due_tasks()
    attempt[0] = 2
    second = reserve_and_start(client, "frames", attempt=2)
    assert job(second) == {"frames": 42}
    assert [f for a, f in rendered if a == 1] == list(range(25))
    assert [f for a, f in rendered if a == 2] == list(range(20, 42))
    assert json.loads(second.checkpoint or "{}") == {"next": 40}


def reserve_and_start(client: blueque.Client, queue: str, attempt: int) -> blueque.Task:
    task = Listener(queue, client.store).reserve()
    assert task is not None and task.attempts == attempt
    client.get_processor(task).start(4343)
    return task.refresh()
