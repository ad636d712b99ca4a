"""Contract tests: creating tasks (enqueue, enqueue_many, schedule) and moving due ones.

Each test asserts the Redis state PROTOCOL.md section 5.1-5.3 specifies."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter

import pytest
import redis

import blueque
from blueque.aio.client import Queue as AsyncQueue
from blueque.errors import ConfigurationError, WrongType
from blueque.keys import Keys
from blueque.policy import OPTION_TYPES, Policy, field_float
from blueque.store import BULK_CHUNK
from tests.daemons import between

K = Keys()
ORIGINAL_FIELDS = {"status", "queue", "parameters", "created", "updated"}


def make_due(client: blueque.Client, queue: str, count: int, prefix: str = "due") -> list[str]:
    """Scheduled tasks whose eta has already passed (Queue.schedule would enqueue them at once,
    so they are submitted through the store with an explicit past eta)."""
    past = time.time() - 60
    ids = [f"{prefix}-{i}" for i in range(count)]
    for task_id in ids:
        client.store.submit(queue, task_id, "{}", past - 1, eta=past)
    return ids


def test_enqueue_writes_exactly_the_fields_1_0_1_writes(contract_client: blueque.Client) -> None:
    r = contract_client.redis
    before = time.time()
    task_id = contract_client.get_queue("q").enqueue('{"n": 1}')
    data = r.hgetall(K.task(task_id))
    assert set(data) == ORIGINAL_FIELDS  # nothing more: memory stays at 1.0.1's level
    assert data["status"] == "pending"
    assert data["queue"] == "q"
    assert data["parameters"] == '{"n": 1}'
    assert data["created"] == data["updated"]
    assert between(before, float(data["created"]), time.time())
    assert r.lrange(K.pending("q"), 0, -1) == [task_id]
    assert r.zscore(K.queues(), "q") == 0.0
    assert r.type(K.scheduled("q")) == "none"


def test_enqueue_options_add_only_their_fields(contract_client: blueque.Client) -> None:
    task_id = contract_client.get_queue("q").enqueue("p", max_attempts=3, time_limit=60)
    data = contract_client.redis.hgetall(K.task(task_id))
    assert set(data) == ORIGINAL_FIELDS | {"max_attempts", "time_limit"}
    assert (data["max_attempts"], data["time_limit"]) == ("3", "60.0")


def test_enqueue_rejects_unknown_options_and_non_text_parameters(
    contract_client: blueque.Client,
) -> None:
    queue = contract_client.get_queue("q")
    with pytest.raises(ConfigurationError, match="unknown task option"):
        queue.enqueue("p", priority=1)
    with pytest.raises(TypeError, match=r"json\.dumps"):
        queue.enqueue({"not": "a string"})
    assert contract_client.redis.llen(K.pending("q")) == 0


def test_text_that_utf8_cannot_encode_is_refused_clearly(contract_client: blueque.Client
                                                         ) -> None:
    """A lone surrogate (what a bad decode with errors="surrogateescape" leaves) cannot reach
    Redis as UTF-8: WrongType says so, for one task and for a batch, and nothing is written."""
    queue = contract_client.get_queue("q")
    with pytest.raises(WrongType, match="UTF-8"):
        queue.enqueue("caf\udce9")
    with pytest.raises(WrongType, match="UTF-8"):
        queue.enqueue_many(["fine", "caf\udce9"])
    assert contract_client.redis.llen(K.pending("q")) == 0


@pytest.mark.parametrize(("options", "words"), [
    ({"max_attempts": float("nan")}, "max_attempts=nan is not a finite number"),
    ({"max_attempts": "inf"}, "max_attempts='inf' is not a finite number"),
    ({"time_limit": "nan"}, "time_limit='nan': bad duration 'nan': use a number of seconds"),
    ({"time_limit": "4 hours"}, "time_limit='4 hours': bad duration"),
    ({"time_limit": float("inf")}, "time_limit=inf is not a finite number"),
    ({"max_attempts": 0}, "max_attempts=0 is out of range: it must be at least 1"),
    ({"retry_backoff": -1}, "retry_backoff=-1 is out of range: it must be at least 0"),
])
def test_options_that_are_no_finite_number_in_range_are_refused(
        contract_client: blueque.Client, options: dict[str, object], words: str) -> None:
    """A ConfigurationError that says the range, never a bare ValueError or OverflowError
    (max_attempts=nan, 'inf'), nor a 'nan' time limit stored that meant no limit unsaid."""
    queue = contract_client.get_queue("q")
    with pytest.raises(ConfigurationError, match=re.escape(words)):
        queue.enqueue("p", **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=re.escape(words)):
        queue.configure(**options)  # type: ignore[arg-type]
    assert contract_client.redis.llen(K.pending("q")) == 0
    assert contract_client.redis.exists(K.queue_config("q")) == 0


def test_a_duration_option_takes_the_text_the_cli_takes(contract_client: blueque.Client
                                                        ) -> None:
    """`blueque enqueue --time-limit 4h` worked and `enqueue(time_limit="4h")` was refused:
    the API takes a duration as the CLI does (90, 15m, 4h, 7d), for every option in seconds,
    a schedule's delay too; counts stay numbers."""
    queue = contract_client.get_queue("q")
    task_id = queue.enqueue("p", time_limit="4h", retry_backoff="90", retry_backoff_max="1d",
                            kill_grace="30s", result_ttl="1w", max_attempts="3")
    data = contract_client.get_task(task_id).data
    assert [float(data[name]) for name in ("time_limit", "retry_backoff", "retry_backoff_max",
                                           "kill_grace", "result_ttl")] == [
        4 * 3600, 90, 86400, 30, 7 * 86400]
    assert data["max_attempts"] == "3"
    queue.configure(time_limit="15m")
    assert queue.config()["time_limit"] == "900.0"
    before = contract_client.store.now()
    later = contract_client.get_task(queue.schedule("p", delay="1h")).eta
    assert later is not None and 3600 <= later - before < 3660
    with pytest.raises(ConfigurationError, match="max_attempts='3x' is not a number"):
        queue.enqueue("p", max_attempts="3x")
    with pytest.raises(ConfigurationError, match="bad duration"):
        queue.schedule("p", delay="soon")


