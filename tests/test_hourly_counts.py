"""The hourly outcome counters (blueque_finished_per_hour_[queue]_[hour]) and the listeners' run
counters (blueque_listener_counts_[queue]_[listener id], blueque_listeners_seen_[queue]) that
the dashboard's 24-hour and 7-day charts and its listener history read (PROTOCOL.md 5.6):
every script that counts an ending counts it per hour too, on Redis and on fakeredis."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path

import redis

import blueque
from blueque import keys as k
from blueque.endings import RunEnd
from blueque.listener import Listener
from blueque.store import NodeRenewal, load_script
from blueque.web.history import listener_history
from tests.daemons import Daemon, daemons, listen_command, task_processes, wait_until
from tests.test_metrics import run_to_end

KEYS = k.Keys()


def per_hour(client: blueque.Client, queue: str) -> dict[str, int]:
    """This hour's and the last hour's counts together (an hour may turn during a test)."""
    hour = int(client.store.now() // 3600 * 3600)
    both = client.store.outcomes_per_hour_many([queue], [hour - 3600, hour])[0]
    return {name: both[0].get(name, 0) + both[1].get(name, 0)
            for name in set(both[0]) | set(both[1])}


def test_every_counted_ending_is_counted_per_hour(any_client: blueque.Client) -> None:
    client = any_client
    for outcome in ("complete", "complete", "failed", "retry"):  # finish.lua
        run_to_end(client, "q", outcome)
    queue = client.get_queue("q")
    client.cancel_task(queue.enqueue("{}"))  # cancel.lua
    queue.enqueue_many(["{}"] * 3)
    queue.schedule("{}", time.time() + 600)
    done = queue.cancel_waiting()  # cancel_pending.lua, cancel_scheduled.lua
    assert (done.pending, done.scheduled) == (3, 2)  # the retried one waits there too
    broken = queue.enqueue("{}")  # stamp.lua: a task whose hash is gone is recorded failed
    client.store.redis.hdel(client.store.keys.task(broken), "status", "queue")
    client.store.redis.hset(client.store.keys.task(broken), "status", "weird")
    client.get_listener("q").reserve()
    task_id = queue.enqueue("{}")  # recover.lua: its listener died
    listener = client.get_listener("q")
    task = listener.reserve()
    assert task is not None and task.id == task_id
    client.get_processor(task).start(999_999)
    client.store.recover("q", listener.id, [(task_id, str(task.attempts), "failed", None,
                                              "listener died")], time.time(), mode="host")
    parent = queue.enqueue("{}")  # tell.lua: waiting tasks a parent's ending ends
    waits = queue.enqueue("{}", after=parent)
    queue.enqueue("{}", after=waits)
    client.cancel_task(waits)  # a waiting task cancelled, its own dependent failed with it
    ever = client.store.outcome_counts("q")
    assert ever == {"complete": 2, "failed": 4, "retry": 1, "cancelled": 7}
    # "last hour" (per minute) and "24 h" (per hour) of the dashboard agree
    assert per_hour(client, "q") == ever
    minutes = client.store.outcomes_per_minute_many(["q"], [
        int(client.store.now() // 60 * 60) - 60 * n for n in range(60)])[0]
    assert {name: sum(m.get(name, 0) for m in minutes) for name in ever} == ever


def test_every_script_that_counts_an_outcome_uses_the_one_counting_library() -> None:
    """The outcome counters (per minute, ever, per hour) are written in one place,
    lua/lib/counts.lua (``-- uses: counts``): tell.lua counted by hand and missed the hour,
    so the dashboard's "last hour" and "24 h" disagreed. A script that is given a minute's
    counter is given all three and counts through the library; no script increments a
    counter key itself."""
    lua = Path(blueque.__file__).parent / "lua"
    library = (lua / "lib" / "counts.lua").read_text()
    assert "'HINCRBY', minute_key" in library and "'HINCRBY', hour_key" in library
    counting = []
    for path in sorted(lua.glob("*.lua")):
        body = path.read_text()
        header = "\n".join(line for line in body.splitlines() if line.startswith("--"))
        assembled = load_script(path.stem)
        if "count_outcome(" not in assembled.replace(library, ""):
            assert "outcomes this minute" not in header, path.name  # given it, not counting
            continue
        counting.append(path.name)
        uses = re.search(r"^-- uses: (.*)$", body, re.MULTILINE)
        assert uses and "counts" in uses[1].split(", "), path.name
        assert library in assembled, path.name
        for words in ("outcomes this minute", "outcomes ever", "outcomes this hour"):
            assert words in header, (path.name, words)
        counters = re.findall(r"^-- KEYS\[(\d+)\]\s+outcomes (?:this minute|ever|this hour)",
                              header, re.MULTILINE)
        for index in counters:  # written through count_outcome only
            assert not re.search(rf"'(HINCRBY|EXPIRE|HSET|DEL)', KEYS\[{index}\]", body), (
                path.name, index)
    assert set(counting) == {"finish.lua", "recover.lua", "cancel.lua", "cancel_pending.lua",
                             "cancel_scheduled.lua", "stamp.lua", "take.lua", "tell.lua"}


def test_hour_and_listener_counters_expire_and_name_the_listener(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    task_id = run_to_end(client, "q", "complete")
    run_to_end(client, "q", "failed")
    now = client.store.now()
    hour = client.store.keys.finished_per_hour("q", str(int(now // 3600 * 3600)))
    if not redis_client.exists(hour):  # the hour turned between the finish and this read
        hour = client.store.keys.finished_per_hour("q", str(int(now // 3600 * 3600) - 3600))
    assert k.FINISHED_HOUR_TTL - 60 < redis_client.ttl(hour) <= k.FINISHED_HOUR_TTL
    ran_by = client.get_task(task_id).data["node"]
    counts = client.store.keys.listener_counts("q", ran_by)
    assert redis_client.hgetall(counts) == {"complete": "1", "failed": "1"}
    assert k.LISTENER_COUNTS_TTL - 60 < redis_client.ttl(counts) <= k.LISTENER_COUNTS_TTL
    seen = client.store.keys.listeners_seen("q")
    redis_client.zadd(seen, {"long-gone_1": now - k.LISTENER_COUNTS_TTL - 10})
    run_to_end(client, "q", "complete")  # the same listener again: the set does not grow
    # readers skip who was last seen over 7 days ago; the set drops them when it grows
    assert [row["id"] for row in listener_history(client.store, ["q"], set())] == [ran_by]
    task_id = client.get_queue("q").enqueue("{}")
    task = Listener("q", client.store, "newcomer_2").reserve()
    assert task is not None and task.id == task_id
    processor = client.get_processor(task)
    processor.start(4343)
    processor.complete("done")
    assert sorted(name for name, _ in client.store.listeners_seen_many(["q"], 10)[0]) == sorted(
        [ran_by, "newcomer_2"])
    assert client.store.listener_counts_many([("q", ran_by)]) == [
        {"complete": 2, "failed": 1}]


def _finish_renewing(client: blueque.Client, listener: Listener, now: float) -> str:
    """One run of ``listener`` completed as its daemon records it: finish.lua told that the
    listener's renewals keep its listeners-seen entry and its counts' expiry."""
    task_id = client.get_queue("q").enqueue("{}")
    task = listener.reserve()
    assert task is not None and task.id == task_id
    client.get_processor(task).start(4242)
    client.store.finish(RunEnd("q", task_id, listener.id, 4242, 1, "complete", "done", now),
                        renews=True)
    return task_id


def test_a_renewing_listener_writes_its_record_at_its_first_ending_then_at_its_renewals(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    """Three commands fewer per drained task (issue 20): the listener's first ending puts it
    in listeners-seen with its counts' expiry; the next endings only count, and the renewal
    writes the time of its last ending and the expiries again (PROTOCOL.md 6, step 2)."""
    listener = Listener("q", client.store, "renewing_7")
    seen = KEYS.listeners_seen("q")
    counts = KEYS.listener_counts("q", listener.id)
    first = client.store.now()
    _finish_renewing(client, listener, first)
    assert redis_client.zscore(seen, listener.id) == first
    assert k.LISTENER_COUNTS_TTL - 60 < redis_client.ttl(counts) <= k.LISTENER_COUNTS_TTL
    redis_client.expire(counts, 100)
    redis_client.expire(seen, 100)
    last = first + 5
    _finish_renewing(client, listener, last)
    assert redis_client.hget(counts, "complete") == "2"  # counted at once
    assert redis_client.zscore(seen, listener.id) == first  # left to the renewal
    assert redis_client.ttl(counts) <= 100 and redis_client.ttl(seen) <= 100
    client.store.lease("q", listener.id, 2000, "register")
    renewal = NodeRenewal(listener.id, "node-1", ["q"], 2000, {"busy": "0"}, 4, {}, 60, [],
                          {"q": last})
    reply = client.store.renew_node(renewal)
    assert reply.leases["q"] > 0 and reply.reserved == {"q": []}  # the replies stay in place
    assert redis_client.zscore(seen, listener.id) == last
    assert k.LISTENER_COUNTS_TTL - 60 < redis_client.ttl(counts) <= k.LISTENER_COUNTS_TTL
    assert k.LISTENER_COUNTS_TTL - 60 < redis_client.ttl(seen) <= k.LISTENER_COUNTS_TTL
    client.store.renew_node(replace(renewal, seen={"q": first}))  # never back in time
    assert redis_client.zscore(seen, listener.id) == last


def test_a_listener_daemon_keeps_the_time_of_its_last_ending(
        client: blueque.Client, redis_url: str, redis_client: redis.Redis,
        tmp_path: Path) -> None:
    """End to end: the listener's renewal, and its leaving, write when its last run ended."""
    queue = client.get_queue("q")
    with daemons(tmp_path) as started:
        daemon = Daemon(listen_command(redis_url, "q", "tests.jobs:echo", "--interval", "4",
                                       "--poll", "0.1"), tmp_path / "daemon.log")
        started.append(daemon)
        ids = [queue.enqueue(json.dumps({"n": n})) for n in range(5)]
        tasks = [client.get_task(task_id).wait(20) for task_id in ids]
        assert [task.status for task in tasks] == ["complete"] * 5
        listener = tasks[0].node or ""
        last = max(task.finished_at or 0.0 for task in tasks)
        seen = KEYS.listeners_seen("q")
        wait_until(lambda: redis_client.zscore(seen, listener) == last,
                   what="the last ending's time written by a renewal")
        assert redis_client.hgetall(KEYS.listener_counts("q", listener)) == {"complete": "5"}
        more = queue.enqueue(json.dumps({"n": 6}))
        ended = client.get_task(more).wait(20).finished_at
        # its run's process gone too (else its leaving renews, for the runs it leaves to
        # adoption); the idle one made ahead of the next task is no run
        wait_until(lambda: not task_processes("q", busy=True), what="the task process gone")
        assert daemon.stop() == 0  # at once, between two renewals: its leaving writes it
        assert redis_client.zscore(seen, listener) == ended
