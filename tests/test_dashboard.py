"""The dashboard over HTTP: a real `blueque dashboard` process on the private redis-server.

Pages render every state, escape what Redis holds, page through large queues, and refuse
actions unless a token is configured, given and sent from the dashboard's own origin."""

from __future__ import annotations

import html
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

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
from blueque.errors import ConfigurationError
from blueque.keys import Keys
from blueque.listener import Listener
from blueque.statuses import FAILED
from blueque.tasklog import TAIL_BYTES
from blueque.testing import RedisServer
from blueque.web import create_app
from tests.daemons import Daemon, daemons, listen_command, wait_until
from tests.dashboard import ROOT, DashboardProcess, free_port, page_text

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


# One dashboard process of each kind for the module (starting one costs a Python and its
# imports: half a second to two on a loaded core); each test still gets an emptied database.
@pytest.fixture(scope="module")
def dashboard_process(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[DashboardProcess]:
    log = tmp_path_factory.mktemp("dashboard") / "dashboard.log"
    process = DashboardProcess(redis_server.url, log, token=TOKEN,
                               options=("--cron", "nightly=0 3 * * *:jobs",
                                        "--allowed-host", "ops.example"))
    yield process
    process.close()


@pytest.fixture(scope="module")
def readonly_process(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[DashboardProcess]:
    log = tmp_path_factory.mktemp("dashboard") / "readonly.log"
    process = DashboardProcess(redis_server.url, log)
    yield process
    process.close()


@pytest.fixture
def dashboard(dashboard_process: DashboardProcess, redis_client: redis.Redis
              ) -> DashboardProcess:
    """The module's dashboard (with a token, a cron entry and an allowed host) over the
    emptied database."""
    assert dashboard_process.process.poll() is None, "an earlier test stopped the dashboard"
    return dashboard_process


@pytest.fixture
def readonly(readonly_process: DashboardProcess, redis_client: redis.Redis
             ) -> DashboardProcess:
    """The module's read-only dashboard (no token) over the emptied database."""
    assert readonly_process.process.poll() is None, "an earlier test stopped the dashboard"
    return readonly_process


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
    # the output's fields are Redis values too: an ended attempt's tail, a running one's stream
    client.store.end_output("x<1>", "1", f"output {XSS}\n", 10, 60_000, TAIL_BYTES)
    client.store.append_output("x<1>", XSS, f"output {XSS}\n", 10)
    pages = ["/task?id=x%3C1%3E&attempt=1", "/", "/queue?name=jobs&state=failed",
             "/queue?name=jobs&state=started",
             "/queue?name=jobs&state=scheduled", "/task?id=x%3C1%3E", "/task?id=running",
             "/nodes", "/schedule"]
    for page in pages:
        status, text = get(dashboard.url + page)
        assert status == 200, page
        assert "<script>window" not in text and "<img src=x" not in text, page
        assert "<b>hard</b>" not in text, page
    status, text = get(dashboard.url + "/task?id=x%3C1%3E")
    assert str(escape(XSS)) in text  # shown as text, not dropped
    assert "Output of attempt 1" in text and f"output {escape(XSS)}" in text
    status, text = get(dashboard.url + "/task?" + urlencode({"id": "x<1>", "attempt": XSS}))
    assert f"Output of attempt {escape(XSS)}" in text and f"output {escape(XSS)}" in text
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
    # behind a reverse proxy that terminates TLS and passes the Host header on
    proxied = {"Host": "ops.example", "X-Blueque-Token": TOKEN}
    for origin in ("https://evil.example", "https://ops.example:8443", "ftp://ops.example"):
        status, reply = post(url, {"task_id": task_id}, {**proxied, "Origin": origin})
        assert status == 403 and "another site" in str(reply["message"]), origin
    status, reply = post(url, {"task_id": "no-such-task"},
                         {**proxied, "Origin": "https://ops.example"})
    assert status == 409 and "no-such-task" in str(reply["message"])  # let through
    status, reply = post(url, {"task_id": task_id}, good)
    assert status == 200 and reply["ok"] is True
    task = client.get_task(task_id)
    assert task.status == "failed" and task.cancelled
    status, reply = post(url, {"task_id": task_id}, good)
    assert status == 409 and "finished task cannot be cancelled" in str(reply["message"])
    status, reply = post(url, {"task": 1}, good)
    assert status == 409 and "task_id" in str(reply["message"])


def ask(port: int, method: str, path: str, host: str | None,
        headers: dict[str, str] | None = None, body: bytes | None = None) -> tuple[int, str]:
    """A request with this very Host header (None: none at all), as a browser that was sent
    here under another name sends it."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=True)
        for name, value in {**({"Host": host} if host is not None else {}),
                            **(headers or {})}.items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_a_dashboard_on_loopback_answers_to_its_own_names_only(
        client: blueque.Client, dashboard: DashboardProcess) -> None:
    """A web page that points its own name at 127.0.0.1 (DNS rebinding) made the browser
    read the dashboard as that page's own: every task's parameters, results and output. On
    a loopback address it answers to localhost, 127.0.0.1, ::1 and its --allowed-host names."""
    task_id = client.get_queue("jobs").enqueue('{"password": "hunter2"}')
    port = dashboard.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST",
                 "ops.example", f"ops.example:{port}"):
        status, page = ask(port, "GET", f"/task?id={task_id}", host)
        assert status == 200 and "hunter2" in page, host
    for host in (f"rebound.evil.example:{port}", "127.0.0.1.evil.example", "", None):
        for path in (f"/task?id={task_id}", "/queue?name=jobs", "/metrics"):
            status, page = ask(port, "GET", path, host)
            assert status == 400 and "hunter2" not in page and "jobs" not in page, (host, path)
            assert host is None or "--allowed-host" in page  # none: HTTP/1.1 refuses it
    # an action from the rebound page, whose Origin then matches its Host: refused too
    evil = f"rebound.evil.example:{port}"
    status, _ = ask(port, "POST", "/actions/cancel", evil,
                    {"Origin": f"http://{evil}", "X-Blueque-Token": TOKEN,
                     "Content-Type": "application/json"}, json.dumps({"task_id": task_id}).encode())
    assert status == 400 and client.get_task(task_id).status == "pending"


@pytest.mark.parametrize(("host", "named", "allowed"), [
    ("127.0.0.1", [], ["localhost", "127.0.0.1", "::1"]),
    ("::1", ["ops.example"], ["localhost", "127.0.0.1", "::1", "ops.example"]),
    ("localhost", [], ["localhost", "127.0.0.1", "::1"]),
    ("127.0.0.2", [], ["localhost", "127.0.0.1", "::1"]),
    ("0.0.0.0", [], None),  # opened up on purpose: any name, unless some are given
    ("0.0.0.0", ["ops.example"], ["ops.example"]),
    ("dashboard.internal", [], None),
])
def test_which_host_names_a_dashboard_answers_to(host: str, named: list[str],
                                                 allowed: list[str] | None) -> None:
    from blueque.hosts import allowed_hosts

    assert allowed_hosts(host, named) == allowed


def test_retry_retry_all_and_purge_actions(client: blueque.Client,
                                           dashboard: DashboardProcess) -> None:
    queue = client.get_queue("jobs")
    for n in range(3):
        queue.enqueue(str(n))
        run(client, "jobs", fail="broken")
    good = {"Origin": dashboard.url, "X-Blueque-Token": TOKEN}
    first = queue.task_ids(FAILED)[-1]
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


def test_retry_all_failed_leaves_cancelled_tasks_alone_and_the_task_page_asks_first(
        client: blueque.Client, dashboard: DashboardProcess) -> None:
    queue = client.get_queue("jobs")
    queue.enqueue("{}")
    run(client, "jobs", fail="broken")
    never = queue.enqueue("{}")
    client.cancel_task(never, "never run this")
    good = {"Origin": dashboard.url, "X-Blueque-Token": TOKEN}
    status, reply = post(dashboard.url + "/actions/retry-failed", {"queue": "jobs"}, good)
    assert status == 200, reply
    assert reply["message"] == ("1 failed task(s) of jobs are pending again; 1 cancelled "
                                "task(s) left alone")
    assert client.get_task(never).state == "cancelled" and queue.stats().cancelled == 1
    # its page says so; its button asks before it runs what was meant never to run
    _, page = get(f"{dashboard.url}/task?id={never}")
    assert 'id="cancelled-note"' in page and "bulk retries" in page
    button = re.search(r'<button type="button" id="retry"[^>]*>', page)
    assert button is not None and 'data-confirm="This task was cancelled (cancelled: never ' \
        'run this): cancelled means it should never run. Run it after all?"' in button.group()
    # the queue lists it under cancelled, not failed
    _, listed = get(f"{dashboard.url}/queue?name=jobs&state=cancelled")
    assert f'data-task="{never}"' in listed and "Run anyway" in listed
    _, failed = get(f"{dashboard.url}/queue?name=jobs&state=failed")
    assert f'data-task="{never}"' not in failed
    status, _ = post(dashboard.url + "/actions/retry", {"task_id": never}, good)
    assert status == 200 and client.get_task(never).status == "pending"


def test_the_overview_counts_cancelled_tasks_apart(client: blueque.Client,
                                                   dashboard: DashboardProcess) -> None:
    """The issue's figure: after 1,000 cancels the overview read "0 ok · 1001 failed"."""
    queue = client.get_queue("jobs")
    for task_id in queue.enqueue_many(["{}"] * 1000).task_ids:
        client.cancel_task(task_id, "wrong batch")
    queue.enqueue("{}")
    run(client, "jobs", fail="broken")
    _, page = get(dashboard.url + "/")
    row = page[page.index('data-queue="jobs"'):]
    row = row[: row.index("</tr>")]
    assert re.search(r'state-failed"><a [^>]*>1</a>', row) and re.search(
        r'state-cancelled"><a [^>]*>1000</a>', row), row
    assert "0 ok · 1 failed · 1000 cancelled · 0 retried" in page_text(row)
    assert '<rect class="cancelled"' in row
    _, text = get(dashboard.url + "/metrics")
    assert 'blueque_tasks{queue="jobs",state="failed"} 1.0' in text
    assert 'blueque_tasks{queue="jobs",state="cancelled"} 1000.0' in text
    assert 'blueque_tasks_finished_total{outcome="cancelled",queue="jobs"} 1000.0' in text


def test_empty_a_queue_and_purge_by_age(client: blueque.Client, redis_client: redis.Redis,
                                        dashboard: DashboardProcess) -> None:
    queue = client.get_queue("jobs")
    queue.enqueue_many(["{}"] * 450)
    later = queue.schedule("{}", time.time() + 3600)
    queue.enqueue("{}")
    assert client.get_listener("jobs").reserve() is not None  # one is reserved: it goes on
    good = {"Origin": dashboard.url, "X-Blueque-Token": TOKEN}
    status, reply = post(dashboard.url + "/actions/cancel-waiting", {"queue": "jobs"},
                         {"X-Blueque-Token": "wrong", "Origin": dashboard.url})
    assert status == 403 and queue.stats().pending == 450
    status, reply = post(dashboard.url + "/actions/cancel-waiting", {"queue": "jobs"}, good)
    assert status == 200, reply
    assert reply["message"] == ("450 pending and 1 scheduled task(s) of jobs cancelled; "
                                "running tasks go on")
    stats = queue.stats()
    assert (stats.pending, stats.scheduled, stats.reserved, stats.cancelled) == (0, 0, 1, 451)
    assert client.get_task(later).error == "cancelled: the queue was emptied from the dashboard"
    # purge by age: an hour old ones only, then every one ("0")
    old = queue.task_ids("cancelled", -50, -1)
    for task_id in old:
        redis_client.hset(Keys().task(task_id), "finished_at", repr(time.time() - 7200))
    status, reply = post(dashboard.url + "/actions/purge",
                         {"queue": "jobs", "status": "cancelled", "older_than": "1h"}, good)
    assert status == 200, reply
    assert reply["message"] == ("50 cancelled task(s) of jobs that finished more than 1h00m "
                                "ago deleted")
    assert queue.stats().cancelled == 401 and not redis_client.exists(Keys().task(old[0]))
    status, reply = post(dashboard.url + "/actions/purge",
                         {"queue": "jobs", "status": "cancelled", "older_than": "0"}, good)
    assert status == 200 and queue.stats().cancelled == 0
    _, page = get(dashboard.url + "/queue?name=jobs")
    assert 'id="empty-queue"' in page and 'name="older_than" value="7d"' in page
    assert '<option value="cancelled">cancelled</option>' in page


def test_a_purge_cutoff_that_is_no_number_is_refused_and_deletes_nothing(
        client: blueque.Client, dashboard: DashboardProcess) -> None:
    queue = client.get_queue("jobs")
    queue.enqueue("{}")
    task = client.get_listener("jobs").reserve()
    assert task is not None
    processor = client.get_processor(task)
    processor.start(4242)
    processor.complete("done")
    good = {"Origin": dashboard.url, "X-Blueque-Token": TOKEN}
    # json.loads takes NaN and Infinity: NaN compared with anything is False, so "older than
    # NaN seconds" once slipped past the check and deleted every finished task
    for older_than in (float("nan"), -1, True, "soon", "-5m", None):
        status, reply = post(dashboard.url + "/actions/purge",
                             {"queue": "jobs", "status": "complete", "older_than": older_than},
                             good)
        assert status == 409 and "older_than" in str(reply["message"]), (older_than, reply)
        assert queue.stats().complete == 1
    with pytest.raises(ConfigurationError, match="older_than"):
        queue.purge("complete", float("nan"))
    assert queue.stats().complete == 1


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


def host_service(kind: str, dashboard_app: object) -> object:
    """A service of the given kind with its own route at / and the dashboard at /ops/blueque."""
    if kind == "fastapi":
        from fastapi import FastAPI

        service = FastAPI()
        service.add_api_route("/", lambda: PlainTextResponse("the host service"))
        service.mount("/ops/blueque", dashboard_app)  # type: ignore[arg-type]
        return service
    return Starlette(routes=[
        Route("/", lambda request: PlainTextResponse("the host service")),
        Mount("/ops/blueque", app=dashboard_app),  # type: ignore[arg-type]
    ])


@pytest.mark.parametrize("kind", ["starlette", "fastapi"])
def test_mounted_in_another_service(kind: str, client: blueque.Client) -> None:
    """Mounted under a path of a Starlette or FastAPI service: links, assets and actions (with
    the token, from the service's own origin) all work under the mount point."""
    queue = client.get_queue("jobs")
    queue.enqueue("{}", task_id="one")
    queue.enqueue("{}", task_id="two")
    service = host_service(kind, create_app(client=client, token=TOKEN))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(service, host="127.0.0.1", port=port,  # type: ignore[arg-type]
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
        assert 'data-action-url="/ops/blueque/actions/NAME"' in text
        for asset in ("dashboard.js", "dashboard.css", "favicon.svg"):
            status, _ = get(base + "/ops/blueque/static/" + asset)
            assert status == 200, asset
        assert get(base + "/") == (200, "the host service")
        url = base + "/ops/blueque/actions/cancel"
        status, reply = post(url, {"task_id": "one"}, {"Origin": base})
        assert status == 403 and client.get_task("one").status == "pending"
        status, reply = post(url, {"task_id": "one"}, {"Origin": "http://evil.example",
                                                        "X-Blueque-Token": TOKEN})
        assert status == 403 and client.get_task("one").status == "pending"
        status, reply = post(url, {"task_id": "one"}, {"Origin": base, "X-Blueque-Token": TOKEN})
        assert status == 200 and reply["ok"] is True, reply
        assert client.get_task("one").cancelled and client.get_task("two").status == "pending"
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
        # a dashboard page (its script shows the real page once Redis answers: browser test)
        assert 'data-page="error"' in text and 'src="/static/dashboard.js"' in text
        assert 'class="live down"' in text
        status, _ = post(process.url + "/actions/cancel", {"task_id": "x"},
                         {"Origin": process.url})
        assert status == 403  # read-only: refused before Redis is asked
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


def test_far_future_and_corrupt_values_keep_every_page_up(
        client: blueque.Client, redis_client: redis.Redis, dashboard: DashboardProcess) -> None:
    """What an operator may find in Redis: a task scheduled past year 9999 (`--delay 600000w`),
    a hash with garbage in its number fields, a foreign key (a string) under a task's name
    next in line, a counter that is no integer. Pages show them; none fails."""
    queue = client.get_queue("odd")
    queue.schedule("{}", 1e13, task_id="far")  # year 318857: no datetime can hold it
    queue.enqueue("{}", task_id="foreign")  # next in line: its age is read
    redis_client.delete(k.Keys().task("foreign"))
    redis_client.set(k.Keys().task("foreign"), "not a hash")
    queue.enqueue("{}", task_id="garbage")
    redis_client.hset(k.Keys().task("garbage"), mapping={
        "progress": "abc", "created": "nan", "updated": "inf", "attempts": "zz", "eta": "x",
        "started_at": "1e400", "status": "weird"})
    minute = int(time.time() // 60 * 60)
    redis_client.hset(k.Keys().finished_per_minute("odd", str(minute)), "failed", "x")
    pages = {
        "/": ['data-queue="odd"'],
        "/schedule": ['data-task="far"', "10000000000000 (not a date)"],
        "/queue?name=odd&state=scheduled": ['data-task="far"'],
        "/queue?name=odd&state=pending": ['data-task="garbage"', 'data-task="foreign"'],
        "/task?id=far": ["10000000000000 (not a date)"],
        "/task?id=garbage": ["weird", "zz", "1e400"],
        "/nodes": ["No listener"],
    }
    for page, shown in pages.items():
        status, text = get(dashboard.url + page)
        assert status == 200, (page, text[:300])
        for piece in shown:
            assert piece in text, (page, piece)
    status, text = get(dashboard.url + "/task?id=foreign")
    assert status == 404 and "something other than a hash" in text
    status, text = get(dashboard.url + "/queue?name=odd&id=foreign")
    assert status == 200 and "no task with this id" in text
    status, text = get(dashboard.url + "/metrics")
    assert status == 200 and "blueque_redis_up 1.0" in text, text[:400]
    assert 'blueque_tasks{queue="odd",state="pending"} 2.0' in text
    assert dashboard.process.poll() is None


def test_overview_shows_the_oldest_pending_age_and_the_last_hour(client: blueque.Client,
                                               redis_client: redis.Redis,
                                               dashboard: DashboardProcess) -> None:
    client.get_queue("jobs").enqueue("{}")
    done = client.get_listener("jobs").reserve()
    assert done is not None
    client.get_processor(done).start(4242)
    client.get_processor(done).complete("ok")
    waiting = client.get_queue("jobs").enqueue("{}")
    redis_client.hset(k.Keys().task(waiting), "updated", repr(time.time() - 3 * 3600 - 700))
    client.get_queue("jobs").enqueue("{}")
    _, text = get(dashboard.url + "/")
    row = text[text.index('data-queue="jobs"'):]
    # a bar for each minute of the last hour in which something ended: here, one
    bars = re.findall(r"<g><title>[^<]*: (\d+) complete, (\d+) failed, \d+ cancelled, (\d+) "
                      r"retried</title>"
                      r'<rect class="ok" x="([\d.]+)" width="2.40" y="[\d.]+" height="([\d.]+)"/>'
                      r"</g>", row[: row.index("</tr>")])
    assert len(bars) == 1 and bars[0][:3] == ("1", "0", "0"), row[:3000]
    assert bars[0][3] in ("174.00", "177.00") and float(bars[0][4]) == 38  # the last minutes, full
    assert '<td class="num age">3h11m</td>' in row[: row.index("</tr>")] or (
        '<td class="num age">3h12m</td>' in row[: row.index("</tr>")]), row[:2000]


@pytest.mark.slow
def test_nodes_and_task_pages_with_real_listeners(client: blueque.Client, redis_url: str,
                                                  dashboard: DashboardProcess,
                                                  tmp_path: Path) -> None:
    """Two listeners on two nodes: the nodes page shows each one's host, pid, lease left,
    busy/total slots and the task it runs with progress and run time; a task whose first
    attempt failed shows each attempt's output, the newest first."""
    release = tmp_path / "release"
    fast = ("--interval", "1", "--poll", "0.1")
    with daemons(tmp_path) as started:
        for node, function in (("node-a", "tests.jobs:steps"),
                               ("node-b", "tests.output_jobs:chatty")):
            started.append(Daemon(listen_command(
                redis_url, "work" if node == "node-a" else "talk", function, *fast,
                "--concurrency", "2", "--node-name", node,
                "--log-dir", str(tmp_path / node)), tmp_path / f"{node}.log"))
        running = client.get_queue("work").enqueue(
            json.dumps({"interval": 0.2, "release": str(release)}))
        talker = client.get_queue("talk").enqueue("{}", max_attempts=2, retry_backoff=0.01)
        wait_until(lambda: (client.get_task(running).progress or 0) >= 0.1, what="progress")
        assert client.get_task(talker).wait(30).status == "complete"

        def card(listener: str) -> str:
            text = get(dashboard.url + "/nodes")[1]
            found = text[text.index(f'data-listener="{listener}"'):]
            return found[: found.index("</article>")]

        for daemon, node in zip(started, ("node-a", "node-b"), strict=True):
            listener = f"{node}_{daemon.pid}"
            shown = card(listener)
            assert f"host <b>{node}</b>" in shown and f"pid <b>{daemon.pid}</b>" in shown
            assert re.search(r"(work|talk): lease [\d.]+(ms|s) left", shown), shown
            slots = f'<b class="slots">{1 if node == "node-a" else 0}/2</b>'
            wait_until(lambda listener=listener, slots=slots: slots in card(listener),
                       what=f"{slots} on {listener}")
        text = get(dashboard.url + "/nodes")[1]
        card = text[text.index(f'data-task="{running}"'):]
        assert "<progress" in card and "step " in card and re.search(r"<td>[\d.]+m?s</td>", card)

        status, text = get(dashboard.url + f"/task?id={talker}")
        assert status == 200 and "Output of attempt 2" in text
        assert "hello from attempt 2" in text and "hello from attempt 1" not in text
        assert f'href="/task?id={talker}&amp;attempt=1"' in text
        status, text = get(dashboard.url + f"/task?id={talker}&attempt=1")
        assert status == 200 and "Output of attempt 1" in text
        assert "ValueError: first attempt fails" in text and "hello from attempt 2" not in text
        assert f"blueque logs {talker} --attempt 1" in text
        assert 'id="attempts-card"><span class="label">attempts</span> 2 of 2</div>' in text
        shown = client.get_task(talker)
        for name in ("created", "started_at", "finished_at"):  # finished_at: its updated
            stamp = getattr(shown, name)
            assert time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp)) in text, name
        release.touch()
        client.get_task(running).wait(20)


def test_every_asset_ships_in_the_package_and_nothing_comes_from_elsewhere(
        wheel: Path) -> None:
    """The package built from this tree holds every template and static file (no CDN: many
    deployments have no internet), and no page or asset names another host."""
    web = ROOT / "blueque" / "web"
    assets = sorted(str(p.relative_to(ROOT)) for d in ("templates", "static")
                    for p in (web / d).rglob("*") if p.is_file())
    assert len(assets) >= 10
    for name in assets:
        text = (ROOT / name).read_text()
        assert not re.search(r"(?:https?:)?//(?!www\.w3\.org/2000/svg)[a-z0-9.-]+\.[a-z]", text,
                             re.IGNORECASE), name
    # what an install gets: the wheel built from pyproject.toml
    with zipfile.ZipFile(wheel) as built:
        shipped = set(built.namelist())
    assert [name for name in assets if name not in shipped] == []


def test_a_port_it_cannot_have_is_a_usage_error(redis_url: str) -> None:
    """Exit 2 with the reason; never uvicorn's exit 3 (which `blueque` means as "Redis
    unreachable") nor a traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, said in ((["--port", str(port)], "Address already in use"),
                           (["--port", "99999"], "port number from 0 to 65535"),
                           (["--refresh", "0"], "above 0")):
            done = subprocess.run(
                [sys.executable, "-m", "blueque.cli", "dashboard", "--url", redis_url, *args],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                text=True, timeout=30)
            assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
            assert "Traceback" not in done.stderr


def test_nodes_page_shows_a_window_of_a_large_fleet(client: blueque.Client,
                                                    dashboard: DashboardProcess) -> None:
    """A listener running more tasks than a page shows lists the first 20 and links the
    rest; more listeners than a page holds are paged (the page reads only what it shows)."""
    queue = client.get_queue("fleet")
    queue.enqueue_many(["{}"] * 25)
    busy = Listener("fleet", client.store, identity="big-node_4242")
    for n in range(25):
        task = busy.reserve()
        assert task is not None
        client.get_processor(task).start(50_000 + n)
    for n in range(54):
        Listener("fleet", client.store, identity=f"node{n:02d}_{1000 + n}")
    _, first = get(dashboard.url + "/nodes")
    assert first.count('class="listener ') == 50
    assert 'data-listener="big-node_4242"' in first
    card = first[first.index('data-listener="big-node_4242"'):]
    card = card[: card.index("</article>")]
    assert card.count("<tr data-task=") == 20
    assert 'and 5 more in <a href="/queue?name=fleet&amp;state=started">fleet</a>' in card
    assert "listeners 1 to 50 of 55" in first and 'href="/nodes?page=2"' in first
    _, second = get(dashboard.url + "/nodes?page=2")
    assert second.count('class="listener ') == 5 and "listeners 51 to 55 of 55" in second
    assert 'data-listener="node53_1053"' in second and "big-node_4242" not in second


def test_a_listener_whose_record_expired_says_so_on_the_nodes_page(
        client: blueque.Client, redis_client: redis.Redis, dashboard: DashboardProcess) -> None:
    """A killed listener's record (slots, last renewal) expires with its lease while it is
    still listed on its queue: the page said 'slots 0/? busy · renewed -' (seen after a
    kill -9), now it says the record is gone."""
    for identity in ("dead-node_4242", "live-node_4343"):
        Listener("gone", client.store, identity=identity)
        client.store.write_listener_info(identity, {
            "host": identity.partition("_")[0], "pid": identity.rpartition("_")[2],
            "concurrency": "2", "busy": "0", "renewed": str(time.time())}, 60)
    redis_client.delete(k.Keys().listener_info("dead-node_4242"))
    _, page = get(dashboard.url + "/nodes")
    dead = page[page.index('data-listener="dead-node_4242"'):]
    dead = dead[: dead.index("</article>")]
    assert "0/?" not in dead and "renewed -" not in dead
    assert "no record of its slots or renewals" in dead and "pid <b>4242</b>" in dead
    live = page[page.index('data-listener="live-node_4343"'):]
    assert "slots <b class=\"slots\">0/2</b> busy" in live[: live.index("</article>")]


def test_a_listener_that_left_is_on_neither_the_nodes_page_nor_status(
        client: blueque.Client, dashboard: DashboardProcess) -> None:
    """A listener that exited leaving its runs to its node (``left`` in its record; its lease
    and set membership stay for the listener that adopts them) is gone at once (issue 29:
    it showed as listening while its lease was carried)."""
    for identity in ("gone-node_4242", "live-node_4343"):
        Listener("gone", client.store, identity=identity)
        client.store.lease("gone", identity, 60_000, "register")
        client.store.write_listener_info(identity, {"concurrency": "1", "busy": "1"}, 60)
    client.store.write_listener_info("gone-node_4242", {"left": str(time.time())}, 60)
    _, page = get(dashboard.url + "/nodes")
    assert 'data-listener="live-node_4343"' in page
    assert "gone-node_4242" not in page
    assert [item.listener for item in client.listeners()] == ["live-node_4343"]


def test_overview_pages_many_queues(client: blueque.Client, dashboard: DashboardProcess
                                    ) -> None:
    """More queues than a page holds (100): each page reads and draws its own queues only."""
    for n in range(105):
        client.get_queue(f"q{n:03d}").enqueue("{}")
    _, first = get(dashboard.url + "/")
    assert first.count('class="queue-row"') == 100
    assert "queues 1 to 100 of 105" in first and 'href="/?page=2"' in first
    _, second = get(dashboard.url + "/?page=2")
    assert second.count('class="queue-row"') == 5 and "queues 101 to 105 of 105" in second
    shown = re.findall(r'class="queue-row" data-queue="(q\d+)"', first + second)
    assert sorted(shown) == [f"q{n:03d}" for n in range(105)]


def test_schedule_page_pages_the_queues_that_have_scheduled_tasks(
        client: blueque.Client, dashboard: DashboardProcess) -> None:
    later = time.time() + 3600
    for n in range(25):
        queue = client.get_queue(f"s{n:02d}")
        for m in range(n % 3 + 1):
            queue.schedule("{}", later + m, task_id=f"s{n:02d}-{m}")
    client.get_queue("idle").enqueue("{}")
    _, first = get(dashboard.url + "/schedule")
    _, second = get(dashboard.url + "/schedule?page=2")
    assert "queues 1 to 20 of 25 with scheduled tasks" in first
    assert "queues 21 to 25 of 25 with scheduled tasks" in second
    both = first + second
    assert "idle" not in both
    for n in range(25):
        assert both.count(f'data-task="s{n:02d}-') == n % 3 + 1, n
        assert f"{n % 3 + 1} of {n % 3 + 1}</span>" in both


def test_queue_and_task_names_with_url_characters_round_trip(
        client: blueque.Client, dashboard: DashboardProcess) -> None:
    """Every link the pages draw leads to the queue or task it names, whatever characters the
    names hold (/, #, ?, &, %, non-ASCII)."""
    name, task_id = "a/b#c?d&e%2Fé", "t/1#?&%2F..é"
    client.get_queue(name).enqueue("{}", task_id=task_id)
    client.get_queue(name).schedule("{}", time.time() + 600, task_id="later/1")
    _, text = get(dashboard.url + "/")
    links = re.findall(r'href="(/queue\?[^"]+)"', text)
    assert links
    for link in links:
        status, page = get(dashboard.url + html.unescape(link))
        assert status == 200 and f"Queue <span class=\"mono\">{escape(name)}</span>" in page
    _, queue_page = get(dashboard.url + html.unescape(links[0]))
    (task_link,) = re.findall(r'href="(/task\?[^"]+)"', queue_page)
    status, task_page = get(dashboard.url + html.unescape(task_link))
    assert status == 200
    assert f'<span class="mono" id="task-id">{escape(task_id)}</span>' in task_page
    found = re.search(r'<form class="filters" id="filters" method="get" action="([^"]+)">'
                      r'(.*?)</form>', queue_page, re.S)
    assert found is not None
    fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', found.group(2)))
    query = urlencode({"name": html.unescape(fields["name"]), "id": task_id})
    _, searched = get(dashboard.url + html.unescape(found.group(1)) + "?" + query)
    assert searched.count('class="task-row"') == 1
    _, schedule = get(dashboard.url + "/schedule")
    (later,) = re.findall(r'href="(/task\?id=later[^"]+)"', schedule)
    assert get(dashboard.url + html.unescape(later))[0] == 200


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
