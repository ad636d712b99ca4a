"""blueque.aio: the asyncio client, for services that enqueue and wait without blocking their
event loop (FastAPI, Starlette, aiohttp)::

    from blueque.aio import Client

    async with Client("redis://localhost:6379/0") as client:
        task_id = await client.get_queue("reports").enqueue('{"month": "2026-11"}')
        task = await (await client.get_task(task_id)).wait(timeout=3600)

It has blueque.Client's shape (get_queue, get_task, cancel_task, retry_task; Queue.enqueue,
enqueue_many, schedule, configure, stats, delete_task, purge; Task.refresh, wait) and runs
the very same protocol operations (blueque.protocol) on redis.asyncio, with the same URLs,
retry policy and errors. Tasks are run by ``blueque listen`` daemons as always.
"""

from blueque.aio.client import Client, Queue, Task
from blueque.aio.store import AsyncRedisStore, AsyncSubscription

__all__ = ["AsyncRedisStore", "AsyncSubscription", "Client", "Queue", "Task"]
