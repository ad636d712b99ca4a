"""A small program that drives one Blueque implementation through the blueque 1.0.1 API only.

The interoperability tests run it with two interpreters: the virtualenv's python, where
``import blueque`` is the original blueque 1.0.1 from PyPI, and the test suite's python, where
it is this repository's package. Because it calls nothing the original lacks, the same script
shows that a program written for 1.0.1 runs unchanged on Blueque.

Usage: ``python driver.py REDIS_URL COMMAND ARGS...``. Every command prints one JSON line
(``{"impl": ..., ...}``) on stdout; the long-running ones (hold, runner) print it as soon as
they are ready and then keep running until the test kills them by pid.

Task parameters starting with "fail" make the processing step fail instead of complete.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import blueque

#: Which implementation this interpreter imported: "orig" (blueque 1.0.1, which has no error
#: hierarchy) or "ours".
IMPL = "ours" if hasattr(blueque, "BluequeError") else "orig"


def emit(**values: Any) -> None:
    print(json.dumps({"impl": IMPL, "blueque": blueque.__file__, **values}), flush=True)


def outcome(text: str) -> tuple[bool, str]:
    """(ok, result or error) for a task's parameters, tagged with the implementation."""
    if text.startswith("fail"):
        return False, f"{IMPL} failed: {text}"
    return True, f"{IMPL} result: {text}"


def describe(task: Any) -> dict[str, Any]:
    """Every attribute 1.0.1's Task has, with the Python type each one was read as."""
    names = ("id", "status", "queue", "parameters", "result", "error", "node", "pid",
             "created", "updated")
    values = {name: getattr(task, name) for name in names}
    types = {name: type(value).__name__ for name, value in values.items()}
    return {"task": values, "types": types}


def process(client: Any, task: Any) -> None:
    """What 1.0.1's ForkingRunner child does, inline: start, then complete or fail."""
    processor = client.get_processor(task)
    processor.start(os.getpid())
    ok, text = outcome(task.parameters)
    if ok:
        processor.complete(text)
    else:
        processor.fail(text)


def runner_callback(task: Any) -> str:
    ok, text = outcome(task.parameters)
    if not ok:
        raise RuntimeError(text)
    return f"{text} (runner pid {os.getpid()})"


def main(argv: list[str]) -> int:  # noqa: C901 - one flat dispatch over the commands
    url, command, args = argv[0], argv[1], argv[2:]
    client = blueque.Client(url)
    if command == "enqueue":  # QUEUE PARAMETERS...
        queue = client.get_queue(args[0])
        emit(ids=[queue.enqueue(parameters) for parameters in args[1:]])
    elif command == "schedule":  # QUEUE PARAMETERS DELAY_SECONDS
        eta = time.time() + float(args[2])
        emit(id=client.get_queue(args[0]).schedule(args[1], eta), eta=eta)
    elif command == "enqueue-due":  # QUEUE
        client.get_queue(args[0]).enqueue_due_tasks()
        emit()
    elif command == "get-task":  # ID...
        emit(tasks=[describe(client.get_task(task_id)) for task_id in args])
    elif command == "delete-task":  # QUEUE ID...
        queue = client.get_queue(args[0])
        for task_id in args[1:]:
            queue.delete_task(client.get_task(task_id))
        emit(deleted=args[1:])
    elif command == "process":  # QUEUE COUNT: listen() and process COUNT tasks inline
        listener = client.get_listener(args[0])
        done = []
        for _ in range(int(args[1])):
            task = listener.listen()
            process(client, task)
            done.append(task.id)
        emit(ids=done, pid=os.getpid())
    elif command == "hold":  # QUEUE [started]: reserve (and start) a task, wait to be killed
        task = client.get_listener(args[0]).listen()
        if args[1:] == ["started"]:
            client.get_processor(task).start(os.getpid())
        emit(id=task.id, status=client.get_task(task.id).status, pid=os.getpid())
        time.sleep(3600)
    elif command == "claim-orphan":  # QUEUE: claim a dead listener's task, then process it
        task = client.get_listener(args[0]).claim_orphan()
        if task is None:
            emit(claimed=None, pid=os.getpid())
            return 0
        claimed = describe(task)
        process(client, task)
        emit(claimed=claimed, pid=os.getpid())
    elif command == "runner":  # QUEUE: the ForkingRunner, until killed
        # Imported here so the other commands work while a runner module is unavailable.
        from blueque.forking_runner import ForkingRunner

        emit(pid=os.getpid())
        ForkingRunner(client, args[0], runner_callback).run()
    else:
        print(f"unknown command {command!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
