"""The dashboard in a real browser: Debian's chromium driven by Playwright, against the private
redis-server, real `blueque listen` daemons and a real `blueque dashboard` process.

Screenshots of every scenario are the run's artifacts: ``build/screenshots/[test]/`` in the
checkout (``$BLUEQUE_ARTIFACTS/screenshots/[test]/`` when set, for a CI to collect; the path is
printed). ``BLUEQUE_README_SCREENSHOT=1`` also writes docs/images/dashboard.png for the README."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis

import blueque
from blueque.tasklog import TAIL_BYTES
from blueque.testing import RedisServer
from tests.daemons import FAST, Daemon, daemons, listen_command, wait_until
from tests.dashboard import ROOT, DashboardProcess

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TOKEN = "browser-test-token"


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError("Debian's chromium is not installed: run ./dev setup")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Path:
    """This test's screenshot directory (emptied first: a rerun leaves no stale pictures)."""
    base = Path(os.environ.get("BLUEQUE_ARTIFACTS") or ROOT / "build")
    directory = base / "screenshots" / request.node.name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    print(f"screenshots in {directory}")
    return directory


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    opened = context.new_page()
    opened.on("dialog", lambda dialog: dialog.accept())  # the confirm() before an action
    yield opened
    context.close()


@pytest.fixture
def dashboard(redis_url: str, redis_client: redis.Redis, tmp_path: Path
              ) -> Iterator[DashboardProcess]:
    process = DashboardProcess(redis_url, tmp_path / "dashboard.log", token=TOKEN)
    yield process
    process.close()


@pytest.fixture
def listen(redis_url: str, tmp_path: Path) -> Iterator[Any]:
    with daemons(tmp_path) as started:
        def start(queue: str, function: str, *options: str) -> Daemon:
            daemon = Daemon(listen_command(redis_url, queue, function, *FAST, *options),
                            tmp_path / f"listener{len(started)}.log")
            started.append(daemon)
            return daemon

        yield start


def progress_value(page: Any) -> float:
    return float(page.locator("#progress").get_attribute("value") or "0")


def test_running_progress_advances_without_reload(
        client: blueque.Client, dashboard: DashboardProcess, listen: Any, page: Any,
        shots: Path, tmp_path: Path) -> None:
    listen("work", "tests.jobs:steps", "--concurrency", "2")
    release = tmp_path / "release"
    task_id = client.get_queue("work").enqueue(
        json.dumps({"interval": 0.4, "release": str(release)}))
    wait_until(lambda: (client.get_task(task_id).progress or 0) > 0, what="first progress")
    page.goto(f"{dashboard.url}/task?id={task_id}")
    page.evaluate("window.notReloaded = true")
    first = progress_value(page)
    wait_until(lambda: progress_value(page) > first + 0.1, timeout=20,
               what="the progress bar to advance")
    assert page.evaluate("window.notReloaded") is True  # updated in place, not reloaded
    assert "step" in page.locator("#progress-message").inner_text()
    page.screenshot(path=str(shots / "task-running.png"), full_page=True)
    page.goto(f"{dashboard.url}/nodes")
    row = page.locator(f'tr[data-task="{task_id}"]')
    assert row.count() == 1
    wait_until(lambda: page.locator(".slots").first.inner_text() == "1/2",
               what="busy/total slots as the listener last renewed")
    page.screenshot(path=str(shots / "nodes.png"), full_page=True)
    release.touch()
    client.get_task(task_id).wait(20)


