"""The dashboard looked at as a product: every page, at a desktop's 1280 px and a phone's 390 px,
in Debian's chromium (Playwright), over a fleet with work in every state (real listeners, a
scheduler's cron entries, a registry of jobs); what issue 32 found wrong, each held here.

The pictures are the run's artifacts (``build/screenshots/[test]/``, as every browser test's);
with ``BLUEQUE_DOC_SCREENSHOTS=1`` they are also copied to docs/images/dashboard/, the
pictures of the documentation's dashboard page (committed; a test checks that each page has
its two)."""

# ruff: noqa: F811 - the fixtures of tests/test_dashboard_browser.py, imported, are parameters
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import blueque
from blueque.jobs import job_parameters
from tests.daemons import Daemon, daemons, listen_command, wait_until
from tests.dashboard import ROOT, DashboardProcess
from tests.job_registry import jobs
from tests.test_dashboard_browser import FAST, TOKEN, browser, shots  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WIDTHS = {"desktop": {"width": 1280, "height": 800},
          "phone": {"width": 390, "height": 844}}
PICTURES = ROOT / "docs" / "images" / "dashboard"
NIGHTLY = "nightly=0 3 * * *:digests:{}"
HOURLY = "hourly=0 * * * *:digests:{}"


@dataclass
class Fleet:
    """What the tour's pages show: the ids of its remarkable tasks."""

    running: list[str]
    failed: str
    retried: str
    cancelled: str
    waiting: str
    job: str
    refused_job: str


@pytest.fixture(scope="module")
def fleet_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A Redis of the module's own, filled once for every page and width of the tour."""
    from blueque.testing import RedisServer

    directory = tmp_path_factory.mktemp("fleet")
    with RedisServer() as server:
        yield server.url, directory


