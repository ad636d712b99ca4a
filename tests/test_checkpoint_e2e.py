"""Checkpoints end to end (issue 13): real `blueque listen` daemons, real task processes, a real
redis-server. A task whose process is SIGKILLed resumes from its last checkpoint; a superseded
run cannot overwrite the newer attempt's checkpoint; a save rides through a Redis restart and,
past the client's retry_deadline, raises RedisUnavailable."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import redis

import blueque
from blueque.errors import BluequeError, RedisUnavailable
from blueque.keys import Keys
from blueque.listener import Listener
from tests.daemons import FAST, Daemon, kill_session_children, listen_command, wait_until

pytestmark = pytest.mark.slow

KEYS = Keys()


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


def listen(started: list[Daemon], tmp_path: Path, url: str, function: str,
           *options: str) -> Daemon:
    daemon = Daemon(listen_command(url, "work", f"tests.checkpoint_jobs:{function}", *FAST,
                                   *options), tmp_path / f"daemon{len(started)}.log")
    started.append(daemon)
    return daemon


def task_process(task_id: str, attempt: int) -> psutil.Process:
    """The task process of one attempt, found by its title (`blueque: QUEUE TASK attempt N`)."""
    title = f"blueque: work {task_id} attempt {attempt}"
    found = [p for p in psutil.process_iter(["cmdline"])
             if (p.info["cmdline"] or [""])[0] == title]  # setproctitle: argv[0], rest blank
    assert len(found) == 1, f"{len(found)} processes titled {title!r}"
    return found[0]


def test_a_killed_task_resumes_from_its_last_checkpoint(  # type: ignore[no-untyped-def]
        client, redis_url, started, tmp_path):
    """Count to N in steps, a checkpoint every k steps; SIGKILL the task process half way:
    the retry starts after the last checkpoint, so fewer than k steps are done twice."""
    n, k, pause = 40, 5, 0.1
    marker = tmp_path / "marker"
    listen(started, tmp_path, redis_url, "count")
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "n": n, "k": k, "step": pause}),
        max_attempts=2, retry_backoff=0.01)
    wait_until(lambda: steps(marker), what="attempt 1 counting")
    process = task_process(task_id, 1)
    assert process.pid == client.get_task(task_id).pid
    # half way, in the middle of a span of k steps: the next save is a few steps away, so
    # the kill cannot fall between a step's end and its checkpoint (which would redo k steps)
    wait_until(lambda: steps(marker)[-1][0] >= n // 2 and steps(marker)[-1][0] % k == k // 2,
               what="half the steps done")
    process.send_signal(signal.SIGKILL)
    killed_at = time.time()

    task = client.get_task(task_id).wait(60)
    assert (task.status, task.attempts) == ("complete", 2), task.error
    result = json.loads(task.result or "{}")
    first, second = steps(marker, 1), steps(marker, 2)
    resumed_from = result["resumed_from"]
    assert [s for s, _ in first] == list(range(len(first)))  # attempt 1: 0, 1, ... m-1
    assert [s for s, _ in second] == list(range(resumed_from, n))  # attempt 2: c ... N-1
    assert resumed_from % k == 0 and 0 < resumed_from <= len(first)
    redone = len(first) - resumed_from
    assert redone < k
    assert len(first) + len(second) < n + k
    assert task.checkpoint_info is not None and task.checkpoint_info.attempt == 2
    assert json.loads(task.checkpoint or "{}") == {"done": (n - 1) // k * k}  # its last save

    # the figures of the issue: work done against N, and the time the crash cost
    saved_at = first[resumed_from - 1][1]  # the step after which the checkpoint was saved
    begun = begin_time(marker, 2)
    print(f"\nresume: {len(first) + len(second)} steps done for N={n} (k={k}, {pause} s a "
          f"step); killed after step {len(first) - 1}, resumed from the checkpoint at step "
          f"{resumed_from}: {redone} step(s) done twice, {killed_at - saved_at:.2f} s of work "
          f"lost; {begun - killed_at:.2f} s from the SIGKILL to the retry's start (reap, "
          f"retry backoff, poll, fork); {killed_at - saved_at + begun - killed_at:.2f} s lost "
          f"in all, against {killed_at - begin_time(marker, 1):.2f} s of work without a "
          "checkpoint")


def steps(marker: Path, attempt: int | None = None) -> list[tuple[int, float]]:
    """(step, time) of each `step` line of the count job, of one attempt or all."""
    found = []
    for line in lines(marker):
        word, run, step, at = line.split()
        if word == "step" and (attempt is None or int(run) == attempt):
            found.append((int(step), float(at)))
    return found


def begin_time(marker: Path, attempt: int) -> float:
    return next(float(line.split()[3]) for line in lines(marker)
                if line.startswith(f"begin {attempt} "))


def test_a_superseded_run_cannot_overwrite_the_newer_attempts_checkpoint(  # type: ignore[no-untyped-def]
        client, redis_url, started, tmp_path):
    """SIGSTOP the listener past its lease: another listener takes the task over (attempt 2)
    while the old task process keeps running and saving. Every save of the old run is refused
    from then on; the checkpoint is attempt 2's throughout; after SIGCONT the old listener stops
    its superseded run."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    frozen = listen(started, tmp_path, redis_url, "save_until_released",
                    "--identity", "partitioned.example_777")
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "release": str(release)}),
        max_attempts=2, retry_backoff=0.01)
    wait_until(lambda: "saved 1 2" in lines(marker), what="attempt 1 saving")
    old_child = task_process(task_id, 1).pid
    frozen.signal(signal.SIGSTOP)  # its lease lapses; its task process goes on saving
    try:
        listen(started, tmp_path, redis_url, "save_until_released")
        wait_until(lambda: checkpoint_attempt(client, task_id) == "2", timeout=30,
                   what="attempt 2 saving")
        refused_before = refusals(marker)
        wait_until(lambda: refusals(marker) >= refused_before + 3, what="the old run refused")
        # the old run tried three times after attempt 2 had saved: attempt 2's is still there
        assert checkpoint_attempt(client, task_id) == "2"
        assert json.loads(client.get_task(task_id).checkpoint or "{}")["attempt"] == 2
        frozen.signal(signal.SIGCONT)  # it finds its lease lost and stops its superseded run
        wait_until(lambda: not psutil.pid_exists(old_child)
                   or psutil.Process(old_child).status() == psutil.STATUS_ZOMBIE,
                   what="the superseded run stopped")
        release.touch()
        task = client.get_task(task_id).wait(30)
    finally:
        frozen.signal(signal.SIGCONT)
        kill_session_children([old_child])
    assert (task.status, task.result, task.attempts) == ("complete", "done by attempt 2", 2)
    assert checkpoint_attempt(client, task_id) == "2"
    written = lines(marker)
    first_new = next(i for i, line in enumerate(written) if line.startswith("saved 2 "))
    assert not [line for line in written[first_new:] if line.startswith("saved 1 ")]
    stale = [line for line in written if line.startswith("stale 1 ")]
    assert stale and "the checkpoint of its attempt 1 of partitioned.example_777 is not saved" \
        in stale[-1]
    print(f"\nsuperseded run: {len(stale)} saves of attempt 1 refused, "
          f"{sum(line.startswith('saved 1 ') for line in written)} made before it was "
          "superseded; the checkpoint stayed attempt 2's")


