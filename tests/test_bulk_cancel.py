"""Cancel every waiting task of a queue in bounded steps (issue 21 item 3): Queue.cancel_waiting
(both clients), `blueque cancel --all`, and a bulk cancel racing a live listener.

The procedure's clock is called before each script call: the tests use it to change the lists
between two calls, as listeners, producers, recovery and other operators do."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

import blueque
from blueque import protocol
from blueque.errors import ConfigurationError
from blueque.keys import Keys
from tests.conftest import Run
from tests.daemons import Daemon, listen_command, wait_until
from tests.test_cli import ROOT, cli, environment

K = Keys()


def assert_cancelled_as_one_by_one(client: blueque.Client, task_id: str, was: str,
                                   reason: str = "cancelled: cancelled") -> None:
    """What cancel.lua writes for one task (PROTOCOL.md 5.9), checked field by field."""
    data = client.redis.hgetall(K.task(task_id))
    assert data["status"] == "failed" and data["error"] == reason
    assert data["cancelled"] == data["updated"] and "finished_at" not in data
    assert "eta" not in data
    history = json.loads(data["history"])
    assert history[-1]["outcome"] == "cancelled" and history[-1]["was"] == was
    assert history[-1]["error"] == reason


def test_cancel_waiting_cancels_every_pending_and_scheduled_task(
        contract_client: blueque.Client) -> None:
    r = contract_client.redis
    queue = contract_client.get_queue("q")
    pending = queue.enqueue_many(["{}"] * 1200).task_ids  # more than two batches
    scheduled = [queue.schedule("{}", time.time() + 3600 + n) for n in range(3)]
    other = contract_client.get_queue("other").enqueue("{}")
    done = queue.cancel_waiting(reason="wrong input")
    assert (done.pending, done.scheduled, done.cancelled) == (1200, 3, 1203)
    stats = queue.stats()
    assert (stats.pending, stats.scheduled, stats.failed, stats.cancelled) == (0, 0, 0, 1203)
    assert r.llen(K.pending("q")) == 0 and r.zcard(K.scheduled("q")) == 0
    assert set(r.lrange(K.cancelled("q"), 0, -1)) == {*pending, *scheduled}
    assert r.hget(K.outcome_counts("q"), "cancelled") == "1203"
    for task_id in pending[:3]:
        assert_cancelled_as_one_by_one(contract_client, task_id, "pending",
                                       "cancelled: wrong input")
    assert_cancelled_as_one_by_one(contract_client, scheduled[0], "scheduled",
                                   "cancelled: wrong input")
    assert contract_client.get_task(other).status == "pending"  # another queue's


def test_cancel_waiting_by_age_and_by_id_pattern(contract_client: blueque.Client) -> None:
    r = contract_client.redis
    queue = contract_client.get_queue("q")
    ids = {name: queue.enqueue("{}", task_id=name)
           for name in ("batch-7-a", "batch-7-b", "batch-8-a", "keep")}
    old = time.time() - 7200
    for name in ("batch-7-a", "batch-8-a", "keep"):
        r.hset(K.task(ids[name]), "created", repr(old))
    later = queue.schedule("{}", time.time() + 60, task_id="batch-7-later")
    r.hset(K.task(later), "created", repr(old))
    done = queue.cancel_waiting(older_than=3600, match="batch-7-*")
    assert (done.pending, done.scheduled) == (1, 1)
    assert {i for i in ids.values() if contract_client.get_task(i).cancelled} == {"batch-7-a"}
    assert contract_client.get_task(later).cancelled
    # the others wait as they did, in their order
    assert r.lrange(K.pending("q"), 0, -1) == ["keep", "batch-8-a", "batch-7-b"]
    assert queue.cancel_waiting(match="batch-?-*", scheduled=False).pending == 2
    assert r.lrange(K.pending("q"), 0, -1) == ["keep"]
    with pytest.raises(ConfigurationError, match="older_than"):
        queue.cancel_waiting(older_than=float("nan"))
    with pytest.raises(ConfigurationError, match="match"):
        queue.cancel_waiting(match="")


def test_a_bulk_cancel_wakes_the_waiters_of_its_tasks(client: blueque.Client) -> None:
    task_id = client.get_queue("q").enqueue("{}")
    subscription = client.store.subscribe([K.done_channel("q")])
    try:
        assert subscription.get_message(timeout=0) is None  # subscribed, and confirmed
        client.get_queue("q").cancel_waiting()
        message = subscription.get_message(timeout=5)
    finally:
        subscription.close()
    assert message is not None and message.data == task_id


def run_bulk(client: blueque.Client, queue: str, between: Callable[[int], None],
             pattern: str | None = None, size: int = 7) -> protocol.CancelledWaiting:
    """protocol.cancel_waiting with small batches; ``between(call)`` runs before each call."""
    calls = iter(range(10**6))

    def clock() -> float:
        between(next(calls))
        return time.time()

    return client.store.run(protocol.cancel_waiting(
        client.keys, queue, clock, "cancelled: bulk", None, pattern, size=size))


@pytest.mark.parametrize("seed", range(12))
def test_every_waiting_task_is_run_or_cancelled_never_both_nor_neither(
        any_client: blueque.Client, seed: int) -> None:
    """Between the calls, listeners take tasks (some run, some in their reserved window),
    producers enqueue, recovery pushes tasks back at the head of the line, and another
    operator cancels a task: whatever the order, each task that waited when the bulk cancel
    began, matches, and was still waiting when it got there is cancelled; a taken one is not."""
    rng = random.Random(seed)
    r, store, queue = any_client.redis, any_client.store, any_client.get_queue("q")
    names = [f"{'x' if rng.random() < 0.6 else 'y'}-{n}" for n in range(80)]
    queue.enqueue_many(["{}"] * len(names), task_ids=names)
    taken: list[str] = []
    added: list[str] = []
    returned: list[str] = []

    def between(call: int) -> None:
        for _ in range(rng.randrange(3)):
            task_id = store.move_pending("q", "L_1", block=None)
            if task_id is not None:
                taken.append(task_id)
                if rng.random() < 0.5:  # else it stays in its reserved window for now
                    store.stamp("q", "L_1", task_id, time.time())
        if rng.random() < 0.3:
            added.append(queue.enqueue("{}", task_id=f"x-new-{call}"))
        if rng.random() < 0.2 and taken:
            back = taken.pop(rng.randrange(len(taken)))  # recovered: head of the line again
            r.lrem(K.reserved("q", "L_1"), 1, back)
            r.hset(K.task(back), "status", "pending")
            r.rpush(K.pending("q"), back)
            returned.append(back)
        waiting = r.lrange(K.pending("q"), 0, -1)
        if rng.random() < 0.2 and waiting:
            any_client.cancel_task(rng.choice(waiting), "by hand")

    run_bulk(any_client, "q", between, pattern="x-*")
    check_each_task(any_client, [*names, *added], taken, added, returned)
    # the ones left keep their order (the next in line at the right), but the returned ones
    waiting = r.lrange(K.pending("q"), 0, -1)
    originals = [i for i in waiting if i in names and i not in returned]
    assert originals == sorted(originals, key=lambda i: -names.index(i))


def check_each_task(client: blueque.Client, ids: list[str], taken: list[str],
                    added: list[str], returned: list[str]) -> None:
    """Cancelled, or run (a listener has it), or waiting: each exactly one of these."""
    waiting = client.redis.lrange(K.pending("q"), 0, -1)
    for task_id in ids:
        data = client.redis.hgetall(K.task(task_id))
        if data.get("cancelled"):  # cancelled: not waiting, and no listener has it
            assert data["status"] == "failed" and task_id not in waiting
            assert task_id not in taken
        elif task_id in taken:  # a listener has it: it runs
            assert data["status"] in ("pending", "reserved") and task_id not in waiting
        else:  # still waiting: only one that does not match, or that came during the sweep
            assert data["status"] == "pending" and task_id in waiting
            assert task_id.startswith("y-") or task_id in added or task_id in returned, task_id


def test_a_kept_task_taken_from_under_the_anchor_restarts_the_sweep_where_it_must(
        client: blueque.Client) -> None:
    """Everything kept so far is taken by listeners between two calls (its anchor with it):
    the sweep goes on from the list's right end, and misses nothing."""
    r, queue = client.redis, client.get_queue("q")
    names = [f"{'keep' if n < 10 else 'x'}-{n}" for n in range(30)]  # the first ten are kept
    queue.enqueue_many(["{}"] * 30, task_ids=names)

    def between(call: int) -> None:
        if call == 3:  # the ten kept ones sit at the right end: all taken
            for _ in range(10):
                client.store.move_pending("q", "L_1", block=None)

    done = run_bulk(client, "q", between, pattern="x-*", size=4)
    assert done.pending == 20 and r.llen(K.pending("q")) == 0


