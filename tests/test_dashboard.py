"""The dashboard over HTTP: a real `blueque dashboard` process on the private redis-server.

Pages render every state, escape what Redis holds, page through large queues, and refuse
actions unless a token is configured, given and sent from the dashboard's own origin."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
import uvicorn
from markupsafe import escape
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

import blueque
from blueque import keys as k
from blueque.web import create_app
from tests.dashboard import DashboardProcess, free_port

TOKEN = "t0ken-for-tests"
XSS = '<script>window.pwned=1</script><img src=x onerror="window.pwned=1">'


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def post(url: str, body: object, headers: dict[str, str] | None = None,
         content_type: str = "application/json") -> tuple[int, dict[str, object]]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": content_type, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def dashboard(redis_url: str, redis_client: redis.Redis, tmp_path: Path
              ) -> Iterator[DashboardProcess]:
    process = DashboardProcess(redis_url, tmp_path / "dashboard.log", token=TOKEN,
                               options=("--cron", "nightly=0 3 * * *:jobs"))
    yield process
    process.close()


@pytest.fixture
def readonly(redis_url: str, redis_client: redis.Redis, tmp_path: Path
             ) -> Iterator[DashboardProcess]:
    process = DashboardProcess(redis_url, tmp_path / "readonly.log")
    yield process
    process.close()


def run(client: blueque.Client, queue: str, fail: str | None = None,
        progress: float | None = None) -> str:
    """Take one pending task of the queue through reserve and start (and fail, if asked)."""
    task = client.get_listener(queue).reserve()
    assert task is not None
    processor = client.get_processor(task)
    processor.start(4242)
    if progress is not None:
        processor.progress(progress, "working <b>hard</b>")
    if fail is not None:
        processor.fail(fail, traceback=f"Traceback (most recent call last):\n{fail}")
    return task.id


def test_every_page_escapes_what_redis_holds(client: blueque.Client,
                                             dashboard: DashboardProcess) -> None:
    queue = client.get_queue("jobs")
    queue.enqueue(XSS, task_id="x<1>")
    run(client, "jobs", fail=f"ValueError: {XSS}")
    queue.enqueue(XSS, task_id="running")
    run(client, "jobs", progress=0.25)
    queue.schedule(XSS, time.time() + 600, task_id="later")
    pages = ["/", "/queue?name=jobs&state=failed", "/queue?name=jobs&state=started",
             "/queue?name=jobs&state=scheduled", "/task?id=x%3C1%3E", "/task?id=running",
             "/nodes", "/schedule"]
    for page in pages:
        status, text = get(dashboard.url + page)
        assert status == 200, page
        assert "<script>window" not in text and "<img src=x" not in text, page
        assert "<b>hard</b>" not in text, page
    status, text = get(dashboard.url + "/task?id=x%3C1%3E")
    assert str(escape(XSS)) in text  # shown as text, not dropped
    assert "Traceback (most recent call last):\nValueError: " + str(escape(XSS)) in text
    status, text = get(dashboard.url + "/task?id=running")
    assert 'value="0.25"' in text and "working &lt;b&gt;hard&lt;/b&gt;" in text


def test_pages_say_what_is_missing(client: blueque.Client, dashboard: DashboardProcess) -> None:
    status, text = get(dashboard.url + "/task?id=nothing-here")
    assert status == 404 and "No task" in text
    status, _ = get(dashboard.url + "/queue?name=unknown")
    assert status == 404


def test_queue_pages_are_windows_next_in_line_first(client: blueque.Client,
                                                    dashboard: DashboardProcess) -> None:
    queue = client.get_queue("big")
    ids = list(queue.enqueue_many([json.dumps(n) for n in range(120)],
                                  task_ids=[f"t{n:03d}" for n in range(120)]))
    assert len(ids) == 120
    status, first = get(dashboard.url + "/queue?name=big&state=pending")
    assert status == 200
    assert first.count('class="task-row"') == 50
    assert first.index('data-task="t000"') < first.index('data-task="t049"')
    assert 'data-task="t050"' not in first
    assert "page 1 of 3 (120 pending)" in first
    _, last = get(dashboard.url + "/queue?name=big&state=pending&page=3")
    assert last.count('class="task-row"') == 20 and 'data-task="t119"' in last
    _, found = get(dashboard.url + "/queue?name=big&state=pending&id=t077")
    assert found.count('class="task-row"') == 1 and 'data-task="t077"' in found
    _, absent = get(dashboard.url + "/queue?name=big&id=t999")
    assert 'class="task-row"' not in absent and "no task with this id" in absent
    client.get_queue("other").enqueue("{}", task_id="o1")
    _, other = get(dashboard.url + "/queue?name=big&id=o1")
    assert 'class="task-row"' not in other and 'href="/task?id=o1">queue other</a>' in other


def test_read_only_by_default_on_loopback(client: blueque.Client,
                                          readonly: DashboardProcess) -> None:
    task_id = client.get_queue("jobs").enqueue("{}")
    status, text = get(readonly.url + "/queue?name=jobs")
    assert status == 200 and "data-action=" not in text and "read-only" in text
    origin = {"Origin": readonly.url, "X-Blueque-Token": ""}
    status, reply = post(readonly.url + "/actions/cancel", {"task_id": task_id}, origin)
    assert status == 403 and "actions are off" in str(reply["message"])
    assert client.get_task(task_id).status == "pending"
    listening = [c.laddr for c in psutil.Process(readonly.process.pid).net_connections()
                 if c.status == psutil.CONN_LISTEN]
    assert [address.ip for address in listening] == ["127.0.0.1"]


def test_actions_need_the_token_and_the_dashboards_own_origin(
        client: blueque.Client, dashboard: DashboardProcess) -> None:
    task_id = client.get_queue("jobs").enqueue("{}")
    url = dashboard.url + "/actions/cancel"
    good = {"Origin": dashboard.url, "X-Blueque-Token": TOKEN}
    refusals = [
        ({"Origin": dashboard.url}, "application/json", "valid token"),
        ({"Origin": dashboard.url, "X-Blueque-Token": "wrong"}, "application/json",
         "valid token"),
        ({"X-Blueque-Token": TOKEN}, "application/json", "no Origin or Referer"),
        ({"Origin": "http://evil.example", "X-Blueque-Token": TOKEN}, "application/json",
         "another site"),
        ({"Referer": "http://evil.example/x", "X-Blueque-Token": TOKEN}, "application/json",
         "another site"),
        (good, "application/x-www-form-urlencoded", "JSON"),
    ]
    for headers, content_type, why in refusals:
        status, reply = post(url, {"task_id": task_id}, headers, content_type)
        assert status == 403 and why in str(reply["message"]), (headers, reply)
        assert client.get_task(task_id).status == "pending"
    status, reply = post(url, {"task_id": task_id}, good)
    assert status == 200 and reply["ok"] is True
    task = client.get_task(task_id)
    assert task.status == "failed" and task.cancelled
    status, reply = post(url, {"task_id": task_id}, good)
    assert status == 409 and "finished task cannot be cancelled" in str(reply["message"])
    status, reply = post(url, {"task": 1}, good)
    assert status == 409 and "task_id" in str(reply["message"])


def test_retry_retry_all_and_purge_actions(client: blueque.Client,
                                           dashboard: DashboardProcess) -> None:
    queue = client.get_queue("jobs")
    for n in range(3):
        queue.enqueue(str(n))
        run(client, "jobs", fail="broken")
    good = {"Origin": dashboard.url, "X-Blueque-Token": TOKEN}
    first = queue.task_ids(k.FAILED)[-1]
    status, _ = post(dashboard.url + "/actions/retry", {"task_id": first}, good)
    assert status == 200 and client.get_task(first).status == "pending"
    status, reply = post(dashboard.url + "/actions/retry-failed", {"queue": "jobs"}, good)
    assert status == 200 and "2 failed task(s)" in str(reply["message"])
    assert queue.stats().pending == 3 and queue.stats().failed == 0
    run(client, "jobs", fail="again")
    status, reply = post(dashboard.url + "/actions/purge",
                         {"queue": "jobs", "status": "failed", "older_than": 0}, good)
    assert status == 200 and "1 failed task(s)" in str(reply["message"])
    assert queue.stats().failed == 0


def test_overview_counts_age_and_throughput(client: blueque.Client, redis_client: redis.Redis,
                                            dashboard: DashboardProcess) -> None:
    queue = client.get_queue("jobs")
    waiting = queue.enqueue("{}")
    redis_client.hset(k.Keys().task(waiting), "updated", repr(time.time() - 3 * 3600))
    queue.enqueue("{}")
    run(client, "jobs", fail="broken")  # the oldest one, now failed
    queue.enqueue("{}")
    status, text = get(dashboard.url + "/")
    assert status == 200
    row = text[text.index('data-queue="jobs"'):]
    assert "1 failed" in row[: row.index("</tr>")]
    status, text = get(dashboard.url + "/metrics")
    assert 'blueque_tasks{queue="jobs",state="pending"} 2.0' in text
    assert 'blueque_tasks_finished_total{outcome="failed",queue="jobs"} 1.0' in text


def test_schedule_page_shows_cron_next_runs(client: blueque.Client, redis_client: redis.Redis,
                                            dashboard: DashboardProcess) -> None:
    redis_client.hset(k.Keys().cron(), mapping={"nightly": "1700017200", "orphan": "1700000000"})
    status, text = get(dashboard.url + "/schedule")
    assert status == 200
    nightly = text[text.index('data-cron="nightly"'):]
    nightly = nightly[: nightly.index("</tr>")]
    assert "0 3 * * *" in nightly and "03:00:00 UTC" in nightly
    assert 'data-cron="orphan"' in text and "not given to the dashboard" in text


def test_mounted_in_another_starlette_app(client: blueque.Client, tmp_path: Path) -> None:
    client.get_queue("jobs").enqueue("{}", task_id="one")
    service = Starlette(routes=[
        Route("/", lambda request: PlainTextResponse("the host service")),
        Mount("/ops/blueque", app=create_app(client=client)),
    ])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(service, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        base = f"http://127.0.0.1:{port}"
        status, text = get(base + "/ops/blueque/queue?name=jobs")
        assert status == 200 and 'href="/ops/blueque/task?id=one"' in text
        assert 'src="/ops/blueque/static/dashboard.js"' in text
        status, script = get(base + "/ops/blueque/static/dashboard.js")
        assert status == 200 and "DOMParser" in script
        assert get(base + "/") == (200, "the host service")
    finally:
        server.should_exit = True
        thread.join(10)


def test_redis_down_gives_a_clear_page_and_metrics_say_so(tmp_path: Path) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    process = DashboardProcess(dead, tmp_path / "down.log")
    try:
        status, text = get(process.url + "/")
        assert status == 503 and "Redis is unreachable" in text
        assert "Traceback" not in text
        status, text = get(process.url + "/metrics")
        assert status == 200 and "blueque_redis_up 0.0" in text
        assert process.process.poll() is None  # still serving
    finally:
        process.close()


def test_huge_values_are_cut_on_the_task_page(client: blueque.Client,
                                              dashboard: DashboardProcess) -> None:
    task_id = client.get_queue("jobs").enqueue("p" * 300_000)
    status, text = get(dashboard.url + f"/task?id={task_id}")
    assert status == 200 and len(text) < 100_000  # refetched every refresh: kept small
    assert f"({300_000 - 65_536} more characters not shown)" in text


def test_the_task_page_shows_the_checkpoints_size_attempt_and_age(
        client: blueque.Client, dashboard: DashboardProcess) -> None:
    task_id = client.get_queue("jobs").enqueue("p")
    task = client.get_listener("jobs").reserve()
    assert task is not None and task.id == task_id
    client.get_processor(task).start(4242)
    status, text = get(dashboard.url + f"/task?id={task_id}")
    assert status == 200 and '<span id="checkpoint">none</span>' in text
    task.save_checkpoint(json.dumps({"secret state": "x" * 3000}))
    status, text = get(dashboard.url + f"/task?id={task_id}")
    assert status == 200 and "2.9 KiB by attempt 1, " in text
    assert "secret state" not in text  # the state itself is not sent to the browser