def test_a_running_tasks_log_tail_grows_without_reload(
        client: blueque.Client, dashboard: DashboardProcess, listen: Any, page: Any,
        shots: Path, tmp_path: Path) -> None:
    listen("work", "tests.output_jobs:ticking")
    release = tmp_path / "release"
    task_id = client.get_queue("work").enqueue(json.dumps({"release": str(release)}))
    wait_until(lambda: client.get_task(task_id).status == "started", what="started")
    page.goto(f"{dashboard.url}/task?id={task_id}")
    wait_until(lambda: page.locator("#output").count() == 1, what="the output shown")
    page.evaluate("window.notReloaded = true")
    first = page.locator("#output").inner_text().count("tick ")
    wait_until(lambda: page.locator("#output").inner_text().count("tick ") > first + 10,
               what="more output without a reload")
    assert page.evaluate("window.notReloaded") is True
    assert "still coming" in page.locator("h2", has_text="Output of attempt 1").inner_text()
    at_end = """(() => { const pre = document.getElementById("output");
                          return pre.scrollHeight > pre.clientHeight
                            && pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4; })()"""
    wait_until(lambda: page.evaluate(at_end), what="the newest lines in view")
    page.evaluate('document.getElementById("output").scrollTop = 0')  # reading older lines
    grown = page.locator("#output").inner_text().count("tick ")
    wait_until(lambda: page.locator("#output").inner_text().count("tick ") > grown + 5,
               what="more output")
    assert page.evaluate('document.getElementById("output").scrollTop') == 0  # left there
    page.evaluate('document.getElementById("output").scrollTop = 1e9')
    page.screenshot(path=str(shots / "task-output-live.png"), full_page=True)
    release.touch()
    assert client.get_task(task_id).wait(20).status == "complete"
    wait_until(lambda: page.locator("#output").inner_text().endswith("bye\n")
               or page.locator("#output").inner_text().endswith("bye"), what="its last line")


def test_failed_task_shows_its_traceback_and_log_tail(
        client: blueque.Client, dashboard: DashboardProcess, listen: Any, page: Any,
        shots: Path) -> None:
    listen("work", "tests.jobs:explode")
    task_id = client.get_queue("work").enqueue('{"input": 1}')
    client.get_task(task_id).wait(20)
    assert client.get_task(task_id).status == "failed"
    page.goto(f"{dashboard.url}/task?id={task_id}")
    assert "invalid literal for int()" in page.locator("#error").inner_text()
    trace = page.locator("#traceback").inner_text()
    assert "Traceback (most recent call last)" in trace
    assert "in parse" in trace and "ValueError: invalid literal for int()" in trace
    assert page.locator("#status").inner_text() == "failed"
    # the log tail: what the task printed; its traceback, written last, is the one above
    output = page.locator("#output").inner_text()
    assert output.startswith('parsing {"input": 1}')
    assert "ValueError" not in output
    assert page.locator("#output-note").inner_text() == "…and then its traceback, shown above."
    assert page.locator("main").inner_text().count("Traceback (most recent call last)") == 1
    page.screenshot(path=str(shots / "task-failed.png"), full_page=True)


def test_a_task_done_on_its_second_attempt_shows_its_history_not_its_first_error(
        client: blueque.Client, dashboard: DashboardProcess, listen: Any, page: Any,
        shots: Path) -> None:
    listen("work", "tests.jobs:flaky")
    task_id = client.get_queue("work").enqueue(json.dumps({"succeed_on": 2}), max_attempts=2,
                                               retry_backoff=0.2)
    assert client.get_task(task_id).wait(30).status == "complete"
    page.goto(f"{dashboard.url}/task?id={task_id}")
    assert page.locator("#status").inner_text() == "complete"
    assert page.locator("#error").count() == 0 and page.locator("pre.error").count() == 0
    rows = page.locator("#history tbody tr")
    assert rows.count() == 2
    first, second = (rows.nth(n).locator("td").all_inner_texts() for n in range(2))
    assert first[0] == "1" and first[1].startswith("retry") and "attempt 1 failed" in first[5]
    assert second[0] == "2" and second[1] == "complete" and second[5] == ""
    page.screenshot(path=str(shots / "task-history.png"), full_page=True)


def test_cancel_through_the_page_needs_the_token(
        client: blueque.Client, dashboard: DashboardProcess, listen: Any, page: Any,
        shots: Path, tmp_path: Path) -> None:
    listen("work", "tests.jobs:steps")
    task_id = client.get_queue("work").enqueue(
        json.dumps({"interval": 5, "release": str(tmp_path / "never")}))
    wait_until(lambda: client.get_task(task_id).status == "started", what="started")
    page.goto(f"{dashboard.url}/task?id={task_id}")
    page.locator("#cancel").click()  # no token typed yet
    message = page.locator("#message")
    wait_until(lambda: message.is_visible(), what="the refusal")
    assert "valid token is required" in message.inner_text()
    assert client.get_task(task_id).status == "started"
    page.screenshot(path=str(shots / "cancel-refused.png"), full_page=True)
    page.locator("#token").fill("not-the-token")
    page.evaluate("document.getElementById('message').textContent = ''")
    page.locator("#cancel").click()
    wait_until(lambda: "valid token is required" in message.inner_text(),
               what="the wrong token refused")
    assert client.get_task(task_id).status == "started"
    page.locator("#token").fill(TOKEN)
    page.locator("#cancel").click()
    wait_until(lambda: client.get_task(task_id).status == "failed", timeout=20,
               what="the cancelled run to be recorded")
    assert client.get_task(task_id).cancelled
    wait_until(lambda: page.locator("#status").inner_text() == "cancelled", timeout=10,
               what="the page to show the cancel without a reload")
    assert "told to stop it" in message.inner_text()
    page.screenshot(path=str(shots / "cancelled.png"), full_page=True)