def test_pending_and_scheduled_cost_per_call_stays_bounded(client: blueque.Client) -> None:
    """Every call looks at one batch: the calls grow with the tasks, their work does not."""
    queue = client.get_queue("q")
    queue.enqueue_many(["{}"] * 2000)
    for n in range(30):
        queue.schedule("{}", time.time() + 3600 + n)
    done = client.store.run(protocol.cancel_waiting(client.keys, "q", time.time, "cancelled: x",
                                                    size=100))
    # pending: 20 batches of 100 and the call that reads the first; scheduled: 1 + 1
    assert (done.pending, done.scheduled, done.calls) == (2000, 30, 21 + 2)


# --- with a live listener, and from the command line ------------------------------------------
@pytest.mark.slow
def test_a_bulk_cancel_while_a_listener_drains_the_queue(
        redis_url: str, client: blueque.Client, redis_client: redis.Redis, tmp_path: Path,
        started: list[Daemon]) -> None:
    """Every task either ran (its function marked it, once, and it is complete) or was
    cancelled (never marked, never started): never both, never neither."""
    marker = tmp_path / "ran"
    total = 4000
    queue = client.get_queue("drain")
    ids = queue.enqueue_many([json.dumps({"marker": str(marker), "value": n})
                              for n in range(total)]).task_ids
    started.append(Daemon(listen_command(redis_url, "drain", "tests.jobs:echo", "--interval",
                                         "0.5", "--poll", "0.1", "--concurrency", "4",
                                         "--no-task-logs"),
                          tmp_path / "listener.log"))
    wait_until(lambda: queue.stats().complete >= 20, what="the listener draining the queue")
    done = cli(redis_url, "cancel", "--all", "drain", "--reason", "wrong batch", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    wait_until(lambda: queue.stats().started + queue.stats().reserved == 0
               and queue.stats().pending == 0, what="the runs in flight to end")
    datas = client.store.task_data_many(ids)
    complete = {i for i, d in zip(ids, datas, strict=True) if d["status"] == "complete"}
    cancelled = {i for i, d in zip(ids, datas, strict=True) if d.get("cancelled")}
    assert complete | cancelled == set(ids) and not complete & cancelled
    assert report["cancelled"]["pending"] == len(cancelled) > total // 2
    assert len(marker.read_text().splitlines()) == len(complete)  # each ran once
    for task_id in cancelled:
        data = datas[ids.index(task_id)]
        assert not data.get("attempts") and data["error"] == "cancelled: wrong batch"
    stats = queue.stats()
    assert (stats.complete, stats.cancelled, stats.failed) == (len(complete), len(cancelled), 0)
    assert started[0].alive()


def test_cancel_all_from_the_command_line(run: Run, client: blueque.Client) -> None:
    queue = client.get_queue("documents")
    queue.enqueue_many(["{}"] * 5, task_ids=[f"batch-7-{n}" for n in range(5)])
    queue.enqueue("{}", task_id="keep-me")
    queue.schedule("{}", time.time() + 600, task_id="batch-7-later")
    done = run("cancel", "--all", "documents", "--match", "batch-7-*",
               "--pending-only", "--reason", "bad batch")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("5 pending and 0 scheduled task(s) of documents whose id "
                                  "matches 'batch-7-*' cancelled")
    assert client.get_task("batch-7-3").error == "cancelled: bad batch"
    assert client.get_task("batch-7-later").status == "scheduled"
    done = run("cancel", "--all", "documents", "--older-than", "1h", "--json")
    assert json.loads(done.stdout)["cancelled"] == {"pending": 0, "scheduled": 0}
    for arguments, code in ((("cancel", "--all", "nowhere"), 4),
                            (("cancel", "x", "--all", "documents"), 2),
                            (("cancel",), 2),
                            (("cancel", "keep-me", "--match", "k*"), 2)):
        refused = run(*arguments)
        assert refused.returncode == code, (arguments, refused.stderr)
    assert client.get_task("keep-me").status == "pending"


@pytest.mark.slow
def test_the_bulk_cancel_benchmark_runs_and_prints_its_figures() -> None:
    """benchmarks/bulk_cancel.py in its smallest mode (its figures mean nothing here)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.bulk_cancel", "--smoke"],
                          cwd=ROOT, env=environment(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "cancelled        2,050 (2,000 pending, 50 scheduled; 0 left pending)" in done.stdout
    assert re.search(r"longest call +\d+\.\d+ ms \(server time, SLOWLOG\)", done.stdout)
    assert re.search(r"wall time +\d+\.\d+ s", done.stdout)
