"""Pausing and resuming a queue from the dashboard in a real browser (issue 31.1): Debian's
chromium driven by Playwright against the private redis-server, a real `blueque listen` and a
real `blueque dashboard` (fixtures and screenshots as tests/test_dashboard_browser.py). The
button needs the dashboard's token like every action; a paused queue says so on its page, on
the queues page and in /metrics; its listener starts none of its tasks until it is resumed."""

# ruff: noqa: F811 - the fixtures of tests/test_dashboard_browser.py, imported, are parameters
from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import blueque
from tests.daemons import wait_until
from tests.dashboard import DashboardProcess
from tests.test_dashboard_browser import (  # noqa: F401
    TOKEN,
    browser,
    dashboard,
    listen,
    page,
    shots,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def metrics(dashboard: DashboardProcess) -> str:
    with urllib.request.urlopen(dashboard.url + "/metrics", timeout=10) as response:
        return str(response.read().decode())


def test_pause_and_resume_a_queue_from_its_page(
        client: blueque.Client, dashboard: DashboardProcess, listen: Any, page: Any,
        shots: Path, tmp_path: Path) -> None:
    queue = client.get_queue("documents")
    release = tmp_path / "release"
    first = queue.enqueue(json.dumps({"release": str(release)}))
    listen("documents", "tests.jobs:waits_for_release")
    wait_until(lambda: client.get_task(first).status == "started", what="one running")
    page.goto(f"{dashboard.url}/queue?name=documents")
    assert page.locator("#paused-banner").count() == 0
    page.locator("#pause-reason").fill("nightly backup")
    page.locator("#pause-queue").click()  # no token typed yet: refused
    message = page.locator("#message")
    wait_until(lambda: "valid token is required" in message.inner_text(), what="the refusal")
    assert not queue.stats().paused
    page.locator("#token").fill(TOKEN)
    page.locator("#pause-queue").click()
    wait_until(lambda: "queue documents paused" in message.inner_text(), what="its answer")
    assert queue.stats().paused
    wait_until(lambda: page.locator("#paused-banner").count() == 1,
               what="the page to show the pause without a reload")
    assert "nightly backup" in page.locator("#paused-banner").inner_text()
    assert 'blueque_queue_paused{queue="documents"} 1.0' in metrics(dashboard)

    waiting = [queue.enqueue(json.dumps({"release": str(release)})) for _ in range(3)]
    release.touch()  # the running one ends; the three enqueued while paused must wait
    wait_until(lambda: client.get_task(first).status == "complete", what="the running one done")
    wait_until(lambda: all(info.get("busy") == "0" for info in (
        client.store.listener_info(i) for i in client.store.listener_ids("documents"))),
        what="the listener idle since, its slot free")
    assert [client.get_task(t).status for t in waiting] == ["pending"] * 3
    page.goto(f"{dashboard.url}/")
    assert "paused" in page.locator("tr", has_text="documents").first.inner_text()
    page.screenshot(path=str(shots / "paused-queues.png"), full_page=True)

    page.goto(f"{dashboard.url}/queue?name=documents")
    page.locator("#token").fill(TOKEN)
    page.screenshot(path=str(shots / "paused-queue.png"), full_page=True)
    page.locator("#resume-queue").click()
    wait_until(lambda: not queue.stats().paused, what="the queue resumed")
    for task_id in waiting:
        assert client.get_task(task_id).wait(20).status == "complete"
    wait_until(lambda: page.locator("#resume-queue").count() == 0,
               what="the page to show it running again without a reload")
    assert 'blueque_queue_paused{queue="documents"} 0.0' in metrics(dashboard)
    page.screenshot(path=str(shots / "resumed.png"), full_page=True)
