"""Issue 31, points 2 and 3, end to end: real `blueque listen` processes on several nodes
(--node-name) over a real Redis. Concurrency limits per key across the fleet (never more runs
of a key at once than its limit, from the tasks' own journals; unkeyed tasks not held up; a
SIGKILLed holder's slot back after its lease; a limit kept through a Redis restart from the
AOF) and placement by resources (a gpu task never on a listener without gpu)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

import blueque
from blueque.endings import RunEnd
from blueque.errors import ConfigurationError
from blueque.keys import Keys
from blueque.metrics import queue_registry, scrape
from blueque.store import Take, Taken
from blueque.testing import RedisServer
from tests.daemons import FAST, Daemon, listen_command, wait_until
from tests.dashboard import DashboardProcess, page_text

WORK = "tests.chaos_jobs:work"
RETRY = {"max_attempts": 2, "retry_backoff": 0.1, "retry_backoff_max": 0.1}


def listener(started: list[Daemon], tmp_path: Path, url: str, node: str,
             *options: str) -> Daemon:
    daemon = Daemon(listen_command(url, "work", WORK, "--node-name", node, *FAST, *options),
                    tmp_path / f"{node}.log")
    started.append(daemon)
    return daemon


def runs(journal: Path, task_id: str) -> list[tuple[float, float | None, int]]:
    """(start, end or None, pid) of each run of the task, from its own journal."""
    found: list[tuple[float, float | None, int]] = []
    path = journal / task_id
    for line in path.read_text().splitlines() if path.exists() else []:
        event, _, pid, at = line.split()
        if event == "start":
            found.append((float(at), None, int(pid)))
        elif found and found[-1][2] == int(pid):
            found[-1] = (found[-1][0], float(at), int(pid))
    return found


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = current = 0
    for _, step in events:  # an end sorts before a start at the same instant
        current += step
        most = max(most, current)
    return most


def kill_listener_and_runs(daemon: Daemon) -> float:
    """SIGKILL a listener and every process under it at once (a node lost whole): its runs
    end now, and only its lease can tell the fleet."""
    under = psutil.Process(daemon.pid).children(recursive=True)
    os.kill(daemon.pid, signal.SIGKILL)
    for process in under:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    daemon.process.wait(10)
    return time.time()


@pytest.mark.slow
def test_a_key_never_runs_above_its_limit_across_the_fleet(
        client: blueque.Client, redis_url: str, started: list[Daemon], tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    client.set_limit("db-7", 2)
    queue = client.get_queue("work")
    keyed = [str(queue.enqueue(json.dumps({"dir": str(journal), "seconds": 0.5}),
                               concurrency_key="db-7", **RETRY)) for _ in range(40)]
    unkeyed = [str(i) for i in queue.enqueue_many(
        [json.dumps({"dir": str(journal), "seconds": 0.2})] * 20, **RETRY)]
    daemons = [listener(started, tmp_path, redis_url, f"node{n}", "--concurrency", "4")
               for n in range(3)]

    def complete(ids: list[str]) -> int:
        return sum(client.get_task(i).status == "complete" for i in ids)

    # no head-of-line blocking: every unkeyed task (enqueued behind the 40 keyed ones)
    # finishes while most keyed ones still wait for a slot of their key
    wait_until(lambda: complete(unkeyed) == 20, 60, "the unkeyed tasks complete")
    assert complete(keyed) < 30
    state = client.key_states(["db-7"])[0]
    assert state.holding <= 2 and state.waiting > 0
    # a holder lost whole (listener and its runs SIGKILLed): its slot comes back after its lease
    wait_until(lambda: client.key_states(["db-7"])[0].holders, 30, "a run holds a slot")
    holder = client.key_states(["db-7"])[0].holders[0]
    daemon = next(d for d in daemons if d.pid == int(holder.listener.rsplit("_", 1)[1]))
    killed_at = kill_listener_and_runs(daemon)
    victim_task = holder.task_id if client.get_task(holder.task_id).status == "started" else ""
    assert victim_task, "no keyed run was killed while it held its key's slot"
    wait_until(lambda: complete(keyed) == 40, 120, "every keyed task completes")
    intervals = []
    for task_id in keyed:
        for start, end, _ in runs(journal, task_id):
            intervals.append((start, end if end is not None else killed_at))
    assert len(intervals) >= 41  # the killed run, then its retry
    assert most_at_once(intervals) == 2  # used fully, never exceeded
    assert client.get_task(victim_task).attempts == 2
    assert client.key_states(["db-7"])[0].holding == 0


@pytest.mark.slow
def test_a_gpu_task_never_runs_on_a_listener_without_gpu(
        client: blueque.Client, redis_url: str, started: list[Daemon], tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    queue = client.get_queue("work")
    gpu = [str(queue.enqueue(json.dumps({"dir": str(journal), "seconds": 0.2}),
                             requires={"gpu": 1, "memory": "16G"})) for _ in range(6)]
    plain = [str(queue.enqueue(json.dumps({"dir": str(journal), "seconds": 0.2})))
             for _ in range(6)]
    listener(started, tmp_path, redis_url, "cpu", "--concurrency", "4")
    listener(started, tmp_path, redis_url, "gpu", "--concurrency", "4",
             "--resources", "gpu=1,memory=64Gi")
    wait_until(lambda: all(client.get_task(i).status == "complete" for i in gpu + plain), 60,
               "every task completes")
    assert {client.get_task(i).node.rsplit("_", 1)[0] for i in gpu} == {"gpu"}
    # one gpu: never two gpu tasks at once on it
    intervals = [(s, e) for i in gpu for s, e, _ in runs(journal, i) if e is not None]
    assert len(intervals) == 6 and most_at_once(intervals) == 1
    info = next(listener.info for listener in client.listeners() if listener.host == "gpu")
    assert json.loads(info["resources"]) == {"gpu": 1, "memory": 64 * 2**30}


def test_a_limit_survives_a_redis_restart_from_the_aof(aof_server: RedisServer) -> None:
    client = blueque.Client(aof_server.url)
    try:
        client.set_limit("db-7", 3)
        client.get_queue("work").enqueue("x", concurrency_key="db-7")
        aof_server.kill()
        aof_server.start()
        state = client.key_states(["db-7"])[0]
        assert (state.limit, state.holding) == (3, 0)
        client.set_limit("db-7", None)
        assert client.key_states(["db-7"])[0].limit is None
    finally:
        client.close()


def test_bad_controls_are_refused_before_anything_is_written(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    queue = client.get_queue("work")
    for options in ({"concurrency_key": ""}, {"concurrency_key": "a b"},
                    {"requires": {"gpu": "lots"}}, {"requires": ["gpu"]},
                    {"requires": {"gpu": -1}}):
        with pytest.raises(ConfigurationError):
            queue.enqueue("x", **options)
    with pytest.raises(ConfigurationError):
        client.set_limit("db-7", -1)
    assert redis_client.keys("*") == []


def test_the_keyed_start_benchmark_gives_its_rows() -> None:
    from benchmarks.keyed_start import KINDS, rows

    found = {row["label"]: row["value"] for row in rows(5)}
    for kind in KINDS:
        for what in ("start", "ending"):
            assert found[f"{kind} {what}: Redis commands"] > 0
            assert found[f"{kind} {what}: round trips"] >= 1
    # a keyed start costs no round trip more than an unkeyed one: its work is in take.lua
    assert found["keyed start: round trips"] == found["unkeyed start: round trips"]


def a_live_listener(redis_client: redis.Redis, queue: str, listener: str,
                    resources: str | None) -> None:
    """A listener of ``queue`` as the protocol shows one (its set, lease and info hash)."""
    keys = Keys()
    redis_client.sadd(keys.listeners(queue), listener)
    seconds, _ = redis_client.time()
    redis_client.zadd(keys.leases(queue), {listener: (seconds + 60) * 1000})
    info = {"pid": "4242", "host": "node", "concurrency": "4"}
    if resources is not None:
        info["resources"] = resources
    redis_client.hset(keys.listener_info(listener), mapping=info)


def test_a_task_no_live_listener_fits_is_said_at_enqueue_and_in_status(
        client: blueque.Client, redis_client: redis.Redis, run_json: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    queue = client.get_queue("work")
    with caplog.at_level("WARNING", logger="blueque.keyed"):
        alone = queue.enqueue("x", requires={"gpu": 1})
    assert "no live listener serves its queue" in caplog.text
    a_live_listener(redis_client, "work", "cpu_1", None)
    a_live_listener(redis_client, "work", "gpu_2", '{"gpu":1}')
    caplog.clear()
    with caplog.at_level("WARNING", logger="blueque.keyed"):
        queue.enqueue("y", requires={"gpu": 1})
        queue.enqueue("z")
    assert caplog.text == ""  # gpu_2 could run it: nothing to say
    with caplog.at_level("WARNING", logger="blueque.keyed"):
        big = queue.enqueue("w", requires={"gpu": 4, "memory": "1Ti"})
    assert "they offer: nothing; gpu=1" in caplog.text and big in caplog.text
    client.set_limit("db-7", 2)
    status = run_json("status")
    assert [t["task"] for t in status["unplaceable"]["work"]] == [big]
    assert alone not in str(status["unplaceable"])  # gpu_2 fits it now
    assert status["keys"] == [{"key": "db-7", "limit": 2, "holding": 0, "waiting": 0}]


def test_show_limit_and_metrics_give_each_keys_holders_and_waiters(
        client: blueque.Client, run: Any, run_json: Any) -> None:
    client.set_limit("db-7", 1)
    queue = client.get_queue("work")
    first, second = (str(queue.enqueue(p, concurrency_key="db-7")) for p in ("a", "b"))
    store = client.store
    assert store.take("node_1", Take(["work"])) == Taken("work", first)
    assert store.take("node_1", Take(["work"])) is None  # the key is full: second waits
    shown = run_json("show", second)["key"]
    assert (shown["limit"], shown["holding"], shown["waiting"]) == (1, 1, 1)
    assert shown["holders"][0]["task_id"] == first and shown["waiters"] == [second]
    assert "key db-7: limit 1, 1 holding" in run("show", first).stdout
    listed = run_json("limit")
    assert [(k["key"], k["holding"], k["waiting"]) for k in listed] == [("db-7", 1, 1)]
    text = scrape(queue_registry(store)).decode()
    assert 'blueque_key_limit{key="db-7"} 1.0' in text
    assert 'blueque_key_holding{key="db-7"} 1.0' in text
    assert 'blueque_key_waiting{key="db-7"} 1.0' in text
    # raising the limit wakes the waiter at once: back at the head of its queue
    assert run("limit", "db-7", "2").returncode == 0
    assert client.redis.lrange(Keys().pending("work"), 0, -1) == [second]
    done = run("limit", "db-7", "3", "--clear")
    assert done.returncode == 2 and "--clear goes with a KEY and no N" in done.stderr
    assert run("limit", "db-7", "-1").returncode == 2


def test_the_dashboard_shows_each_keys_slots_and_the_tasks_nobody_can_run(
        client: blueque.Client, redis_url: str, tmp_path: Path) -> None:
    client.set_limit("db-7", 1)
    queue = client.get_queue("work")
    held = str(queue.enqueue("a", concurrency_key="db-7"))
    queue.enqueue("b", concurrency_key="db-7")
    client.store.take("node_1", Take(["work"]))
    client.store.take("node_1", Take(["work"]))  # the key is full: b waits
    big = str(queue.enqueue("c", requires={"gpu": 4}))
    dashboard = DashboardProcess(redis_url, tmp_path / "dashboard.log")
    try:
        with urllib.request.urlopen(dashboard.url + "/", timeout=10) as response:
            page = response.read().decode()
    finally:
        dashboard.close()
    row = page[page.index('data-key="db-7"'):]
    row = page_text(row[: row.index("</tr>")])
    assert "db-7" in row and held in row and "node_1" in row
    assert [cell for cell in row.split() if cell.isdigit()] == ["1", "1", "1"]
    assert f"task {big} requires gpu=4, but no live listener serves its queue" in page_text(page)


def test_a_reclaimed_run_takes_its_slot_back_only_when_the_key_has_one_free(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    """A node cut off longer than its lease: recover released its run's slot, another run
    took it; the cut run may take its task back (5.12b) only once the key has room."""
    store, keys = client.store, Keys()
    client.set_limit("db-7", 1)
    queue = client.get_queue("q")
    cut = str(queue.enqueue("a", concurrency_key="db-7", max_attempts=3))
    assert store.take("cut_1", Take(["q"])) == Taken("q", cut)
    store.begin_run("q", "cut_1", cut, store.now(), 4242, None, "node-a", "{}", 60)
    redis_client.sadd(keys.listeners("q"), "cut_1")
    assert store.recover("q", "cut_1", [(cut, "1", "retry", store.now() + 60, "cut off")],
                         store.now(), mode="host") != [-1]
    assert client.key_states(["db-7"])[0].holding == 0  # released with the run's verdict
    other = str(queue.enqueue("b", concurrency_key="db-7"))
    assert store.take("other_2", Take(["q"])) == Taken("q", other)
    store.begin_run("q", "other_2", other, store.now(), 77, None, "node-b", "{}", 60)
    assert store.reclaim("q", cut, "cut_1", 1, 4242, None, store.now()) == (
        "no", "its concurrency key db-7 is full")
    store.finish(RunEnd("q", other, "other_2", 77, 1, "complete", "", store.now()))
    assert store.reclaim("q", cut, "cut_1", 1, 4242, None, store.now()) == ("ok", "")
    (holder,) = client.key_states(["db-7"])[0].holders
    assert (holder.task_id, holder.listener, holder.attempt) == (cut, "cut_1", 1)
    store.finish(RunEnd("q", cut, "cut_1", 4242, 1, "complete", "", store.now()))
    assert client.key_states(["db-7"])[0].holding == 0


def test_every_client_enqueues_keys_and_requires_and_queue_defaults(
        contract_client: blueque.Client) -> None:
    r, keys = contract_client.redis, Keys()
    queue = contract_client.get_queue("work")
    one = queue.enqueue("a", concurrency_key="db-7", requires={"gpu": 1, "memory": "16Gi"})
    many = queue.enqueue_many(["b", "c"], concurrency_key="db-8").task_ids
    later = queue.schedule("d", delay=3600, requires={"memory": "1.5K"})
    assert r.hmget(keys.task(one), ["concurrency_key", "requires"]) == [
        "db-7", '{"gpu":1,"memory":17179869184}']
    assert [r.hget(keys.task(i), "concurrency_key") for i in many] == ["db-8", "db-8"]
    assert r.hget(keys.task(later), "requires") == '{"memory":1500}'
    queue.configure(concurrency_key="db-9", requires={"gpu": 2})
    assert r.hmget(keys.queue_config("work"), ["concurrency_key", "requires"]) == [
        "db-9", '{"gpu":2}']
    plain = queue.enqueue("e")
    assert r.hkeys(keys.task(plain)) == ["status", "queue", "parameters", "created", "updated"]


def test_a_queues_default_key_and_requires_apply_at_take(client: blueque.Client) -> None:
    queue = client.get_queue("work")
    queue.configure(concurrency_key="db-9", requires={"gpu": 1})
    client.set_limit("db-9", 1)
    first, second = str(queue.enqueue("a")), str(queue.enqueue("b"))
    own = str(queue.enqueue("c", concurrency_key="other", requires={"gpu": 0}))
    store = client.store
    assert store.take("cpu_1", Take(["work"])) == Taken("work", own)  # needs no gpu
    assert store.take("gpu_2", Take(["work"], resources='{"gpu":1}')) == Taken("work", first)
    assert store.take("gpu_2", Take(["work"], resources='{"gpu":1}')) is None  # db-9 is full
    assert client.redis.hmget(Keys().task(first), ["concurrency_key", "requires"]) == [
        "db-9", '{"gpu":1}']  # written at take: its release and its listener read them
    assert client.key_states(["db-9"])[0].waiters == (second,)


def test_the_command_line_enqueues_and_configures_keys_and_requires(
        client: blueque.Client, run: Any, run_json: Any) -> None:
    task_id = run_json("enqueue", "work", "{}", "--concurrency-key", "db-7", "--requires",
                       "gpu=1,memory=16G")["task_id"]
    assert client.redis.hmget(Keys().task(task_id), ["concurrency_key", "requires"]) == [
        "db-7", '{"gpu":1,"memory":16000000000}']
    config = run_json("configure", "work", "--concurrency-key", "db-8", "--requires",
                      "gpu=2")["config"]
    assert (config["concurrency_key"], config["requires"]) == ("db-8", {"gpu": 2})
    config = run_json("configure", "work", "--concurrency-key", "none", "--requires",
                      "none")["config"]
    assert "concurrency_key" not in config and "requires" not in config
    done = run("enqueue", "work", "{}", "--requires", "gpu=lots")
    assert done.returncode == 2 and "is not an amount" in done.stderr
    done = run("listen", "work", "tests.jobs:echo", "--resources", "gpu")
    assert done.returncode == 2 and "is not NAME=AMOUNT" in done.stderr

