"""An asyncio web service on Blueque: POST enqueues a report, GET shows its status, and a
server-sent-events endpoint streams its progress until it ends. The work is done by
``blueque listen`` daemons, anywhere; this process only talks to Redis, without ever
blocking its event loop.

    pip install -e '.[test]'             # in Blueque's checkout: fastapi, uvicorn
    PYTHONPATH=examples blueque listen reports report_tasks:build_report &
    PYTHONPATH=examples uvicorn fastapi_service:app
    curl -X POST localhost:8000/reports -H 'content-type: application/json' \\
         -d '{"title": "November", "pages": 5}'
    curl -N localhost:8000/reports/<task id>/events

``BLUEQUE_URL`` names the Redis (default redis://localhost:6379/0).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

import blueque.aio
from blueque.errors import InvalidTaskState, RedisUnavailable, TaskNotFound

QUEUE = "reports"
#: A request waits at most this long for Redis (a restart) before answering 503.
REDIS_PATIENCE = 5.0


class ReportRequest(BaseModel):
    title: str = Field(min_length=1, max_length=200)
    pages: int = Field(default=10, ge=1, le=1000)
    seconds_per_page: float = Field(default=0.5, ge=0, le=60)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # one client (one connection pool) for the whole service, closed at shutdown
    async with blueque.aio.Client() as client:
        app.state.blueque = client.bounded(REDIS_PATIENCE)
        yield


app = FastAPI(title="Reports on Blueque", lifespan=lifespan)


def blueque_client(request: Request) -> blueque.aio.Client:
    client: blueque.aio.Client = request.app.state.blueque
    return client


def describe(task: blueque.aio.Task) -> dict[str, Any]:
    # state, not status: a cancelled task reads "cancelled" (its status is "failed")
    return {"task_id": task.id, "status": task.state, "progress": task.progress,
            "message": task.progress_message, "attempts": task.attempts,
            "result": json.loads(task.result) if task.result else None, "error": task.error}


async def existing_task(request: Request, task_id: str) -> blueque.aio.Task:
    task = await blueque_client(request).get_task(task_id, missing_ok=True)
    if not task.exists:
        raise HTTPException(404, f"no task {task_id}")
    return task


@app.exception_handler(RedisUnavailable)
async def redis_unavailable(request: Request, error: RedisUnavailable) -> JSONResponse:
    return JSONResponse({"detail": "the task store is unavailable; retry shortly"}, 503)


@app.post("/reports", status_code=202)
async def create_report(body: ReportRequest, request: Request) -> dict[str, Any]:
    queue = blueque_client(request).get_queue(QUEUE)
    task_id = await queue.enqueue(body.model_dump_json(), max_attempts=2, time_limit=3600)
    return {"task_id": task_id, "status_url": f"/reports/{task_id}",
            "events_url": f"/reports/{task_id}/events"}


@app.get("/reports/{task_id}")
async def report_status(task_id: str, request: Request) -> dict[str, Any]:
    return describe(await existing_task(request, task_id))


@app.delete("/reports/{task_id}", status_code=202)
async def cancel_report(task_id: str, request: Request) -> dict[str, str]:
    try:
        verdict = await blueque_client(request).cancel_task(task_id, "cancelled by the user")
    except TaskNotFound as error:
        raise HTTPException(404, f"no task {task_id}") from error
    except InvalidTaskState as error:
        raise HTTPException(409, str(error)) from error
    return {"task_id": task_id, "cancel": verdict}


@app.get("/reports/{task_id}/events")
async def report_events(task_id: str, request: Request) -> StreamingResponse:
    """text/event-stream: a ``progress`` event with the task's state now and after each
    change (a finish is seen at once, progress within half a second), then ``end``. A
    browser that goes away cancels the stream, which closes its Redis subscription."""
    task = await existing_task(request, task_id)

    async def events() -> AsyncIterator[str]:
        try:
            async with contextlib.aclosing(task.updates(every=0.5)) as updates:
                async for update in updates:
                    yield f"event: progress\ndata: {json.dumps(describe(update))}\n\n"
        except (TaskNotFound, RedisUnavailable) as error:  # deleted, or Redis went away
            yield f"event: error\ndata: {json.dumps({'detail': str(error)})}\n\n"
            return
        yield f"event: end\ndata: {json.dumps(describe(task))}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