@pytest.fixture(scope="module")
def fleet(fleet_url: tuple[str, Path]) -> Iterator[Fleet]:
    url, directory = fleet_url
    client = blueque.Client(url)
    release = directory / "release"
    with daemons(directory) as started:
        def listen(queue: str, function: str, *options: str) -> None:
            started.append(Daemon(listen_command(url, queue, function, *FAST, *options),
                                  directory / f"listener-{queue}.log"))

        listen("documents", "tests.jobs:steps", "--concurrency", "2")
        listen("imports", "tests.jobs:explode")
        listen("images", "tests.job_registry:jobs")
        documents, imports = client.get_queue("documents"), client.get_queue("imports")
        reports, images = client.get_queue("reports"), client.get_queue("images")
        for n in range(4):  # done in a moment: release exists
            release.touch()
            documents.enqueue(json.dumps({"release": str(release)}), task_id=f"doc-{n}")
        wait_until(lambda: documents.stats().complete == 4, what="documents done")
        release.unlink()
        running = [documents.enqueue(json.dumps({"interval": 3, "release": str(release)}),
                                     task_id=f"chapter-{n}") for n in range(2)]
        failed = imports.enqueue('{"input": 1}', task_id="import-7")
        retried = imports.enqueue('{"input": 2}', task_id="import-8", max_attempts=2,
                                  retry_backoff=0.05)
        for task_id in (failed, retried):
            wait_until(lambda i=task_id: client.get_task(i).status == "failed", timeout=30,
                       what=f"{task_id} to fail")
        for _ in range(2):  # an operator retried it twice: four runs of a task allowed two
            client.retry_task(retried)
            wait_until(lambda: client.get_task(retried).status == "failed", timeout=30,
                       what="the retry to fail")
        job = jobs.enqueue(images, "resize", width=640, height=480, task_id="resize-cover")
        refused = images.enqueue(job_parameters("rotate", degrees=90), task_id="rotate-cover")
        for task_id in (job, refused):
            client.get_task(task_id).wait(30)
        for n in range(3):
            reports.enqueue(json.dumps({"report": n}), task_id=f"report-{n}")
        reports.schedule("{}", delay=3600, task_id="report-tonight")
        cancelled = reports.enqueue('{"report": "wrong"}', task_id="report-wrong")
        client.cancel_task(cancelled, "wrong input")
        waiting = reports.enqueue("{}", task_id="report-summary", after=["report-0", "report-1"])
        # the scheduler registers both entries (neither fires: not due), then the hourly one
        # is made to have fired last hour's tick
        scheduler = [sys.executable, "-m", "blueque.cli", "scheduler", "--once", "--url", url,
                     "--cron", NIGHTLY, "--cron", HOURLY]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run(scheduler, env=env, check=True, capture_output=True, timeout=60)
        hour = int(client.store.now() // 3600 * 3600)
        client.redis.hset(client.keys.cron(), "hourly", str(hour - 3600))
        subprocess.run(scheduler, env=env, check=True, capture_output=True, timeout=60)
        assert client.redis.hget(client.keys.cron(), "hourly") == str(hour)
        for task_id in running:
            wait_until(lambda i=task_id: (client.get_task(i).progress or 0) > 0,
                       what="the chapters to run")
        yield Fleet(running, failed, retried, cancelled, waiting, job, refused)
        release.touch()


@pytest.fixture(scope="module")
def fleet_dashboard(fleet_url: tuple[str, Path], fleet: Fleet) -> Iterator[DashboardProcess]:
    url, directory = fleet_url
    process = DashboardProcess(url, directory / "dashboard.log", token=TOKEN,
                               options=("--cron", NIGHTLY, "--cron", HOURLY))
    yield process
    process.close()


def pages(fleet: Fleet) -> dict[str, str]:
    """Every page of the dashboard, by the name its pictures take."""
    return {
        "queues": "/", "queues-24h": "/?range=24h", "queues-7d": "/?range=7d",
        "queue": "/queue?name=documents", "queue-all": "/queue?name=reports&state=all",
        "queue-jobs": "/queue?name=images&state=complete",
        "task-running": f"/task?id={fleet.running[0]}",
        "task-failed": f"/task?id={fleet.failed}", "task-retried": f"/task?id={fleet.retried}",
        "task-cancelled": f"/task?id={fleet.cancelled}",
        "task-waiting": f"/task?id={fleet.waiting}", "task-job": f"/task?id={fleet.job}",
        "nodes": "/nodes", "schedule": "/schedule", "redis": "/redis",
        "missing": "/task?id=no-such-task",
    }


@pytest.fixture(params=list(WIDTHS))
def screen(request: pytest.FixtureRequest, browser: Any) -> Iterator[tuple[str, Any]]:
    phone = request.param == "phone"
    context = browser.new_context(viewport=WIDTHS[request.param], is_mobile=phone,
                                  has_touch=phone)
    yield request.param, context.new_page()
    context.close()


@pytest.fixture
def desktop(browser: Any) -> Iterator[Any]:
    """A page of a 1280 px screen."""
    page = browser.new_page(viewport=WIDTHS["desktop"])
    yield page
    page.close()


def test_every_page_fits_its_screen_and_is_kept_as_a_picture(
        fleet: Fleet, fleet_dashboard: DashboardProcess, screen: tuple[str, Any],
        shots: Path) -> None:
    """No page is wider than the screen (a wide table scrolls inside its own box), none
    answers an error, and each is kept as a picture (looked at by a person: issue 32)."""
    width, page = screen
    overflowing = []
    for name, path in pages(fleet).items():
        response = page.goto(fleet_dashboard.url + path)
        assert response.status == (404 if name == "missing" else 200), name
        page.wait_for_timeout(300)  # a live refresh has come and gone
        wide = page.evaluate("document.documentElement.scrollWidth")
        if wide > WIDTHS[width]["width"]:
            overflowing.append(f"{name}: {wide} px")
        target = shots / f"{name}-{width}.png"
        page.screenshot(path=str(target), full_page=True)
        if os.environ.get("BLUEQUE_DOC_SCREENSHOTS") == "1":
            PICTURES.mkdir(parents=True, exist_ok=True)
            shutil.copy(target, PICTURES / target.name)
    assert overflowing == []


def test_the_documentation_has_each_pages_two_pictures(fleet: Fleet) -> None:
    """docs/images/dashboard/ holds the tour's pictures: a page added to the tour without
    them (BLUEQUE_DOC_SCREENSHOTS=1 makes them) fails here."""
    wanted = {f"{name}-{width}.png" for name in pages(fleet) for width in WIDTHS}
    assert wanted <= {path.name for path in PICTURES.glob("*.png")}


def test_a_queue_opens_on_its_first_state_with_tasks_and_has_an_all_view(
        fleet: Fleet, fleet_dashboard: DashboardProcess, desktop: Any) -> None:
    desktop.goto(fleet_dashboard.url + "/queue?name=documents")  # nothing pending: 2 running
    assert desktop.locator("#tabs .tab.current").inner_text().split() == ["started", "2"]
    assert sorted(desktop.locator("tr.task-row").evaluate_all(
        "rows => rows.map(row => row.dataset.task)")) == sorted(fleet.running)
    desktop.goto(fleet_dashboard.url + "/queue?name=reports&state=all")
    assert desktop.locator("#tabs .tab.current").inner_text().split() == ["all", "6"]
    shown = desktop.locator("tr.task-row").evaluate_all(
        "rows => rows.map(row => [row.dataset.task, row.querySelector('.badge').innerText])")
    assert shown == [  # in the order a task moves through the states
        [fleet.waiting, "waiting"], ["report-0", "pending"], ["report-1", "pending"],
        ["report-2", "pending"], ["report-tonight", "scheduled"],
        [fleet.cancelled, "cancelled"]]


def test_zeros_are_no_links_and_the_overview_fits_1280_px(
        fleet: Fleet, fleet_dashboard: DashboardProcess, desktop: Any) -> None:
    desktop.goto(fleet_dashboard.url + "/")
    row = desktop.locator('tr[data-queue="documents"]')
    assert row.locator("td.state-started a").inner_text() == "2"
    assert row.locator("td.state-failed").inner_text() == "0"
    assert row.locator("td.state-failed a").count() == 0  # nothing to open
    assert desktop.evaluate("document.documentElement.scrollWidth") <= 1280
    table = desktop.locator("table.grid").bounding_box()
    assert table is not None and table["x"] + table["width"] <= 1280


def test_a_failed_tasks_traceback_is_shown_once(fleet: Fleet,
                                                 fleet_dashboard: DashboardProcess,
                                                 desktop: Any) -> None:
    desktop.goto(fleet_dashboard.url + f"/task?id={fleet.failed}")
    text = desktop.locator("main").inner_text()
    assert text.count("Traceback (most recent call last)") == 1
    assert "ValueError: invalid literal for int()" in desktop.locator("#traceback").inner_text()
    output = desktop.locator("#output").inner_text()
    assert output.startswith('parsing {"input": 1}')  # what it printed, its traceback folded
    assert "Traceback" not in output
    assert "shown above" in desktop.locator("#output-note").inner_text()


def test_attempts_say_what_an_operator_retry_added(fleet: Fleet,
                                                   fleet_dashboard: DashboardProcess,
                                                   desktop: Any) -> None:
    desktop.goto(fleet_dashboard.url + f"/task?id={fleet.retried}")
    card = " ".join(desktop.locator("#attempts-card").inner_text().split())
    assert "4 of 2" not in card
    assert card == "attempts 4 (2 allowed, then 2 operator retries)"
    desktop.goto(fleet_dashboard.url + f"/task?id={fleet.failed}")
    assert " ".join(desktop.locator("#attempts-card").inner_text().split()) == "attempts 1 of 1"


def test_a_cron_entry_that_never_fired_says_so(fleet: Fleet,
                                               fleet_dashboard: DashboardProcess,
                                               desktop: Any) -> None:
    desktop.goto(fleet_dashboard.url + "/schedule")
    nightly = desktop.locator('tr[data-cron="nightly"] td.last').inner_text()
    assert nightly.startswith("not yet (registered ")
    hourly = desktop.locator('tr[data-cron="hourly"] td.last').inner_text()
    assert not hourly.startswith("not yet") and hourly.endswith(":00:00 UTC")


def test_a_cancelled_task_reads_cancelled_and_a_job_is_named(
        fleet: Fleet, fleet_dashboard: DashboardProcess, desktop: Any) -> None:
    desktop.goto(fleet_dashboard.url + f"/task?id={fleet.cancelled}")
    assert desktop.locator("#status").inner_text() == "cancelled"
    desktop.goto(fleet_dashboard.url + f"/task?id={fleet.job}")
    assert desktop.locator("#job").inner_text() == "resize"
    desktop.goto(fleet_dashboard.url + "/queue?name=images&state=complete")
    assert desktop.locator(f'tr[data-task="{fleet.job}"] td.job').inner_text() == "resize"
    desktop.goto(fleet_dashboard.url + "/queue?name=images&state=failed")
    refused = desktop.locator(f'tr[data-task="{fleet.refused_job}"]')
    assert refused.locator("td.job").inner_text() == "rotate"
    assert "not run: unknown job 'rotate'" in refused.locator("td.error-line").inner_text()


def test_last_hour_and_24_hours_count_the_same_endings(
        fleet: Fleet, fleet_dashboard: DashboardProcess, fleet_url: tuple[str, Path],
        desktop: Any) -> None:
    """The summary of the last hour and of 24 hours agree for tasks ended minutes ago (a
    waiting task a cancelled parent ended was counted in one and not the other)."""
    client = blueque.Client(fleet_url[0])
    summaries = client.get_queue("summaries")
    parent = summaries.enqueue("{}", task_id="summary-parent")
    summaries.enqueue("{}", task_id="summary-child", after=parent)
    client.cancel_task(parent)  # the child fails with it: tell.lua
    assert client.get_task("summary-child").wait(10).status == "failed"
    totals = {}
    for span in ("1h", "24h"):
        desktop.goto(fleet_dashboard.url + f"/?range={span}")
        totals[span] = desktop.locator('tr[data-queue="summaries"] td.last-hour').inner_text()
    assert totals["1h"] == totals["24h"]
    assert "1 failed" in totals["1h"] and "1 cancelled" in totals["1h"]
