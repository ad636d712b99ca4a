"""Pausing a queue (issue 31.1): the operations on every client, the scripts that take a task
(reserve.lua, take.lua) refusing a paused queue in the same step, and, end to end, real
listeners on two nodes under load: paused, none of the queue's tasks starts while the running
ones finish, through a listener restart and a Redis restart from its append-only file; resumed,
the rest run, each once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import blueque
from blueque.keys import Keys
from blueque.listener import Listener
from blueque.store import Take
from tests.daemons import Daemon, listen_command, wait_until
from tests.readme import DOCS, Shell, commands, markdown_blocks

KEYS = Keys()
FAST = ("--interval", "0.5", "--poll", "0.2")


def test_pause_and_resume_on_every_client(contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue("work")
    queue.enqueue("{}")
    assert queue.stats().paused is False
    queue.pause("db migration")
    assert queue.stats().paused is True
    queue.enqueue("{}")  # enqueues go on while paused
    assert queue.stats().pending == 2 and queue.stats().paused
    assert queue.resume() is True
    assert queue.stats().paused is False
    assert queue.resume() is False  # it was not paused
    with pytest.raises(blueque.errors.WrongType):
        queue.pause(42)  # type: ignore[arg-type]
    with pytest.raises(blueque.errors.ConfigurationError, match="may not"):
        contract_client.get_queue("a:b").pause()


def test_a_paused_queue_gives_no_task_to_any_way_of_taking_one(
        any_client: blueque.Client) -> None:
    store = any_client.store
    queue = any_client.get_queue("work")
    first, second = queue.enqueue("1"), any_client.get_queue("other").enqueue("2")
    queue.pause()
    assert store.move_pending("work", "l_1", block=None) is None
    assert Listener("work", store, identity="l_1").reserve() is None
    # take.lua (the next task taken with an ending) skips it for the next queue
    reply = store._run("take", *_take(store, ["work", "other"]))
    assert reply[:2] == ["other", second]
    assert store.redis.lrange(KEYS.pending("work"), 0, -1) == [first]
    assert queue.resume()
    assert store.move_pending("work", "l_1", block=None) == first


def _take(store: object, queues: list[str]) -> tuple[list[str], list[object]]:
    call = store._take_call("l_1", 1.0e9, Take(queues))  # type: ignore[attr-defined]
    return list(call.keys), list(call.args)


def test_listen_waits_on_a_paused_queue_without_taking(client: blueque.Client) -> None:
    queue = client.get_queue("work")
    task_id = queue.enqueue("1")
    queue.pause()
    listener = Listener("work", client.store, identity="l_2")
    assert listener.listen(timeout=0.3) is None
    queue.resume()
    task = listener.listen(timeout=5)
    assert task is not None and task.id == task_id


def test_the_cli_pauses_shows_and_resumes(run, run_json) -> None:  # type: ignore[no-untyped-def]
    assert run("enqueue", "work", "{}").returncode == 0
    done = run("pause", "work", "--reason", "db migration")
    assert done.returncode == 0 and "queue work paused" in done.stdout, done.stderr
    status = run("status")
    assert "work (PAUSED)" in status.stdout and ": db migration" in status.stdout
    queues = run_json("status")["queues"]
    assert queues[0]["paused"] is True and queues[0]["pause"]["reason"] == "db migration"
    assert run("pause", "wrok").returncode == 4  # a typo: not a new paused queue
    assert run_json("resume", "work") == {"queue": "work", "paused": False,
                                          "was_paused": True}
    assert "was not paused" in run("resume", "work").stdout
    assert run_json("status")["queues"][0]["paused"] is False


def starts(marker: Path) -> list[str]:
    """The task ids the hold job started, in order (one line "start [id] [attempt] [pid]")."""
    text = marker.read_text() if marker.exists() else ""
    return [line.split()[1] for line in text.splitlines() if line.startswith("start ")]


@pytest.mark.slow
def test_a_pause_under_load_through_listener_and_redis_restarts(  # type: ignore[no-untyped-def]
        aof_server, started, tmp_path) -> None:
    url = aof_server.url
    client = blueque.Client(url)
    queue = client.get_queue("work")
    marker, release = tmp_path / "marker", tmp_path / "release"
    params = json.dumps({"marker": str(marker), "release": str(release)})
    ids = [str(queue.enqueue(params)) for _ in range(12)]

    def listen(node: str) -> Daemon:
        daemon = Daemon(listen_command(url, "work", "tests.jobs:hold", *FAST,
                                       "--concurrency", "2", "--node-name", node),
                        tmp_path / f"{node}{len(started)}.log")
        started.append(daemon)
        return daemon

    first, _ = listen("node-a"), listen("node-b")
    wait_until(lambda: len(starts(marker)) == 4, what="four tasks running on two nodes")
    queue.pause("under load")
    waiting = set(client.store.redis.lrange(KEYS.pending("work"), 0, -1))
    assert len(waiting) == 8 and queue.stats().paused

    def looked_with_free_slots() -> bool:
        """Every listener has renewed since its slots freed (busy 0 in its info hash): it
        has been through steps where it would have taken a task."""
        infos = [client.store.listener_info(i) for i in client.store.listener_ids("work")]
        return len(infos) == 2 and all(info.get("busy") == "0" for info in infos)

    release.touch()  # the four running ones finish; nothing else may start
    wait_until(lambda: queue.stats().complete >= 4, what="the running tasks finished")
    late = str(queue.enqueue(params))  # published: every listener wakes, and takes none
    wait_until(looked_with_free_slots, what="both listeners idle while paused")
    assert not waiting & set(starts(marker)) and late not in starts(marker)
    assert queue.stats().pending == 9

    first.stop()  # a listener restart: the pause is in Redis, not in the listener
    listen("node-a")
    wait_until(looked_with_free_slots, what="the new listener idle while paused")
    aof_server.kill()  # a Redis restart from its append-only file
    aof_server.start()
    assert queue.stats().paused and queue.stats().pending == 9
    seconds, micros = client.store.redis.time()
    back = seconds * 1000 + micros // 1000 + 1000  # past any lease written before (2 x 0.5 s)
    wait_until(lambda: all(score > back for _, score in client.store.redis.zrange(
        KEYS.leases("work"), 0, -1, withscores=True)), what="both leases renewed since")
    wait_until(looked_with_free_slots, what="the listeners idle after the restart")
    assert len(starts(marker)) == 4

    assert queue.resume()
    for task_id in [*ids, late]:
        assert client.get_task(task_id).wait(30).status == "complete"
    assert sorted(starts(marker)) == sorted([*ids, late])  # each once


def docs_block(number: int) -> str:
    return next(b.text for b in markdown_blocks(DOCS / "how-to" / "pause.md")
                if b.key == ("Pausing a queue", number))


@pytest.mark.slow
def test_the_docs_pause_lines_run_as_written(client: blueque.Client, redis_url: str,
                                             tmp_path: Path) -> None:
    client.get_queue("reports").enqueue("{}")  # a queue Redis knows
    shell = Shell(tmp_path, tmp_path, redis_url)
    try:
        pause, status, resume = [shell.run(line) for line in commands(docs_block(1))]
    finally:
        shell.close()
    for done in (pause, status, resume):
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "reports (PAUSED)" in status.stdout and ": database migration" in status.stdout
    assert "queue reports resumed" in resume.stdout
    assert not client.get_queue("reports").stats().paused


def test_the_docs_pause_example_runs_as_written(client: blueque.Client, redis_url: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLUEQUE_URL", redis_url)
    names: dict[str, object] = {}
    exec(compile(docs_block(2), "pause.md", "exec"), names)  # the page's own code
    stats = client.get_queue("reports").stats()
    assert (stats.paused, stats.pending) == (False, 1)
    assert client.get_task(str(names["task_id"])).status == "pending"


@pytest.mark.slow
def test_a_listener_waits_on_a_paused_queue_without_spinning(  # type: ignore[no-untyped-def]
        client, redis_client, redis_url, started, tmp_path) -> None:
    """A paused queue with pending tasks is skipped like an empty one: the listener asks at
    its poll and when woken, not in a loop. Over four of its lease renewals (2 s) it sends a
    few dozen scripts, where a loop that spins on the queue would send thousands."""
    queue = client.get_queue("work")
    queue.pause()
    for _ in range(3):
        queue.enqueue("{}")
    daemon = Daemon(listen_command(redis_url, "work", "tests.jobs:echo", *FAST),
                    tmp_path / "listener.log")
    started.append(daemon)
    wait_until(lambda: redis_client.zcard(KEYS.leases("work")) == 1, what="registered")

    def scripts() -> int:
        stats = redis_client.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
                   for name in ("evalsha", "eval"))

    def lease() -> float:
        return float(redis_client.zrange(KEYS.leases("work"), 0, 0, withscores=True)[0][1])

    before, renewals, seen = scripts(), 0, lease()

    def renewed_four_times() -> bool:
        nonlocal renewals, seen
        now = lease()
        if now != seen:
            renewals, seen = renewals + 1, now
        return renewals >= 4

    wait_until(renewed_four_times, what="four lease renewals")
    sent = scripts() - before
    assert sent < 200, f"{sent} scripts in four renewals: the listener spins"
    assert queue.stats().pending == 3 and daemon.alive()
