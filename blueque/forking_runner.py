"""blueque 1.0.1's worker, kept for programs written against it: now a front to the listener
daemon (one queue, concurrency 1), so it gains leases, recovery and recorded crashes."""

from __future__ import annotations

import os

from blueque.client import Client
from blueque.daemon import ListenerDaemon
from blueque.daemon.options import ListenerOptions
from blueque.policy import Policy
from blueque.task import Task
from blueque.task_process.child import TaskFunction, run_child


class ForkingRunner:
    def __init__(self, client: Client, queue: str, task_callback: TaskFunction) -> None:
        self._client = client
        self._queue = queue
        self._task_callback = task_callback

    def run(self) -> None:
        """Serve the queue; each task runs in a forked child. SIGTERM and SIGINT do what the
        program had them do, as with 1.0.1 (wakeup.ProgramSignals): Ctrl-C raises
        KeyboardInterrupt out of run(), a handler of the program's is called, the default
        SIGTERM ends the process; each once the listener has left cleanly (a running task
        keeps running, to be adopted). When run() ends, the program's handlers are back."""
        options = ListenerOptions({self._queue: 1}, self._task_callback, in_program=True)
        ListenerDaemon(self._client, options).run()

    def fork_task(self, task: Task) -> int:
        """blueque 1.0.1's: fork a child that starts ``task`` (reserved by the caller's
        listener), runs the callback and records its outcome; returns the child's pid, which
        the caller waits for (``os.waitpid``). The child leads its own session and always
        leaves through ``os._exit``, as the daemon's children do."""
        store = self._client.store
        policy = Policy.resolve(task.data, store.queue_config(task.queue or self._queue))
        pid = os.fork()
        if pid == 0:
            run_child(store, task, self._task_callback, policy)
        return pid
