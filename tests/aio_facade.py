"""blueque.Client's surface over blueque.aio, so the contract tests run against both clients.

Every client-side call (get_queue and its Queue's methods, get_task, Task.refresh and wait,
cancel_task, retry_task, queue_names, ping) is made by a blueque.aio.Client, its coroutine
run to completion on an event loop in a background thread. What the asyncio client does not
offer (the listener and processor, which daemons use) and what tests inspect (``redis``,
``store``: the Redis state) come from a sync client on the same database.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import blueque
import blueque.aio

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop running in a daemon thread; ``run`` waits for a coroutine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class _Blocking:
    """Forwards attributes; coroutine methods become blocking calls on the loop thread."""

    def __init__(self, target: Any, loop: LoopThread) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not asyncio.iscoroutinefunction(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._wrap(self._loop.run(value(*args, **kwargs)))

        return call

    def _wrap(self, value: Any) -> Any:
        if value is self._target:  # refresh() and wait() return their task
            return self
        if isinstance(value, blueque.aio.Task):
            return AioTask(value, self._loop)
        return value


class AioTask(_Blocking):
    """A blueque.aio.Task used like a blueque.Task."""

    def __repr__(self) -> str:
        return f"<AioTask {self._target!r}>"


class AioQueue(_Blocking):
    """A blueque.aio.Queue used like a blueque.Queue."""

    def delete_task(self, task: Any) -> None:
        target = task._target if isinstance(task, AioTask) else task
        self._loop.run(self._target.delete_task(target))


class AioClient(_Blocking):
    """A blueque.aio.Client used like a blueque.Client (see the module docstring)."""

    def __init__(self, aio: blueque.aio.Client, loop: LoopThread,
                 sync: blueque.Client | None = None) -> None:
        super().__init__(aio, loop)
        self._sync = sync

    @property
    def aio(self) -> blueque.aio.Client:
        return self._target  # type: ignore[no-any-return]

    @property
    def redis(self) -> Any:
        assert self._sync is not None, "no sync client to inspect Redis with"
        return self._sync.redis

    @property
    def store(self) -> Any:
        assert self._sync is not None, "no sync client to inspect Redis with"
        return self._sync.store

    def get_queue(self, name: str) -> AioQueue:
        return AioQueue(self._target.get_queue(name), self._loop)

    def get_listener(self, queue_name: str) -> Any:
        assert self._sync is not None
        return self._sync.get_listener(queue_name)

    def get_processor(self, task: Any) -> Any:
        assert self._sync is not None
        if isinstance(task, AioTask):
            task = self._sync.get_task(task.id)
        return self._sync.get_processor(task)

    def close(self) -> None:
        self._loop.run(self._target.aclose())
