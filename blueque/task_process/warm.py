"""Warm task processes (PROTOCOL.md 6.7, ``blueque listen --reuse N``): a listener's child
that runs up to N tasks one after another, each exactly as a forked child runs its one
(blueque.task_process.child), then exits.

The child's side is ``run_warm_child``: after each outcome its listener recorded, it waits
for its next assignment (``{"task", "queue"}``) or leaves (``{"retire"}``, end of file, or N
tasks run). The listener's side keeps the processes that wait (``Idle``) and tells whether a
run left a process behind (``left_behind``): such a process is retired, so that what the run
left is stopped as for any ended run (blueque.leftovers).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import traceback
from dataclasses import replace
from typing import TYPE_CHECKING, NoReturn

from blueque.errors import BluequeError
from blueque.preemption import notice
from blueque.process import set_title
from blueque.reporting import EXIT_REPORT_FAILED, EXIT_REPORTED, ParentLink
from blueque.run_processes import TASK_VARIABLE
from blueque.task_process.calling import TaskFunction
from blueque.task_process.child import (
    Assignment,
    leave_process,
    prepare_process,
    run_reporting,
    run_reporting_child,
)
from blueque.tasklog import TaskLogSettings

if TYPE_CHECKING:
    from blueque.store import RedisStore

log = logging.getLogger("blueque.daemon")


def idle_title(queue: str) -> str:
    """The title (``ps``) of a warm process waiting for its next task."""
    return f"blueque: {queue} idle"


# --- the task process ----------------------------------------------------------------------------
def run_task_process(store: RedisStore, sock: socket.socket, assignment: Assignment,
                     function: TaskFunction, task_logs: TaskLogSettings | None,
                     reuse: int, spare: bool = False) -> NoReturn:
    """Body of a listener daemon's task process; never returns: one task (``reuse`` 1,
    PROTOCOL.md 6.2), or up to ``reuse`` tasks in turn (6.7). A ``spare`` (6.8) is made
    before its task: it waits for its first one as an idle warm process does."""
    if reuse == 1 and not spare:
        run_reporting_child(store, sock, assignment, function, task_logs)
    run_warm_child(store, sock, assignment, function, task_logs, reuse, spare)


def run_warm_child(store: RedisStore, sock: socket.socket, assignment: Assignment,
                   function: TaskFunction, task_logs: TaskLogSettings | None,
                   reuse: int, spare: bool = False) -> NoReturn:
    """Body of a warm child; never returns. Runs its assignment as ``run_reporting_child``
    does (a ``spare`` first waits for it: ``assignment`` names no task yet); then, while its
    listener recorded each outcome and fewer than ``reuse`` tasks ran, the next task its
    listener assigns it."""
    code = EXIT_REPORT_FAILED
    try:
        prepare_process(idle_title(assignment.queue) if spare else
                        f"blueque: {assignment.queue} {assignment.task_id} starting",
                        sock.fileno())
        link = ParentLink(sock, assignment.patience)
        if spare:
            code = EXIT_REPORTED  # none given (end of file, retired): nothing ran
            first = _wait_for_task(link, assignment.queue)
            if first is None:
                leave_process(code)
            assignment = replace(assignment, task_id=first[0], queue=first[1])
            code = EXIT_REPORT_FAILED
        runs = 0
        while True:
            code = run_reporting(store, link, assignment, function, task_logs)
            runs += 1
            if code != EXIT_REPORTED or runs >= reuse:
                break  # a refusal, a failed record, or its last task
            following = None if link.gone else _wait_for_task(link, assignment.queue)
            if following is None and link.hung_up:
                # its listener died: did the take sent with its last ending stamp a task for
                # this process? (an orphan that recorded itself asks too)
                following = _taken_for_me(store, assignment)
            if following is None:
                break
            # its output pipe is the same: the listener moves to the next attempt's file
            assignment = replace(assignment, task_id=following[0], queue=following[1],
                                 output=None)
    except BaseException:
        traceback.print_exc()
    finally:
        leave_process(code)


def _wait_for_task(link: ParentLink, queue: str) -> tuple[str, str] | None:
    """Between two tasks: no run's mark, then the listener's next frame. The task and queue
    it assigns, or None (retired, or the listener is gone: nothing of a task runs)."""
    set_title(idle_title(queue))
    os.environ.pop(TASK_VARIABLE, None)
    frame = link.receive(forever=True)
    if frame is None or "task" not in frame:
        return None
    _forget_last_task()
    return str(frame["task"]), str(frame.get("queue") or queue)


def _taken_for_me(store: RedisStore, assignment: Assignment) -> tuple[str, str] | None:
    """The task its listener's last take stamped for this process before the listener died,
    if any (PROTOCOL.md 6.7): the run its node's record names under this pid, which it then
    runs as an orphan (run_reporting reads the task and checks that it is started by this
    very process). The read waits for Redis a lease at most, as an unannounced child's."""
    if not assignment.node:
        return None
    try:
        raw = store.bounded(assignment.patience).node_run(assignment.node, os.getpid())
        record = json.loads(raw) if raw else None
    except (BluequeError, ValueError) as error:
        log.error("its listener %s is gone and the record of its next task cannot be read "
                  "(%s); leaving", assignment.listener, error)
        return None
    if (not isinstance(record, dict) or record.get("listener") != assignment.listener
            or record.get("task") == assignment.task_id):  # none, or the run it just ended
        return None
    task, queue = record.get("task"), record.get("queue")
    if not isinstance(task, str) or not isinstance(queue, str):
        return None
    _forget_last_task()
    return task, queue


def _forget_last_task() -> None:
    """What the child machinery keeps per task starts afresh: the preemption notice and its
    callbacks (the progress reporter, mark, title and output file are set for each task by
    blueque.task_process.child; its output goes through the same pipe, which its listener reads
    into the
    next attempt's file)."""
    notice.callbacks.clear()
    notice.noticed, notice.deadline, notice.running = False, None, False
