"""Programs written for blueque 1.0.1 run unchanged (issue 9 §5): its public ForkingRunner
.fork_task, its `error` text, its redis-py keyword arguments, a refused second start; the
ids enqueue returns, which such programs hand to other processes, and the program's own
SIGTERM and SIGINT handling around ForkingRunner.run() (issue 21 §10)."""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import pickle
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

import blueque
from blueque.forking_runner import ForkingRunner
from blueque.keys import Keys
from blueque.queue import TaskId
from blueque.retry import RetryPolicy
from tests import jobs
from tests.daemons import Daemon, daemons, lines, wait_until
from tests.test_cli import cli

KEYS = Keys()


def reserved_task(client: blueque.Client, queue: str = "work") -> blueque.Task:
    client.get_queue(queue).enqueue('{"value": 5}')
    task = client.get_listener(queue).listen(timeout=5)
    assert task is not None
    return task


@pytest.mark.parametrize(("callback", "status", "field", "text"), [
    (jobs.echo, "complete", "result", "5"),
    (jobs.some_error, "failed", "error", "some error"),
])
def test_fork_task_is_public_and_runs_one_task(client: blueque.Client, callback: object,
                                               status: str, field: str, text: str) -> None:
    task = reserved_task(client)
    runner = ForkingRunner(client, "work", callback)  # type: ignore[arg-type]
    pid = runner.fork_task(task)
    assert pid > 0 and pid != os.getpid()
    _, exit_status = os.waitpid(pid, 0)
    assert os.WIFEXITED(exit_status) and os.WEXITSTATUS(exit_status) == 0
    data = task.refresh().data
    assert (data["status"], data[field], data["pid"]) == (status, text, str(pid))


def test_exception_text_is_the_error_and_the_traceback_has_its_own_field(
        client: blueque.Client, redis_url: str) -> None:
    task = reserved_task(client)
    os.waitpid(ForkingRunner(client, "work", jobs.some_error).fork_task(task), 0)
    task.refresh()
    assert task.error == "some error"  # 1.0.1's str(exception), no file paths
    traceback = task.data["traceback"]
    assert traceback.startswith("Traceback (most recent call last):")
    assert traceback.rstrip().endswith("Exception: some error") and "jobs.py" in traceback
    shown = cli(redis_url, "show", task.id)
    assert shown.returncode == 0
    assert "some error" in shown.stdout and "Exception: some error" in shown.stdout
    assert "traceback" in shown.stdout


def test_a_later_failure_without_traceback_removes_the_old_one(client: blueque.Client) -> None:
    client.get_queue("work").configure(max_attempts=2, retry_backoff=0)
    task = reserved_task(client)
    os.waitpid(ForkingRunner(client, "work", jobs.some_error).fork_task(task), 0)
    assert task.refresh().status == "scheduled" and task.data["traceback"]
    client.get_queue("work").enqueue_due_tasks()
    again = client.get_listener("work").listen(timeout=5)
    assert again is not None and again.attempts == 2
    processor = client.get_processor(again)
    processor.start(os.getpid())
    processor.fail("given up by hand")
    assert again.refresh().error == "given up by hand" and "traceback" not in again.data


def test_redis_py_retry_keyword_is_forwarded_unchanged(redis_url: str,
                                                        redis_client: redis.Redis) -> None:
    retry = Retry(ExponentialBackoff(), 3)
    client = blueque.Client(redis_url, retry=retry)  # as with blueque 1.0.1's Client
    try:
        task_id = client.get_queue("work").enqueue("{}")
        assert client.get_task(task_id).status == "pending"
        assert client.redis.get_retry() is retry
    finally:
        client.close()
    policy = RetryPolicy(deadline_s=1.0)
    own = blueque.Client(redis_url, retry_policy=policy, socket_timeout=5)
    try:
        assert own.store.retry is policy
        assert own.redis.connection_pool.connection_kwargs["socket_timeout"] == 5
        own.get_queue("work").enqueue("{}")
    finally:
        own.close()