def checkpoint_attempt(client: blueque.Client, task_id: str) -> str | None:
    return client.redis.hget(KEYS.checkpoint(task_id), "attempt")  # type: ignore[no-any-return]


def refusals(marker: Path) -> int:
    return sum(line.startswith("stale 1 ") for line in lines(marker))


# --- Redis restarts -----------------------------------------------------------------------
def test_a_save_rides_through_a_redis_restart(aof_server, started, tmp_path):  # type: ignore[no-untyped-def]
    """The task process calls save_checkpoint while Redis is down, for longer than the
    listener's own bounded retries (a quarter second here): the save waits (the client's
    retry_deadline, 30 s) and succeeds once Redis is back; the task goes on and completes."""
    marker, phase, release = tmp_path / "marker", tmp_path / "phase", tmp_path / "release"
    client = blueque.Client(aof_server.url)
    listen(started, tmp_path, aof_server.url, "save_when_told")
    task_id = client.get_queue("work").enqueue(json.dumps(
        {"marker": str(marker), "phase": str(phase), "release": str(release)}))
    wait_until(lambda: lines(marker) == ["waiting"], what="the task running")
    aof_server.kill()
    phase.write_text("save")
    wait_until(lambda: "saving" in lines(marker), what="the save begun while Redis is down")
    time.sleep(1.0)  # an outage longer than the listener's bounded retry (interval / 2)
    assert lines(marker)[-1] == "saving"  # still waiting for Redis, not failed
    aof_server.start()
    wait_until(lambda: lines(marker)[-1].startswith("saved"), timeout=30, what="saved")
    release.touch()
    task = client.get_task(task_id).wait(30)
    assert (task.status, task.attempts) == ("complete", 1), task.error
    assert task.checkpoint == json.dumps({"saved": "during the outage"})
    assert task.checkpoint_info is not None and task.checkpoint_info.attempt == 1
    print(f"\nsave during a Redis restart: {lines(marker)[-1].split()[1]} s")


def test_past_the_retry_deadline_a_save_raises_redis_unavailable(aof_server):  # type: ignore[no-untyped-def]
    """A Redis away for longer than retry_deadline: save_checkpoint raises RedisUnavailable (a
    BluequeError the task may catch), writes nothing, and a later save succeeds."""
    client = blueque.Client(aof_server.url + "?retry_deadline=0.5")
    client.get_queue("work").enqueue("{}")
    task = Listener("work", client.store).reserve()
    assert task is not None
    client.get_processor(task).start(4242)
    task.save_checkpoint("before")
    aof_server.kill()
    outcome: dict[str, BaseException] = {}

    def save() -> None:
        try:
            task.save_checkpoint("during")
        except BaseException as error:  # the test inspects it
            outcome["error"] = error

    thread = threading.Thread(target=save)
    thread.start()
    thread.join(30)
    assert isinstance(outcome.get("error"), RedisUnavailable), outcome
    assert isinstance(outcome["error"], BluequeError)
    assert "unreachable" in str(outcome["error"])
    aof_server.start()
    assert task.checkpoint == "before"  # nothing of the refused save was kept, here or there
    stored = redis.Redis(port=aof_server.port, decode_responses=True).hget(
        KEYS.checkpoint(task.id), "state")
    assert stored == "before"
    task.save_checkpoint("after")
    assert client.get_task(task.id).checkpoint == "after"
