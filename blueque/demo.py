"""``blueque demo``: the whole system on one machine, finishing by itself.

Starts a private redis-server (unless a URL was given), a listener daemon and a scheduler as
child processes, enqueues a few tasks of blueque.demo_tasks (of different lengths, one
delayed, one that fails once and is retried, one cancelled while it runs), shows progress and
the final state, and stops every process it started, by pid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TextIO

import blueque
from blueque.client import Client
from blueque.config import URL_ENVIRONMENT_VARIABLE, default_url
from blueque.display import last_line, shorten, table
from blueque.errors import BluequeError
from blueque.private_redis import RedisServer
from blueque.process import stop_process
from blueque.statuses import COMPLETE, FAILED, STARTED, state_of
from blueque.waiting import WaitResult, wait_all

QUEUE = "blueque-demo"
FUNCTION = "blueque.demo_tasks:work"
CONCURRENCY = 3
#: (seconds of work, attempts that fail first) of the tasks enqueued at once.
TASKS = ((0.5, 0), (1.0, 0), (1.5, 0), (2.0, 0), (2.5, 0), (1.0, 1))
DELAY = 2.0  # the delayed task runs this long after it is enqueued
LONG = 600.0  # the task that is cancelled while it runs
TIMEOUT = 120.0


class DemoError(BluequeError):
    pass


class Processes:
    """The demo's child processes, their logs in a temporary directory, stopped by pid."""

    def __init__(self, directory: str, url: str, out: TextIO) -> None:
        self.directory = directory
        self.url = url
        self.out = out
        self.started: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, *arguments: str) -> subprocess.Popen[bytes]:
        log = Path(self.directory) / f"{name}.log"
        env = dict(os.environ)
        root = str(Path(blueque.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
        command = [sys.executable, "-m", "blueque.cli", *arguments, "--url", self.url]
        with log.open("wb") as stream:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stream,
                                       stderr=subprocess.STDOUT, env=env)
        self.started.append((name, process, log))
        print(f"  {name}: pid {process.pid} ({' '.join(arguments)})", file=self.out)
        return process

    def check(self) -> None:
        for name, process, log in self.started:
            if process.poll() is not None:
                raise DemoError(f"the {name} exited with code {process.returncode}:\n"
                                + _tail(log))

    def stop(self) -> None:
        # every process first: a line that cannot be printed (`blueque demo | head`) must not
        # leave the others running
        for _, process, _ in reversed(self.started):
            stop_process(process, timeout=20)
        for name, process, _ in reversed(self.started):
            print(f"  stopped the {name} (pid {process.pid}, exit code {process.returncode})",
                  file=self.out)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _until(what: str, predicate: Callable[[], bool], processes: Processes,
           timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        processes.check()
        if time.monotonic() > deadline:
            raise DemoError(f"gave up waiting for {what} after {timeout:g} s")
        time.sleep(0.05)


def run(url: str | None, queue: str = QUEUE, out: TextIO = sys.stdout,
        err: TextIO = sys.stderr) -> int:
    """Run the demo; 0 when every task ended as expected."""
    print("Blueque demo", file=out)
    with ExitStack() as stack:
        if url is None and not os.environ.get(URL_ENVIRONMENT_VARIABLE):
            server = RedisServer()
            stack.callback(lambda: print(f"  stopped the redis-server (pid {server.pid})",
                                         file=out))
            stack.enter_context(server)
            url = server.url
            print(f"  redis-server: pid {server.pid}, private, on {url}", file=out)
        url = url or default_url()
        client = Client(url)
        stack.callback(client.close)
        client.ping()
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="blueque-demo-"))
        processes = Processes(directory, url, out)
        stack.callback(processes.stop)
        processes.start("listener", "listen", queue, FUNCTION, "--concurrency",
                        str(CONCURRENCY), "--interval", "1", "--on-stop", "terminate")
        processes.start("scheduler", "scheduler", "--interval", "0.2")
        _until("the listener to register", lambda: bool(client.store.leases(queue)), processes)
        return _exercise(client, queue, processes, out, err)
    return 1  # pragma: no cover (the with block returns)


def _exercise(client: Client, queue_name: str, processes: Processes, out: TextIO,
              err: TextIO) -> int:
    queue = client.get_queue(queue_name)
    ids: list[str] = []
    for seconds, failing in TASKS:
        options: dict[str, object] = {"max_attempts": 2, "retry_backoff": 0.5} if failing else {}
        parameters = json.dumps({"seconds": seconds, "fail_attempts": failing})
        ids.append(queue.enqueue(parameters, None, **options))
    ids.append(queue.schedule(json.dumps({"seconds": 0.5}), delay=DELAY))
    long_id = queue.enqueue(json.dumps({"seconds": LONG}))
    print(f"enqueued {len(ids) + 1} tasks on {queue_name}: {len(TASKS)} now (one fails its "
          f"first attempt and is retried), one in {DELAY:g} s, one long one to cancel",
          file=out)
    _until("the long task to start",
           lambda: client.get_task(long_id).status == STARTED, processes, TIMEOUT)
    outcome = client.cancel_task(long_id, "demo")
    print(f"cancelling the long task {long_id} while it runs: {outcome}", file=out)
    result = wait_all(client, [*ids, long_id], TIMEOUT, lambda _: processes.check(), show=err)
    return _summary(result, ids, long_id, out)


def _summary(result: WaitResult, ids: list[str], long_id: str, out: TextIO) -> int:
    rows = []
    for task_id, data in result.tasks.items():
        failed = data.get("status") == FAILED
        outcome = last_line(data.get("error")) if failed else data.get("result")
        rows.append((task_id, state_of(data) or "(missing)", data.get("attempts", "-"),
                     shorten(outcome, 50)))
    print("\n" + table(("TASK", "STATUS", "ATTEMPTS", "RESULT/ERROR"), rows), file=out)
    complete = [i for i in ids if result.tasks[i].get("status") == COMPLETE]
    cancelled = bool(result.tasks[long_id].get("cancelled"))
    ok = len(complete) == len(ids) and cancelled and not result.timed_out
    print(f"\n{len(complete)} of {len(ids)} tasks complete, the long task "
          f"{'cancelled' if cancelled else 'NOT cancelled'}: "
          f"{'demo OK' if ok else 'demo FAILED'}", file=out)
    return 0 if ok else 1
