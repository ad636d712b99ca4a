"""examples/fastapi_service.py end to end: the service under a real uvicorn on loopback, a real
`blueque listen` daemon running examples/report_tasks.py, and a client reading the
server-sent events as they come; the error answers through the ASGI app in process."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import blueque
from blueque.testing import RedisServer, free_port, stop_process
from tests.daemons import ROOT, Daemon, daemons, listen_command, wait_until

pytest.importorskip("fastapi")
pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples"
PYTHONPATH = os.pathsep.join([str(ROOT), str(EXAMPLES)])


@pytest.fixture
def service(redis_url: str, redis_client: Any, tmp_path: Path) -> Iterator[str]:
    """uvicorn serving the example on a free loopback port; its base URL."""
    with uvicorn_serving(redis_url, tmp_path) as base:
        yield base


@contextlib.contextmanager
def uvicorn_serving(redis_url: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = open(tmp_path / "uvicorn.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "fastapi_service:app", "--host", "127.0.0.1",
         "--port", str(port)],
        cwd=EXAMPLES, env={**os.environ, "PYTHONPATH": PYTHONPATH, "BLUEQUE_URL": redis_url},
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(f"{base}/docs", timeout=1).status_code == 200
        except httpx.TransportError:
            return process.poll() is not None  # died: fail below, not by timeout
    try:
        wait_until(answers, timeout=30, what="uvicorn answering")
        assert process.poll() is None, (tmp_path / "uvicorn.log").read_text()
        yield base
    finally:
        stop_process(process)  # type: ignore[arg-type]
        log.close()


def listener(started: list[Daemon], url: str, tmp_path: Path) -> Daemon:
    daemon = Daemon(listen_command(url, "reports", "report_tasks:build_report",
                                   "--interval", "0.5", "--poll", "0.1"),
                    tmp_path / "listener.log", env={"PYTHONPATH": PYTHONPATH})
    started.append(daemon)
    return daemon


def read_events(response: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event, data) of a text/event-stream, as the lines arrive."""
    event, data = "", ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: "):
            data = line[len("data: "):]
        elif not line and event:
            yield event, json.loads(data)
            event, data = "", ""


def test_post_then_stream_progress_to_the_end_while_a_listener_works(
        service: str, redis_url: str, tmp_path: Path) -> None:
    with httpx.Client(base_url=service, timeout=30) as http, daemons(tmp_path) as started:
        created = http.post("/reports", json={"title": "November", "pages": 4,
                                              "seconds_per_page": 0.3})
        assert created.status_code == 202
        task_id = created.json()["task_id"]
        assert http.get(created.json()["status_url"]).json()["status"] == "pending"
        events: list[tuple[str, dict[str, Any]]] = []
        # the stream is open before any listener exists: its first event must be "pending",
        # and everything after it arrives while the client reads
        with http.stream("GET", f"/reports/{task_id}/events") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            for event, data in read_events(response):
                events.append((event, data))
                if len(events) == 1:
                    assert (event, data["status"]) == ("progress", "pending")
                    listener(started, redis_url, tmp_path)
        assert events[-1][0] == "end"
        statuses = [data["status"] for _, data in events]
        assert statuses[-2:] == ["complete", "complete"]
        progress = [data["progress"] or 0.0 for _, data in events]
        assert progress == sorted(progress) and progress[-1] == 1.0
        assert "started" in statuses  # streamed while it ran
        final = http.get(f"/reports/{task_id}").json()
        assert final["result"] == {"title": "November", "pages": 4, "words": 1400}
        assert (final["status"], final["message"], final["attempts"]) == (
            "complete", "page 4 of 4", 1)