def test_empty_a_queue_then_purge_what_was_cancelled(
        client: blueque.Client, dashboard: DashboardProcess, listen: Any, browser: Any,
        shots: Path, tmp_path: Path) -> None:
    """The queue page's "Empty queue" cancels every waiting task (the running one goes on),
    after a confirmation; the purge form deletes the cancelled tasks older than its age; a
    cancelled task's page asks before running it after all."""
    listen("documents", "tests.jobs:waits_for_release")
    queue = client.get_queue("documents")
    release = tmp_path / "release"
    running = queue.enqueue(json.dumps({"release": str(release)}))
    wait_until(lambda: client.get_task(running).status == "started", what="one running")
    queue.enqueue_many([json.dumps({"release": str(release)})] * 300)
    for n in range(2):
        queue.schedule("{}", time.time() + 3600 + n)
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    page = context.new_page()
    asked: list[str] = []
    answers = iter([True, False, True, True])

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept() if next(answers) else dialog.dismiss()

    page.on("dialog", answer)
    try:
        page.goto(f"{dashboard.url}/queue?name=documents")
        page.locator("#token").fill(TOKEN)
        assert page.locator("#tabs").inner_text().split() == [
            "all", "303", "waiting", "0", "pending", "300", "scheduled", "2", "reserved", "0",
            "started", "1", "complete", "0", "failed", "0", "cancelled", "0"]
        page.screenshot(path=str(shots / "before-empty.png"), full_page=True)
        page.locator("#empty-queue").click()
        message = page.locator("#message")
        wait_until(lambda: message.is_visible(), what="the action's answer")
        assert asked[0].startswith("Empty this queue: cancel every pending and scheduled task "
                                   "of documents?")
        assert message.inner_text() == ("300 pending and 2 scheduled task(s) of documents "
                                        "cancelled; running tasks go on")
        stats = queue.stats()
        assert (stats.pending, stats.scheduled, stats.started, stats.cancelled) == (0, 0, 1, 302)
        wait_until(lambda: "cancelled 302" in " ".join(page.locator("#tabs").inner_text().split()),
                   what="the tabs to count them without a reload")
        page.screenshot(path=str(shots / "emptied.png"), full_page=True)

        # a cancelled task's page: "Run it after all" asks first; dismissed, nothing happens
        cancelled = queue.task_ids("cancelled", 0, 0)[0]
        page.goto(f"{dashboard.url}/task?id={cancelled}")
        assert "bulk retries" in page.locator("#cancelled-note").inner_text()
        page.screenshot(path=str(shots / "cancelled-task.png"), full_page=True)
        page.locator("#retry").click()
        wait_until(lambda: len(asked) == 2, what="the confirmation")
        assert "cancelled means it should never run. Run it after all?" in asked[1]
        assert client.get_task(cancelled).state == "cancelled"
        page.locator("#retry").click()
        wait_until(lambda: client.get_task(cancelled).status in ("pending", "started"),
                   what="it runs after all")

        # purge: the age field says which; 7d (the default) keeps these new ones
        page.goto(f"{dashboard.url}/queue?name=documents&state=cancelled")
        assert page.locator("#purge-status").input_value() == "cancelled"  # the tab's
        assert page.locator("#purge-age").input_value() == "7d"
        page.locator("#purge-age").fill("0")
        page.locator("#purge button").click()
        wait_until(lambda: queue.stats().cancelled == 0, what="the purge")
        assert asked[-1] == ("Delete every cancelled task of documents that finished more "
                             "than 0 ago?")
        wait_until(lambda: "deleted" in page.locator("#message").inner_text(), what="its answer")
        assert page.locator("#message").inner_text() == (
            "301 cancelled task(s) of documents deleted (every one)")
        page.screenshot(path=str(shots / "purged.png"), full_page=True)
    finally:
        context.close()
        release.touch()


