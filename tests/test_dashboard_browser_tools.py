"""The dashboard's task-list tools, Redis page, charts and listener history in a real browser:
Debian's chromium driven by Playwright against the private redis-server and a real
`blueque dashboard` process (fixtures and screenshots as tests/test_dashboard_browser.py:
``$BLUEQUE_ARTIFACTS/screenshots/[test]/``)."""

# ruff: noqa: F811 - the fixtures of tests/test_dashboard_browser.py, imported, are parameters
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

import blueque
from blueque.listener import Listener
from blueque.statuses import STARTED
from tests.daemons import wait_until
from tests.dashboard import DashboardProcess
from tests.test_dashboard import run
from tests.test_dashboard_browser import TOKEN, browser, dashboard, page, shots  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def ticked(page: Any) -> list[str]:
    return page.eval_on_selector_all(
        "input.select-task:checked", "boxes => boxes.map(box => box.value)")


def shown_rows(page: Any) -> list[str]:
    return page.eval_on_selector_all(
        "tr.task-row", "rows => rows.map(row => row.dataset.task)")


def test_bulk_select_survives_refreshes_and_retries_cancels_and_deletes(
        client: blueque.Client, dashboard: DashboardProcess, page: Any,
        shots: Path) -> None:
    queue = client.get_queue("documents")
    queue.enqueue_many([json.dumps({"document": f"scan-{n:03d}.pdf", "pages": n})
                        for n in range(6)], task_ids=[f"doc-{n}" for n in range(6)])
    failed = [run(client, "documents", fail=f"ValueError: page {n} is unreadable")
              for n in range(4)]
    asked: list[str] = []
    page.on("dialog", lambda dialog: asked.append(dialog.message))
    page.goto(f"{dashboard.url}/queue?name=documents&state=failed")
    page.locator("#token").fill(TOKEN)
    page.locator("#bulk button[data-bulk=bulk-retry]").click()
    wait_until(lambda: page.locator("#message").is_visible(), what="the refusal")
    assert page.locator("#message").inner_text().startswith("select tasks first")
    for task_id in failed[:3]:
        page.locator(f'input.select-task[value="{task_id}"]').check()
    assert page.locator("#selected-count").inner_text() == "3 selected"
    page.evaluate("window.notReloaded = true")
    footer = page.locator("#clock").inner_text()
    wait_until(lambda: page.locator("#clock").inner_text() != footer, what="a live refresh")
    assert sorted(ticked(page)) == sorted(failed[:3])  # the ticks outlive the refresh
    assert page.evaluate("window.notReloaded") is True
    page.screenshot(path=str(shots / "failed-ticked.png"), full_page=True)
    page.locator("#bulk button[data-bulk=bulk-retry]").click()
    wait_until(lambda: "pending again" in page.locator("#message").inner_text(),
               what="the retry's answer")
    assert asked[-1].startswith("Retry the 3 selected task(s)?")
    assert page.locator("#message").inner_text() == "3 task(s) pending again"
    assert [client.get_task(t).status for t in failed] == ["pending"] * 3 + ["failed"]
    assert page.locator("#selected-count").inner_text() == "none selected"

    page.goto(f"{dashboard.url}/queue?name=documents&state=pending")
    page.locator("#select-all").check()
    assert len(ticked(page)) == 5 and page.locator("#selected-count").inner_text() == \
        "5 selected"
    page.screenshot(path=str(shots / "pending-all-ticked.png"), full_page=True)
    page.locator("#bulk button[data-bulk=bulk-cancel]").click()
    wait_until(lambda: "cancelled" in page.locator("#message").inner_text(), what="cancel")
    assert asked[-1].startswith("Cancel the 5 selected task(s)?")
    assert queue.stats().pending == 0 and queue.stats().cancelled == 5

    page.goto(f"{dashboard.url}/queue?name=documents&state=cancelled")
    wait_until(lambda: len(shown_rows(page)) == 5, what="the cancelled list")
    for task_id in shown_rows(page)[:2]:
        page.locator(f'input.select-task[value="{task_id}"]').check()
    page.locator("#bulk button[data-bulk=bulk-delete]").click()
    wait_until(lambda: "deleted" in page.locator("#message").inner_text(), what="delete")
    assert asked[-1].startswith("Delete the 2 selected task(s) for good?")
    assert queue.stats().cancelled == 3
    wait_until(lambda: len(shown_rows(page)) == 3, what="the list without a reload")
    page.screenshot(path=str(shots / "deleted.png"), full_page=True)


