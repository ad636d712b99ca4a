"""Taking ahead (PROTOCOL.md 6.2, 6.7): the round trip that records an ending also takes the
slot's next task (take.lua). In-process against the store (the private redis-server and
fakeredis): what take.lua moves and stamps, and that a refused finish does not lose it. End
to end with real listeners: a warm process's next task is stamped in its last one's round
trip, and each crash window of taking ahead leaves every task run once."""

from __future__ import annotations

import itertools
import json
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

import blueque
from blueque.daemon.membership import Membership
from blueque.daemon.running import Running, record_tail
from blueque.endings import RunEnd
from blueque.errors import StaleAttempt
from blueque.listener import Listener
from blueque.policy import Policy
from blueque.store import Take
from tests.daemons import Daemon, gone, lines, wait_until
from tests.test_reporting import outcomes
from tests.test_warm import enqueue, node_runs, ran_by, start

LISTENER = "ahead.example_1"
NODE = "node-identity"
PID = 4242


def stamped(client: blueque.Client, queue: str = "work") -> tuple[str, int]:
    """A task reserved by us and started for PID: the run whose ending takes ahead."""
    task_id = client.get_queue(queue).enqueue("{}")
    task = Listener(queue, client.store, LISTENER).reserve()
    assert task is not None and task.id == task_id
    client.get_processor(task).start(PID)
    return task_id, int(client.store.task_data(task_id)["attempts"])


def ending(task_id: str, attempt: int, queue: str = "work") -> RunEnd:
    return RunEnd(queue, task_id, LISTENER, PID, attempt, "complete", "done", 1_700_000_000.0)


def test_an_ending_takes_the_next_task_of_the_first_queue_that_has_one(
        any_client: blueque.Client) -> None:
    """Without a pid the next id is only moved into our reserved list (a process per task:
    it is stamped once a process is made for it); queues are tried in the order given."""
    store = any_client.store
    task_id, attempt = stamped(any_client)
    waiting = any_client.get_queue("other").enqueue("{}")
    status, taken = store.finish_and_take(ending(task_id, attempt), (NODE, PID),
                                          Take(["work", "other"]))
    assert status == "complete" and taken is not None
    assert (taken.queue, taken.task_id, taken.reservation) == ("other", waiting, None)
    assert store.reserved_ids("other", LISTENER) == [waiting]
    assert store.task_data(waiting)["status"] == "pending"  # moved, not stamped
    assert store.reserved_ids("work", LISTENER) == []


def test_an_ending_stamps_the_next_task_for_a_warm_process_and_records_its_run(
        any_client: blueque.Client) -> None:
    """With a pid: stamped started by that process (attempt 1), its run on the node written
    as Running.record writes it, in the round trip of the last ending."""
    store = any_client.store
    task_id, attempt = stamped(any_client)
    following = any_client.get_queue("work").enqueue("{}")
    tail = record_tail(123.25, LISTENER, 77, 55.5)
    status, taken = store.finish_and_take(ending(task_id, attempt), (NODE, PID),
                                          Take(["work"], PID, 123.25, NODE, tail, 3600))
    assert status == "complete" and taken is not None and taken.reservation is not None
    assert taken.task_id == following and taken.reservation.runnable
    assert taken.reservation.attempt == 1
    data = store.task_data(following)
    assert (data["status"], data["pid"], data["node"], data["attempts"]) == (
        "started", str(PID), LISTENER, "1")
    assert data["started_at"] == store.task_data(task_id)["updated"]  # one script run (its end)
    assert taken.reservation.fields == data
    run = Running(following, "work", 1, 0.0, 0.0, 1.0, Policy(), PID, created=123.25)
    assert json.loads(store.node_run(NODE, PID) or "") == json.loads(
        run.record(LISTENER, 77, 55.5))
    assert store.redis.ttl(store.keys.node_runs(NODE)) > 0


def test_a_refused_finish_does_not_lose_what_its_round_trip_took(
        any_client: blueque.Client) -> None:
    """A StaleAttempt comes back in place of the status, beside what take.lua took."""
    store = any_client.store
    task_id, attempt = stamped(any_client)
    following = any_client.get_queue("work").enqueue("{}")
    status, taken = store.finish_and_take(ending(task_id, attempt + 1), (NODE, PID),
                                          Take(["work"]))
    assert isinstance(status, StaleAttempt)
    assert taken is not None and taken.task_id == following
    assert store.task_data(task_id)["status"] == "started"  # the refused ending wrote nothing