def test_xss_payload_in_parameters_renders_as_text(
        client: blueque.Client, dashboard: DashboardProcess, page: Any, shots: Path) -> None:
    payload = ('<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
               '"><svg onload="window.pwned = 3">')
    task_id = client.get_queue("evil<q>").enqueue(payload, task_id='id"><b>x</b>')
    # its output and the attempt's name: Redis values too (an ended attempt's tail, a
    # running one's stream)
    client.store.end_output(task_id, "1", payload + "\n", 1, 60_000, TAIL_BYTES)
    client.store.append_output(task_id, payload, payload + "\n", 1)
    task_page = f"/task?{urlencode({'id': task_id})}"
    for path in (task_page, task_page + "&attempt=1", f"/queue?{urlencode({'name': 'evil<q>'})}",
                 "/"):
        page.goto(dashboard.url + path)
        page.wait_for_timeout(700)  # two live refreshes go by: they must not run it either
        assert page.evaluate("typeof window.pwned") == "undefined", path
    page.goto(dashboard.url + task_page)
    assert page.locator("#parameters").inner_text() == payload
    assert page.locator("#task-id").inner_text() == task_id
    assert page.locator("#output").inner_text() == payload + "\n"
    assert sorted(page.locator(".attempts a").all_inner_texts()) == [
        "attempt 1", f"attempt {payload}"]
    page.screenshot(path=str(shots / "xss-as-text.png"), full_page=True)


def test_queues_overview_screenshot(
        client: blueque.Client, dashboard: DashboardProcess, listen: Any, page: Any,
        shots: Path, tmp_path: Path) -> None:
    """The overview with work in every state; its screenshot is the README's."""
    listen("documents", "tests.jobs:steps", "--concurrency", "2")
    listen("reports", "tests.jobs:explode")
    documents = client.get_queue("documents")
    for n in range(6):
        documents.enqueue(json.dumps({"interval": 0.05}), task_id=f"doc-{n}")
    for n in range(3):
        client.get_queue("reports").enqueue(json.dumps({"n": n}))
    wait_until(lambda: documents.stats().complete >= 6, timeout=30, what="documents done")
    long_ones = [documents.enqueue(json.dumps({"interval": 2, "release": str(tmp_path / "r")}))
                 for _ in range(2)]
    for n in range(4):
        documents.enqueue(json.dumps({"interval": 2}), task_id=f"waiting-{n}")
    documents.schedule("{}", time.time() + 3600, task_id="tonight")
    client.cancel_task(documents.enqueue("{}", task_id="wrong-input"), "wrong input")
    wait_until(lambda: all(client.get_task(i).status == "started" for i in long_ones),
               what="two running")
    page.goto(dashboard.url + "/")
    wait_until(lambda: page.locator('tr[data-queue="documents"]').count() == 1,
               what="the documents row")
    assert page.locator('tr[data-queue="reports"] td.state-failed').inner_text() == "3"
    assert page.locator('tr[data-queue="documents"] td.state-cancelled').inner_text() == "1"
    assert page.locator('tr[data-queue="documents"] td.state-failed').inner_text() == "0"
    target = shots / "queues.png"
    page.screenshot(path=str(target), full_page=True)
    if os.environ.get("BLUEQUE_README_SCREENSHOT") == "1":
        shutil.copy(target, ROOT / "docs" / "images" / "dashboard.png")
    (tmp_path / "r").touch()


def test_a_task_deleted_while_shown_says_so_without_a_reload(
        client: blueque.Client, dashboard: DashboardProcess, page: Any, shots: Path) -> None:
    queue = client.get_queue("work")
    task_id = queue.enqueue("{}")
    run = client.get_listener("work").reserve()
    assert run is not None and run.id == task_id
    processor = client.get_processor(run)
    processor.start(4242)
    processor.complete("done")
    page.goto(f"{dashboard.url}/task?id={task_id}")
    assert page.locator("#status").inner_text() == "complete"
    page.evaluate("window.notReloaded = true")
    queue.delete_task(client.get_task(task_id))
    wait_until(lambda: page.locator("h1").inner_text().startswith("No task"),
               what="the page to say the task is gone")
    assert page.evaluate("window.notReloaded") is True
    assert page.locator("#live-status").inner_text() == "live"  # not "Redis unreachable"
    page.screenshot(path=str(shots / "task-deleted.png"), full_page=True)