def test_refused_second_start_keeps_the_task_in_the_reserved_list(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    task = reserved_task(client)
    listener_id = task.node
    assert listener_id is not None
    client.get_processor(task).start(os.getpid())
    with pytest.raises(blueque.InvalidTaskState, match="cannot start twice"):
        client.get_processor(client.get_task(task.id)).start(os.getpid() + 1)
    # still where recovery looks if this listener dies
    assert redis_client.lrange(KEYS.reserved("work", listener_id), 0, -1) == [task.id]
    assert task.refresh().status == "started" and task.pid == os.getpid()


# --- the ids enqueue returns (issue 21 §10) ------------------------------------------------
def echo_id(task_id: TaskId) -> tuple[TaskId, str, bool]:
    """Run in a multiprocessing pool's worker: the id as it arrived, its type and flag."""
    return task_id, type(task_id).__name__, task_id.created


@pytest.mark.parametrize("created", [True, False])
def test_task_ids_survive_pickle_copy_and_json(client: blueque.Client, created: bool) -> None:
    """A TaskId is a str with a ``created`` flag: pickle (every protocol), copy and deepcopy
    raised "TaskId.__new__() missing 1 required positional argument: 'created'"."""
    queue = client.get_queue("work")
    task_id = queue.enqueue("{}", task_id="mine")
    if not created:
        task_id = queue.enqueue("{}", task_id="mine")
    assert task_id.created is created
    copies = [pickle.loads(pickle.dumps(task_id, protocol))
              for protocol in range(pickle.HIGHEST_PROTOCOL + 1)]
    copies += [copy.copy(task_id), copy.deepcopy(task_id), copy.deepcopy({"id": task_id})["id"]]
    for again in copies:
        assert isinstance(again, TaskId) and again == "mine" and again.created is created
    assert json.loads(json.dumps({"id": task_id})) == {"id": "mine"}
    scheduled = queue.schedule("{}", eta=2e9)
    assert pickle.loads(pickle.dumps(scheduled)) == scheduled


def test_task_ids_go_through_a_multiprocessing_pool(client: blueque.Client) -> None:
    """What a 1.0.1 program does with the ids it enqueued: hand them to worker processes,
    which had died unpickling them (the pool then hung or lost the work)."""
    queue = client.get_queue("work")
    ids = [queue.enqueue("{}"), queue.enqueue("{}", task_id="again"),
           queue.enqueue("{}", task_id="again")]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        # bounded: a worker that dies unpickling its work is replaced, and map waits for ever
        returned = pool.map_async(echo_id, ids, chunksize=1).get(timeout=60)
    assert [(str(i), kind, created) for i, kind, created in returned] == [
        (ids[0], "TaskId", True), ("again", "TaskId", True), ("again", "TaskId", False)]
    assert all(isinstance(i, TaskId) for i, _, _ in returned)


# --- ForkingRunner.run() and the program's signals (issue 21 §10) --------------------------
#: A 1.0.1-style program: its own SIGTERM handler (argv[2] "handler": prints, and raises
#: SystemExit on the second signal) or none, then ForkingRunner.run(), then what it has back.
PROGRAM = """
import signal, sys
import blueque
from blueque.forking_runner import ForkingRunner
from tests import jobs

heard = []

def on_term(signum, frame):
    heard.append(signum)
    print("handler", signum, flush=True)
    if len(heard) == 2:
        sys.exit(7)

if sys.argv[2] == "handler":
    signal.signal(signal.SIGTERM, on_term)
mine = signal.getsignal(signal.SIGTERM)
try:
    ForkingRunner(blueque.Client(sys.argv[1]), "work", jobs.acts).run()
    print("run returned", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
except SystemExit as exit_:
    print("SystemExit", exit_.code, flush=True)
print("handlers back:", signal.getsignal(signal.SIGTERM) is mine,
      signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
"""


@pytest.fixture
def program(redis_url: str, tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    """``program(mode)``: PROGRAM as a process of its own, stopped by pid at the end."""
    with daemons(tmp_path) as started:
        def start(mode: str) -> Daemon:
            process = Daemon([sys.executable, "-c", PROGRAM, redis_url, mode],
                             tmp_path / f"program{len(started)}.log")
            started.append(process)
            return process
        yield start


def listening(client: blueque.Client, process: Daemon) -> bool:
    return [item.info.get("pid") for item in client.listeners(["work"])] == [str(process.pid)]


def left_cleanly(client: blueque.Client) -> bool:
    """No lease, no registration, no info hash of any listener of the queue."""
    return client.listeners(["work"]) == [] and client.get_queue("work").stats().listeners == 0


@pytest.mark.slow
def test_ctrl_c_raises_keyboard_interrupt_out_of_run_as_in_1_0_1(
        client: blueque.Client, program, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C stopped the runner and run() returned: the program could not tell it from an
    ordinary end. Now KeyboardInterrupt comes out of run(), once the listener has left; the
    running task (in its own session, as 1.0.1's children) runs on and records its end."""
    process = program("default")
    wait_until(lambda: listening(client, process), what="the runner listening")
    marker, release = tmp_path / "marker", tmp_path / "release"
    task_id = client.get_queue("work").enqueue(json.dumps({
        "marker": str(marker), "release": str(release), "value": "finished anyway"}))
    wait_until(lambda: lines(marker), what="the task running")
    process.signal(signal.SIGINT)
    assert process.process.wait(30) == 0
    said = process.log().splitlines()
    assert said[-2:] == ["KeyboardInterrupt", "handlers back: True True"], process.log()
    assert "Traceback" not in process.log()
    assert client.get_task(task_id).status == "started"  # its process was not touched
    release.touch()
    assert client.get_task(task_id).wait(30).result == "finished anyway"


@pytest.mark.slow
def test_the_programs_sigterm_handler_is_called_and_keeps_its_meaning(
        client: blueque.Client, program) -> None:  # type: ignore[no-untyped-def]
    """The runner took SIGTERM for itself: the program's handler was never called. Now it is
    (between two steps of the loop); one that returns lets the runner go on, one that raises
    ends run() with its exception, and the program has its handler back."""
    process = program("handler")
    wait_until(lambda: listening(client, process), what="the runner listening")
    process.signal(signal.SIGTERM)
    wait_until(lambda: "handler 15" in process.log(), what="the program's handler")
    task_id = client.get_queue("work").enqueue(json.dumps({"value": "still serving"}))
    task = client.get_task(task_id).wait(30)
    assert task.result == "still serving" and process.alive()
    # reaped: a listener leaving while a child of its is still there keeps its lease for
    # the next one to adopt the child (--on-stop=keep), and would not have left cleanly
    wait_until(lambda: not psutil.pid_exists(task.pid or 0), what="the task process reaped")
    process.signal(signal.SIGTERM)
    assert process.process.wait(30) == 0
    said = process.log().splitlines()
    assert said[-3:] == ["handler 15", "SystemExit 7", "handlers back: True True"], said
    assert left_cleanly(client)


@pytest.mark.slow
def test_a_default_sigterm_still_ends_the_program_after_a_clean_stop(
        client: blueque.Client, program) -> None:  # type: ignore[no-untyped-def]
    """With SIGTERM left at its default, 1.0.1's runner died of it; ours returned from run()
    and the program went on (a `while True: runner.run()` never stopped). Now the listener
    leaves cleanly, then the signal does what it does by default."""
    process = program("default")
    wait_until(lambda: listening(client, process), what="the runner listening")
    process.signal(signal.SIGTERM)
    assert process.process.wait(30) == -signal.SIGTERM
    assert "run returned" not in process.log() and "Traceback" not in process.log()
    assert left_cleanly(client)