def test_an_empty_queue_takes_nothing(any_client: blueque.Client) -> None:
    store = any_client.store
    task_id, attempt = stamped(any_client)
    assert store.finish_and_take(ending(task_id, attempt), (NODE, PID),
                                 Take(["work"], PID, None, NODE, record_tail(None, LISTENER, 1,
                                                                             None), 60)
                                 ) == ("complete", None)
    assert store.node_run(NODE, PID) is None  # the ended run's record went, none came


def test_heal_puts_back_a_task_stamped_for_a_process_of_ours_that_runs_another(
        any_client: blueque.Client) -> None:
    """A take whose reply was lost: the task is started by us for PID, which runs none of
    it. It never ran: put back at the head of the line, not failed as a lost run."""
    store = any_client.store
    task_id, _ = stamped(any_client)
    membership = Membership(store, LISTENER, NODE, "ahead.example", {"work": 1}, 10.0,
                            lambda: 0.0)
    membership.heal(set(), processes={PID})
    data = store.task_data(task_id)
    assert data["status"] == "pending" and "error" not in data
    assert store.reserved_ids("work", LISTENER) == []
    assert task_id in store.redis.lrange(store.keys.pending("work"), 0, -1)


# --- end to end ----------------------------------------------------------------------------
@pytest.mark.slow
def test_a_warm_process_gets_its_next_task_in_the_round_trip_of_its_last_ending(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """Five tasks waiting, one warm process: each next task was stamped by the script run
    that recorded the one before (its started_at is that ending's time, its updated), every task
    ran once, in the same process, at attempt 1."""
    marker = tmp_path / "marker"
    ids = [enqueue(client, marker=str(marker), value=n) for n in range(5)]
    start(started, tmp_path, redis_url, "--reuse", "10")
    tasks = [client.get_task(task_id).wait(30) for task_id in ids]
    assert [t.status for t in tasks] == ["complete"] * 5, [t.data for t in tasks]
    assert len(set(ran_by(marker))) == 1 and len(ran_by(marker)) == 5
    assert all(t.attempts == 1 for t in tasks)
    for before, after in itertools.pairwise(tasks):
        assert after.data["started_at"] == before.data["updated"]  # when it ended
    assert node_runs(redis_client) == {}
    assert outcomes(redis_client, "complete") == 5


def killed_after_take(started: list[Daemon], tmp_path: Path, redis_url: str,
                      client: blueque.Client, marker: Path, *options: str
                      ) -> tuple[Daemon, list[str]]:
    """A listener SIGKILLed right after an ending's round trip took the next task ahead."""
    daemon = start(started, tmp_path, redis_url, *options, failpoints="listener-after-take")
    ids = [enqueue(client, marker=str(marker), value=n) for n in range(2)]
    daemon.process.wait(30)
    assert daemon.process.returncode == -signal.SIGKILL, daemon.log()
    return daemon, ids


@pytest.mark.slow
def test_a_listener_killed_with_an_id_taken_ahead_for_a_fork(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """A process per task: the id taken ahead waits pending in the dead listener's reserved
    list; the next listener puts it back and runs it, once, at attempt 1."""
    marker = tmp_path / "marker"
    _, (first, second) = killed_after_take(started, tmp_path, redis_url, client, marker)
    assert client.get_task(first).status == "complete"
    assert client.store.task_data(second)["status"] == "pending"
    assert client.store.reserved_ids("work", daemon_id(redis_client)) == [second]
    start(started, tmp_path, redis_url)
    task = client.get_task(second).wait(30)
    assert task.status == "complete" and task.attempts == 1 and task.result == "1"
    assert len(lines(marker)) == 2
    assert outcomes(redis_client, "complete") == 2 and outcomes(redis_client, "failed") == 0


def listener_ids(redis_client: Any) -> list[str]:
    """The listeners that registered (their info hashes)."""
    return [key.removeprefix("blueque_listener_")
            for key in redis_client.keys("blueque_listener_*")
            if not key.startswith(("blueque_listener_counts_", "blueque_listeners_"))]


def daemon_id(redis_client: Any) -> str:
    """The one listener that registered."""
    ids = listener_ids(redis_client)
    assert len(ids) == 1, ids
    return ids[0]


@pytest.mark.slow
def test_a_listener_killed_after_taking_a_task_for_its_warm_process(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """The warm process, told its last outcome was recorded, reads end of file; its pid's run
    record names the task stamped for it, which it runs as an orphan: complete, once, at
    attempt 1, by that same process; the next listener only adopts it."""
    marker = tmp_path / "marker"
    _, (first, second) = killed_after_take(started, tmp_path, redis_url, client, marker,
                                           "--reuse", "5")
    task = client.get_task(second).wait(30)
    assert task.status == "complete" and task.attempts == 1 and task.result == "1"
    assert ran_by(marker) == [client.get_task(first).pid, task.pid]
    assert ran_by(marker)[0] == ran_by(marker)[1]  # the warm process ran it
    assert outcomes(redis_client, "complete") == 2 and outcomes(redis_client, "failed") == 0
    wait_until(lambda: gone(task.pid or 0), what="the orphan gone once it recorded itself")


@pytest.mark.slow
def test_a_warm_process_killed_before_the_go_of_a_task_taken_for_it(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """Held at the point where its round trip took the next task for it, the listener finds
    the warm process killed meanwhile: the task never ran and goes back to the head of the
    line (not failed), then runs once in a fresh process."""
    marker = tmp_path / "marker"
    daemon = start(started, tmp_path, redis_url, "--reuse", "5",
                   failpoints="listener-after-take:2")
    first = enqueue(client, marker=str(marker), value=1)
    second = enqueue(client, marker=str(marker), value=2)
    wait_until(lambda: client.store.task_data(second).get("status") == "started",
               what="the second task stamped for the warm process")
    victim = int(client.store.task_data(second)["pid"])
    assert client.get_task(first).status == "complete" and client.get_task(first).pid == victim
    psutil.Process(victim).kill()
    task = client.get_task(second).wait(30)
    assert task.status == "complete" and task.result == "2", (task.data, daemon.log())
    assert len(lines(marker)) == 2 and ran_by(marker)[1] != victim
    assert outcomes(redis_client, "failed") == 0 and outcomes(redis_client, "retry") == 0
    assert daemon.alive() and "Traceback" not in daemon.log()


@pytest.mark.slow
def test_a_listener_told_to_stop_gives_back_the_id_it_took_ahead(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """SIGTERM while an id taken ahead waits for its slot: the listener takes no more tasks,
    so it puts the id back at the head of the line and leaves cleanly; the task is then run
    once by another listener."""
    marker = tmp_path / "marker"
    daemon = start(started, tmp_path, redis_url, failpoints="listener-after-take:2")
    first = enqueue(client, marker=str(marker), value=1)
    second = enqueue(client, marker=str(marker), value=2)

    def taken() -> bool:
        return any(client.store.reserved_ids("work", listener) == [second]
                   for listener in listener_ids(redis_client))

    wait_until(taken, what="the second task taken ahead")
    daemon.process.send_signal(signal.SIGTERM)
    daemon.process.wait(30)
    assert daemon.process.returncode == 0, daemon.log()
    assert client.get_task(first).status == "complete"
    assert client.store.task_data(second)["status"] == "pending"
    assert second in client.store.redis.lrange(client.store.keys.pending("work"), 0, -1)
    start(started, tmp_path, redis_url)
    task = client.get_task(second).wait(30)
    assert task.status == "complete" and task.attempts == 1
    assert len(lines(marker)) == 2


def test_a_finish_whose_script_was_lost_takes_the_next_task_once(
        any_client: blueque.Client) -> None:
    """A Redis that lost its scripts (a restart, SCRIPT FLUSH) refused the finish (NOSCRIPT)
    and ran the take beside it: the pipeline was sent again whole, so the take took a second
    task and the first one stayed stamped in the reserved list, spending an attempt until
    the heal put it back (every listener's first ending on a fresh Redis: a 1-10 s stall of
    the drain benchmarks). Only the refused script is sent again."""
    store = any_client.store
    if store.clustered:
        pytest.skip("a Cluster runs the ending and the take apart")
    task_id, attempt = stamped(any_client)
    following = any_client.get_queue("work").enqueue("{}")
    after = any_client.get_queue("work").enqueue("{}")
    store.redis.script_flush()
    assert store.take("someone_else", Take(["empty"])) is None  # take.lua loaded, finish not
    tail = record_tail(123.25, LISTENER, 77, 55.5)
    status, taken = store.finish_and_take(ending(task_id, attempt), (NODE, PID),
                                          Take(["work"], PID, 123.25, NODE, tail, 3600))
    assert status == "complete" and taken is not None and taken.task_id == following
    assert store.reserved_ids("work", LISTENER) == [following]
    assert store.task_data(after)["status"] == "pending"
    assert store.task_data(following)["attempts"] == "1"