def test_the_filter_form_finds_by_prefix_node_and_time(
        client: blueque.Client, redis_client: redis.Redis, dashboard: DashboardProcess,
        page: Any, shots: Path) -> None:
    queue = client.get_queue("documents")
    queue.enqueue_many([json.dumps({"invoice": n, "customer": "<b>ACME</b> & co"})
                        for n in range(60)], task_ids=[f"invoice-{n:02d}" for n in range(60)])
    queue.enqueue_many(["{}"] * 5, task_ids=[f"receipt-{n}" for n in range(5)])
    ran_by = {}
    for identity in ("ocr-1_11", "ocr-2_22"):
        task = Listener("documents", client.store, identity=identity).reserve()
        assert task is not None
        client.get_processor(task).start(4242)
        client.get_processor(task).complete(json.dumps({"words": 412, "pages": 3}))
        ran_by[identity] = task.id
    redis_client.hset(client.store.keys.task("invoice-40"), "created", "1700000000")
    page.goto(f"{dashboard.url}/queue?name=documents")
    assert "<b>ACME</b> & co" in page.locator("tr.task-row td.excerpt").first.inner_text()
    page.locator("#filters input[name=id]").fill("receipt-")
    page.locator("#filters button[type=submit]").click()
    page.wait_for_url("**id=receipt-**")
    assert shown_rows(page) == [f"receipt-{n}" for n in range(5)]
    assert "5 matches" in page.locator("#search-note").inner_text()
    page.screenshot(path=str(shots / "prefix.png"), full_page=True)
    page.locator("#filters input[name=id]").fill("invoice-")
    page.locator("#filters input[name=created_to]").fill("2023-11-14T23:00:00")
    page.locator("#filters button[type=submit]").click()
    page.wait_for_url("**created_to=**")
    assert shown_rows(page) == ["invoice-40"]
    page.locator("#clear-filters").click()
    page.wait_for_load_state()
    page.locator("#filters select[name=state]").select_option("complete")
    page.locator("#filters input[name=node]").fill("ocr-2")
    page.locator("#filters button[type=submit]").click()
    page.wait_for_url("**node=ocr-2**")
    assert shown_rows(page) == [ran_by["ocr-2_22"]]
    assert page.locator("td.excerpt.result").inner_text() == '{"words": 412, "pages": 3}'
    assert page.locator("#tabs a.current").inner_text().split()[0] == "complete"
    page.screenshot(path=str(shots / "node-filter.png"), full_page=True)


def test_charts_of_24_hours_and_7_days_and_the_listener_history(
        client: blueque.Client, redis_client: redis.Redis, dashboard: DashboardProcess,
        page: Any, shots: Path) -> None:
    for n in range(3):
        client.get_queue("documents").enqueue("{}")
        run(client, "documents", fail="broken" if n == 2 else None)
        if n < 2:
            task_id = client.get_queue("documents").task_ids(STARTED)[0]
            client.get_processor(client.get_task(task_id)).complete("ok")
    hour = int(client.store.now() // 3600 * 3600)
    for back in range(1, 168):  # a week of traffic, more by day than by night
        key = client.store.keys.finished_per_hour("documents", str(hour - back * 3600))
        daytime = 8 <= time.gmtime(hour - back * 3600).tm_hour < 20
        redis_client.hset(key, mapping={"complete": 40 + (back % 7) * 5 if daytime else 8,
                                        "failed": back % 5, "cancelled": back % 3})
    page.goto(dashboard.url + "/")
    page.locator('#ranges a[data-range="7d"]').click()
    page.wait_for_url("**range=7d")
    assert page.locator("svg.chart-7d").get_attribute("data-bars") == "168"
    assert page.locator("svg.chart-7d rect.ok").count() == 168
    page.screenshot(path=str(shots / "overview-7d.png"), full_page=True)
    page.locator('#ranges a[data-range="24h"]').click()
    page.wait_for_url("**range=24h")
    assert page.locator("svg.chart-24h rect.ok").count() == 24
    header = page.locator("table.grid thead").inner_text()
    assert "finished per hour, last 24 h" in header
    page.screenshot(path=str(shots / "overview-24h.png"), full_page=True)
    page.goto(dashboard.url + "/nodes")
    row = page.locator("tr.history-row").first
    assert row.locator("td.runs").inner_text() == "3"
    page.screenshot(path=str(shots / "nodes-history.png"), full_page=True)
    page.goto(dashboard.url + "/redis")
    assert page.locator("#role").inner_text() == "master"
    page.screenshot(path=str(shots / "redis.png"), full_page=True)
