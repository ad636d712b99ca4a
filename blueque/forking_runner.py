"""blueque 1.0.1's worker, kept for programs written against it: now a front to the listener
daemon (one queue, concurrency 1), so it gains leases, recovery and recorded crashes."""

from __future__ import annotations

from blueque.child import TaskFunction
from blueque.client import Client
from blueque.daemon import ListenerDaemon


class ForkingRunner:
    def __init__(self, client: Client, queue: str, task_callback: TaskFunction) -> None:
        self._client = client
        self._queue = queue
        self._task_callback = task_callback

    def run(self) -> None:
        """Serve the queue until SIGTERM or SIGINT; each task runs in a forked child."""
        ListenerDaemon(self._client, {self._queue: 1}, self._task_callback).run()