def test_a_client_that_goes_away_leaves_no_subscription_behind(
        service: str, redis_client: Any) -> None:
    """What the events endpoint promises: a browser that closes the stream cancels it, and
    the cancelled wait closes its Redis subscription (and gives its connection back): a
    service whose users leave pages open and closed for hours does not pile up
    subscribers on blueque_done_reports, nor connections."""
    channel = blueque.Client(redis_client).keys.done_channel("reports")

    def subscribers() -> int:
        return int(dict(redis_client.pubsub_numsub(channel))[channel])

    def clients() -> int:
        return int(redis_client.info("clients")["connected_clients"])

    with httpx.Client(base_url=service, timeout=30) as http:
        task_id = http.post("/reports", json={"title": "never run"}).json()["task_id"]
        before = clients()
        for _ in range(3):
            with http.stream("GET", f"/reports/{task_id}/events") as response:
                events = read_events(response)  # held: dropping it would close the stream
                event, data = next(events)
                assert (event, data["status"]) == ("progress", "pending")
                wait_until(lambda: subscribers() == 1, what="the stream subscribed")
            # closed by the client: the stream is over for the service too
            wait_until(lambda: subscribers() == 0, what="the subscription closed")
        wait_until(lambda: clients() <= before + 1, what="the connections given back")
        assert http.get(f"/reports/{task_id}").json()["status"] == "pending"


def test_redis_going_away_is_a_503_and_an_error_event(tmp_path: Path) -> None:
    """Redis killed under the service: a request answers 503 once the client's bounded
    patience (5 s) has passed, not a 500 nor a hang, and an open events stream ends with an
    ``error`` event rather than dying silently."""
    server = RedisServer().start()
    try:
        with uvicorn_serving(server.url, tmp_path) as base, \
                httpx.Client(base_url=base, timeout=30) as http:
            task_id = http.post("/reports", json={"title": "x"}).json()["task_id"]
            with http.stream("GET", f"/reports/{task_id}/events") as response:
                events = read_events(response)
                assert next(events)[0] == "progress"
                server.kill()
                for path, answer in (("GET", http.get(f"/reports/{task_id}")),
                                     ("POST", http.post("/reports", json={"title": "y"}))):
                    assert answer.status_code == 503, (path, answer.text)
                    assert "unavailable" in answer.json()["detail"]
                event, data = next(events)
                assert event == "error" and "unreachable" in data["detail"]
                assert next(events, None) is None  # and the stream ends
    finally:
        server.stop()


def test_a_failing_report_and_a_cancelled_one(service: str, redis_url: str,
                                              tmp_path: Path) -> None:
    with httpx.Client(base_url=service, timeout=30) as http, daemons(tmp_path) as started:
        failing = http.post("/reports", json={"title": "please fail", "pages": 1}).json()
        waiting = http.post("/reports", json={"title": "later", "pages": 1}).json()
        assert http.delete(f"/reports/{waiting['task_id']}").json()["cancel"] == "cancelled"
        assert http.delete(f"/reports/{waiting['task_id']}").status_code == 409
        listener(started, redis_url, tmp_path)
        with http.stream("GET", failing["events_url"]) as response:
            events = list(read_events(response))
        assert events[-1][0] == "end"
        assert (events[-1][1]["status"], events[-1][1]["attempts"]) == ("failed", 2)
        assert "cannot build a report" in events[-1][1]["error"]
        # a cancelled task reads cancelled (its status is failed): what the user asked for
        assert http.get(waiting["status_url"]).json()["status"] == "cancelled"
        client = blueque.Client(redis_url)
        try:
            cancelled = client.get_task(waiting["task_id"])
            assert cancelled.cancelled and cancelled.attempts is None  # it never ran
        finally:
            client.close()


# --- in process, through the ASGI app ---------------------------------------------------------
@contextlib.asynccontextmanager
async def asgi_client(redis_url: str, monkeypatch: pytest.MonkeyPatch
                      ) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("BLUEQUE_URL", redis_url)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import fastapi_service

    app = fastapi_service.app
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://service") as http:
        yield http


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_bad_requests_get_clear_answers(redis_url: str, redis_client: Any,
                                              monkeypatch: pytest.MonkeyPatch,
                                              anyio_backend: str) -> None:
    async with asgi_client(redis_url, monkeypatch) as http:
        assert (await http.get("/reports/nope")).status_code == 404
        assert (await http.get("/reports/nope/events")).status_code == 404
        assert (await http.delete("/reports/nope")).status_code == 404
        refused = await http.post("/reports", json={"title": "", "pages": 0})
        assert refused.status_code == 422
        assert redis_client.llen("blueque_pending_tasks_reports") == 0
        made = (await http.post("/reports", json={"title": "ok"})).json()
        assert redis_client.lrange("blueque_pending_tasks_reports", 0, -1) == [made["task_id"]]
        status = (await http.get(made["status_url"])).json()
        assert (status["status"], status["progress"], status["result"]) == ("pending", None, None)