def test_the_options_are_policy_s_fields_and_the_checkpoint_s_bound() -> None:
    policy = {name: type(value) for name, value in vars(Policy()).items()}
    assert {**policy, "checkpoint_max_bytes": int} == OPTION_TYPES  # and in that order
    assert list(OPTION_TYPES) == [*policy, "checkpoint_max_bytes"]


@pytest.mark.parametrize("enqueue", [blueque.Queue.enqueue, AsyncQueue.enqueue])
def test_both_enqueue_docstrings_name_every_option(enqueue) -> None:  # type: ignore[no-untyped-def]
    words = set(re.findall(r"\w+", enqueue.__doc__ or ""))
    assert set(OPTION_TYPES) - words == set()


@pytest.mark.parametrize("raw, expected", [
    ("12.5", 12.5), ("3", 3.0), ("-1", -1.0), ("1e3", 1000.0),
    # missing or corrupt: unknown, never an error (its reader says what unknown means)
    (None, None), ("", None), ("abc", None), ("inf", None), ("-inf", None), ("nan", None),
])
def test_a_number_field_is_read_one_way(raw: str | None, expected: float | None) -> None:
    assert field_float(raw) == expected


def test_pending_tasks_are_taken_first_in_first_out(contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue("q")
    ids = [queue.enqueue(str(i)) for i in range(3)]
    listener = contract_client.get_listener("q")
    taken = []
    for _ in ids:
        task = listener.reserve()
        assert task is not None
        taken.append(task.id)
    assert taken == ids
    assert listener.reserve() is None


def test_enqueue_with_the_same_task_id_twice_creates_one_task(
    contract_client: blueque.Client,
) -> None:
    r = contract_client.redis
    queue = contract_client.get_queue("q")
    assert queue.enqueue("first", task_id="job-1") == "job-1"
    created = r.hget(K.task("job-1"), "created")
    assert queue.enqueue("second", task_id="job-1") == "job-1"
    assert r.lrange(K.pending("q"), 0, -1) == ["job-1"]
    assert r.hget(K.task("job-1"), "parameters") == "first"
    assert r.hget(K.task("job-1"), "created") == created


def test_enqueue_many_counts_created_and_existing(contract_client: blueque.Client) -> None:
    r = contract_client.redis
    queue = contract_client.get_queue("q")
    first = queue.enqueue_many(["a", "b", "c"], task_ids=["t1", "t2", "t3"])
    assert (first.created, first.existing) == (3, 0)
    again = queue.enqueue_many(["x", "y", "z", "w"], task_ids=["t3", "t4", "t1", "t5"])
    assert (again.created, again.existing) == (2, 2)
    assert again.task_ids == ["t3", "t4", "t1", "t5"]
    # FIFO over both calls, each id exactly once
    assert r.lrange(K.pending("q"), 0, -1)[::-1] == ["t1", "t2", "t3", "t4", "t5"]
    assert r.hget(K.task("t1"), "parameters") == "a"
    for task_id in ("t1", "t2", "t3", "t4", "t5"):
        assert set(r.hgetall(K.task(task_id))) == ORIGINAL_FIELDS
        assert r.hget(K.task(task_id), "status") == "pending"


def test_enqueue_many_spans_several_script_calls(contract_client: blueque.Client) -> None:
    count = BULK_CHUNK * 2 + 17
    result = contract_client.get_queue("q").enqueue_many([str(i) for i in range(count)])
    assert (result.created, result.existing, len(result)) == (count, 0, count)
    assert len(set(result.task_ids)) == count
    pending = contract_client.redis.lrange(K.pending("q"), 0, -1)
    assert pending[::-1] == result.task_ids
    assert contract_client.redis.hget(K.task(result.task_ids[-1]), "parameters") == str(count - 1)


def test_enqueue_many_refuses_duplicate_or_mismatched_ids(contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue("q")
    with pytest.raises(ConfigurationError, match="duplicates"):
        queue.enqueue_many(["a", "b"], task_ids=["same", "same"])
    with pytest.raises(ConfigurationError, match="one id per task"):
        queue.enqueue_many(["a", "b"], task_ids=["only-one"])
    assert contract_client.redis.llen(K.pending("q")) == 0


def test_schedule_stores_a_scheduled_task_with_its_eta(contract_client: blueque.Client) -> None:
    r = contract_client.redis
    eta = time.time() + 3600
    task_id = contract_client.get_queue("q").schedule("later", eta)
    data = r.hgetall(K.task(task_id))
    assert set(data) == ORIGINAL_FIELDS | {"eta"}
    assert data["status"] == "scheduled"
    assert float(data["eta"]) == eta
    assert r.zrange(K.scheduled("q"), 0, -1, withscores=True) == [(task_id, eta)]
    assert r.llen(K.pending("q")) == 0
    assert r.zscore(K.queues(), "q") == 0.0
    assert contract_client.get_task(task_id).eta == eta


def test_schedule_with_an_eta_in_the_past_enqueues_at_once(contract_client: blueque.Client) -> None:
    r = contract_client.redis
    task_id = contract_client.get_queue("q").schedule("now", time.time() - 5)
    assert r.hget(K.task(task_id), "status") == "pending"
    assert r.hget(K.task(task_id), "eta") is None
    assert r.lrange(K.pending("q"), 0, -1) == [task_id]
    assert r.zcard(K.scheduled("q")) == 0


def test_enqueue_due_moves_only_due_tasks(contract_client: blueque.Client) -> None:
    r = contract_client.redis
    queue = contract_client.get_queue("q")
    due = make_due(contract_client, "q", 3)
    later = queue.schedule("later", time.time() + 3600)
    assert sorted(queue.enqueue_due_tasks()) == sorted(due)
    assert r.zrange(K.scheduled("q"), 0, -1) == [later]
    assert sorted(r.lrange(K.pending("q"), 0, -1)) == sorted(due)
    for task_id in due:
        assert r.hget(K.task(task_id), "status") == "pending"
    assert r.hget(K.task(later), "status") == "scheduled"
    assert queue.enqueue_due_tasks() == []


def test_enqueue_due_moves_more_than_one_batch(contract_client: blueque.Client) -> None:
    due = make_due(contract_client, "q", 1500)
    moved = contract_client.get_queue("q").enqueue_due_tasks()
    assert sorted(moved) == sorted(due)
    assert contract_client.redis.llen(K.pending("q")) == 1500


def test_a_due_task_whose_hash_vanished_is_recorded_failed(contract_client: blueque.Client) -> None:
    r = contract_client.redis
    r.zadd(K.scheduled("q"), {"ghost": time.time() - 1})
    assert contract_client.get_queue("q").enqueue_due_tasks() == ["ghost"]
    listener = contract_client.get_listener("q")
    assert listener.reserve() is None  # not runnable ...
    assert r.hget(K.task("ghost"), "status") == "failed"  # ... and recorded
    assert r.lrange(K.failed("q"), 0, -1) == ["ghost"]


def _race(*movers: object) -> None:
    barrier = threading.Barrier(len(movers))
    errors: list[BaseException] = []

    def run(mover: object) -> None:
        try:
            barrier.wait(timeout=10)
            assert callable(mover)
            mover()
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(m,)) for m in movers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


def _assert_each_moved_once(r: redis.Redis, ids: list[str]) -> None:
    pending = Counter(r.lrange(K.pending("q"), 0, -1))
    assert pending == Counter(ids)  # every task exactly once, none lost, none doubled
    assert r.zcard(K.scheduled("q")) == 0
    pipe = r.pipeline(transaction=False)
    for task_id in ids:
        pipe.hget(K.task(task_id), "status")
    assert set(pipe.execute()) == {"pending"}


def test_racing_enqueue_due_callers_move_each_task_exactly_once(
    client: blueque.Client, redis_client: redis.Redis
) -> None:
    ids = make_due(client, "q", 1000)
    moved: dict[str, list[str]] = {"a": [], "b": []}
    other = blueque.Client(f"redis://{client.store.where}/0")

    def mover(name: str, store: object) -> object:
        def run() -> None:
            while True:
                batch = store.enqueue_due("q", time.time(), limit=10)  # type: ignore[attr-defined]
                moved[name] += batch
                if not batch and not redis_client.zcard(K.scheduled("q")):
                    return
        return run

    try:
        _race(mover("a", client.store), mover("b", other.store))
    finally:
        other.close()
    assert not set(moved["a"]) & set(moved["b"])
    assert sorted(moved["a"] + moved["b"]) == sorted(ids)
    assert moved["a"] and moved["b"], "both callers should have won some tasks"
    _assert_each_moved_once(redis_client, ids)


def _seed_enqueue_due(r: redis.Redis) -> None:
    """The seed's WATCH/MULTI command sequence, as blueque 1.0.1 runs it."""
    scheduled = K.scheduled("q")

    def transaction(pipe: redis.client.Pipeline) -> None:
        now = time.time()
        due = pipe.zrangebyscore(scheduled, 0, now)
        if not due:
            return
        pipe.multi()
        pipe.zremrangebyscore(scheduled, 0, now)
        for task_id in due:
            pipe.lpush(K.pending("q"), task_id)
            pipe.hset(K.task(task_id), mapping={"status": "pending", "updated": now})

    while r.zcard(scheduled):
        r.transaction(transaction, scheduled)


def test_enqueue_due_races_safely_with_the_watch_multi_version(
    client: blueque.Client, redis_client: redis.Redis
) -> None:
    ids = make_due(client, "q", 1000)
    seed_client = redis.Redis.from_url(f"redis://{client.store.where}/0", decode_responses=True)
    ours: list[str] = []

    def blueque_mover() -> None:
        while batch := client.store.enqueue_due("q", time.time(), limit=25):
            ours.extend(batch)

    try:
        _race(blueque_mover, lambda: _seed_enqueue_due(seed_client))
    finally:
        seed_client.close()
    assert set(ours) <= set(ids)
    _assert_each_moved_once(redis_client, ids)


def test_enqueue_due_moves_due_tasks_behind_a_full_batch_of_stale_entries(
    contract_client: blueque.Client,
) -> None:
    """Zset entries whose task is no longer scheduled are only removed; they must not stop
    enqueue_due_tasks before the due tasks behind them."""
    r = contract_client.redis
    stale = make_due(contract_client, "q", 1000, prefix="stale")
    pipe = r.pipeline(transaction=False)
    for task_id in stale:  # e.g. moved to pending by a writer that left the zset entry
        pipe.hset(K.task(task_id), "status", "pending")
    pipe.execute()
    due = contract_client.store.submit("q", "due-late", "{}", time.time() - 5, eta=time.time() - 5)
    assert due
    assert contract_client.get_queue("q").enqueue_due_tasks() == ["due-late"]
    assert r.zcard(K.scheduled("q")) == 0
    assert r.hget(K.task("due-late"), "status") == "pending"


def queue_listing_writes(r: redis.Redis) -> int:
    """Commands that may write blueque_queues on an enqueue: ZINCRBY (1.0.1's) and ZADD."""
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
               for name in ("zincrby", "zadd"))