def test_pages_ride_out_a_redis_outage(page: Any, shots: Path, tmp_path: Path) -> None:
    """Redis stopped while a task page is open: the page keeps what it showed and says Redis
    is unreachable; a page opened meanwhile says so too; once Redis is back (restarted from
    its append-only file) both show live data again, without anyone reloading them."""
    server = RedisServer(directory=str(tmp_path / "redis"),
                         extra_args=("--appendonly", "yes", "--appendfsync", "always"))
    (tmp_path / "redis").mkdir()
    server.start()
    process = None
    try:
        client = blueque.Client(server.url)
        with daemons(tmp_path) as started:
            started.append(Daemon(listen_command(server.url, "work", "tests.jobs:steps", *FAST),
                                  tmp_path / "listener.log"))
            task_id = client.get_queue("work").enqueue(
                json.dumps({"interval": 0.3, "release": str(tmp_path / "release")}))
            process = DashboardProcess(server.url, tmp_path / "dashboard.log")
            wait_until(lambda: (client.get_task(task_id).progress or 0) > 0, what="progress")
            page.goto(f"{process.url}/task?id={task_id}")
            page.evaluate("window.notReloaded = true")
            live = page.locator("#live-status")
            assert live.inner_text() == "live"

            server.kill()
            wait_until(lambda: live.inner_text() == "Redis unreachable", what="the outage shown")
            assert page.locator("#task-id").inner_text() == task_id  # what it showed stays
            page.screenshot(path=str(shots / "outage-open-page.png"), full_page=True)
            other = page.context.new_page()
            response = other.goto(f"{process.url}/nodes")
            assert response.status == 503
            assert other.locator("h1").inner_text() == "Redis is unreachable"
            assert other.locator("#live-status").inner_text() == "Redis unreachable"
            other.evaluate("window.notReloaded = true")
            other.screenshot(path=str(shots / "outage-new-page.png"), full_page=True)

            server.start()
            wait_until(lambda: other.locator("h1").inner_text() == "Nodes and listeners",
                       timeout=30, what="the page opened during the outage to show the nodes")
            assert other.evaluate("window.notReloaded") is True
            wait_until(lambda: other.locator(f'tr[data-task="{task_id}"]').count() == 1,
                       what="the running task on the nodes page")
            assert other.locator("#live-status").inner_text() == "live"
            other.screenshot(path=str(shots / "outage-over-new-page.png"), full_page=True)
            first = progress_value(page)
            wait_until(lambda: progress_value(page) > first, timeout=30,
                       what="the open task page to move on")
            assert live.inner_text() == "live" and page.evaluate("window.notReloaded") is True
            (tmp_path / "release").touch()
            assert client.get_task(task_id).wait(30).status == "complete"
    finally:
        if process is not None:
            process.close()
        server.stop()


def test_an_evicting_redis_is_shown_on_every_page_until_fixed(
        evicting_server: RedisServer, page: Any, shots: Path, tmp_path: Path) -> None:
    """Redis' maxmemory-policy lets it delete keys (the dashboard was started with
    --allow-eviction): a warning in plain sight on every page, gone without a reload once an
    operator runs CONFIG SET maxmemory-policy noeviction."""
    process = DashboardProcess(evicting_server.url, tmp_path / "dashboard.log",
                               options=("--allow-eviction",))
    try:
        for path in ("/", "/nodes", "/schedule"):
            page.goto(process.url + path)
            warning = page.locator("#redis-warning [role=alert]")
            assert warning.is_visible(), path
            assert "Redis may delete Blueque's tasks." in warning.inner_text()
            assert "allkeys-lru" in warning.inner_text()
        page.screenshot(path=str(shots / "evicting-redis.png"), full_page=True)
        page.evaluate("window.notReloaded = true")
        redis.Redis.from_url(evicting_server.url).config_set("maxmemory-policy", "noeviction")
        wait_until(lambda: page.locator("#redis-warning [role=alert]").count() == 0,
                   timeout=30, what="the warning gone once the policy is noeviction")
        assert page.evaluate("window.notReloaded") is True
    finally:
        process.close()