@pytest.mark.parametrize("hash_tags", [False, True], ids=["default", "hash-tagged"])
def test_an_enqueue_lists_its_queue_and_leaves_its_listener_count(
        redis_client: redis.Redis, hash_tags: bool) -> None:
    client = blueque.Client(redis_client, hash_tags=hash_tags)
    keys = client.keys
    redis_client.zadd(keys.queues(), {"busy": 2})  # two listeners, as 1.0.1 counts them
    client.get_queue("busy").enqueue("{}")
    client.get_queue("busy").enqueue("{}")
    client.get_queue("fresh").enqueue("{}")
    client.get_queue("later").schedule("{}", delay=3600)
    assert redis_client.zscore(keys.queues(), "busy") == 2.0
    assert redis_client.zscore(keys.queues(), "fresh") == 0.0
    assert redis_client.zscore(keys.queues(), "later") == 0.0
    # a queue taken out of the listing while empty (forget-queue) comes back with a task
    redis_client.delete(keys.pending("fresh"))
    redis_client.zrem(keys.queues(), "fresh")
    client.get_queue("fresh").enqueue("{}")
    assert redis_client.zscore(keys.queues(), "fresh") == 0.0


def test_an_enqueue_onto_a_pending_list_that_holds_tasks_leaves_the_listing_alone(
        client: blueque.Client) -> None:
    r, queue = client.redis, client.get_queue("q")
    queue.enqueue("{}")
    assert r.zscore(K.queues(), "q") == 0.0
    before = queue_listing_writes(r)
    queue.enqueue("{}")  # the list held a task: its queue is listed, nothing to write
    queue.enqueue("{}")
    assert queue_listing_writes(r) == before
    assert r.llen(K.pending("q")) == 3
