"""The dashboard's task-list tools over HTTP, against a real `blueque dashboard` process and
the private redis-server: excerpts of parameters and results, search by id prefix with
filters by node and time that look at a bounded number of tasks a page, and bulk actions
(retry, cancel, delete) behind the token and origin checks."""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
import redis

import blueque
from blueque.listener import Listener
from blueque.statuses import FAILED, PENDING
from blueque.testing import RedisServer
from blueque.web.search import SCAN_LIMIT, Filters, scan
from tests.daemons import wait_until
from tests.dashboard import DashboardProcess, page_text
from tests.test_dashboard import TOKEN, XSS, get, post, run


@pytest.fixture(scope="module")
def dashboard_process(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[DashboardProcess]:
    """One dashboard process for the module (a start costs a Python and its imports)."""
    process = DashboardProcess(redis_server.url,
                               tmp_path_factory.mktemp("dashboard") / "dashboard.log",
                               token=TOKEN)
    yield process
    process.close()


@pytest.fixture
def dashboard(dashboard_process: DashboardProcess, redis_client: redis.Redis
              ) -> DashboardProcess:
    """The module's dashboard, with a token, over the emptied database."""
    assert dashboard_process.process.poll() is None, "an earlier test stopped the dashboard"
    return dashboard_process


def rows(page: str) -> list[str]:
    return re.findall(r'<tr class="task-row" data-task="([^"]+)">', page)


def queue_page(dashboard: DashboardProcess, **query: object) -> str:
    status, text = get(dashboard.url + "/queue?" + urlencode(query))
    assert status == 200, text
    return text


def test_task_lists_show_a_cut_escaped_excerpt_of_parameters_and_results(
        client: blueque.Client, dashboard: DashboardProcess) -> None:
    queue = client.get_queue("jobs")
    long = json.dumps({"document": XSS, "pages": list(range(200))})
    queue.enqueue(long, task_id="long")
    task = client.get_listener("jobs").reserve()
    assert task is not None
    processor = client.get_processor(task)
    processor.start(4242)
    processor.complete('{"summary": "ok",\n\n   "words": 412}')
    text = queue_page(dashboard, name="jobs", state="complete")
    cell = re.search(r'<td class="excerpt mono"[^>]*>(.*?)</td>', text, re.S)
    assert cell is not None
    shown = html.unescape(cell.group(1))
    assert shown.startswith('{"document": "<script>') and shown.endswith("…")
    assert len(shown) == 60 and "<script>window" not in text  # cut, and escaped
    assert '{"summary": "ok", "words": 412}' in html.unescape(text)  # one line
    task_page = get(dashboard.url + "/task?id=long")[1]
    assert "199]" in html.unescape(task_page)  # the whole text on the task page
    # the other task lists: scheduled tasks, and the tasks each listener runs
    queue.schedule(json.dumps({"later": XSS}), time.time() + 600, task_id="later")
    queue.enqueue(json.dumps({"now": "running", "pages": 3}), task_id="running")
    run(client, "jobs", progress=0.5)
    for path, shown in (("/schedule", '{"later": "<script>window.pwned=1</script><img src=x'),
                        ("/nodes", '{"now": "running", "pages": 3}')):
        text = get(dashboard.url + path)[1]
        cells = [html.unescape(cell) for cell in re.findall(
            r'<td class="excerpt mono">(.*?)</td>', text, re.S)]
        assert any(cell.startswith(shown) for cell in cells), (path, cells)
        assert "<script>window" not in text


def test_search_by_id_prefix_and_by_node_and_time(
        client: blueque.Client, redis_client: redis.Redis, dashboard: DashboardProcess) -> None:
    queue = client.get_queue("jobs")
    queue.enqueue_many(["{}"] * 30, task_ids=[f"batch-a-{n:02d}" for n in range(30)])
    queue.enqueue_many(["{}"] * 30, task_ids=[f"batch-b-{n:02d}" for n in range(30)])
    assert rows(queue_page(dashboard, name="jobs", id="batch-a-07")) == ["batch-a-07"]
    found = rows(queue_page(dashboard, name="jobs", id="batch-b-"))
    assert found == [f"batch-b-{n:02d}" for n in range(30)]
    text = queue_page(dashboard, name="jobs", id="batch-")
    assert len(rows(text)) == 50 and "look further" in text
    further = re.search(r'id="look-further" href="([^"]+)"', text)
    assert further is not None
    rest = rows(get(dashboard.url + html.unescape(further.group(1)))[1])
    assert rest == [f"batch-b-{n:02d}" for n in range(20, 30)]
    # node: the listener that reserved them; time: created (a range), updated
    for _ in range(3):
        run(client, "jobs", fail="broken")
    failed = queue.task_ids(FAILED)
    node = client.get_task(failed[0]).data["node"]
    assert sorted(rows(queue_page(dashboard, name="jobs", state="failed", node=node))
                  ) == sorted(failed)
    assert rows(queue_page(dashboard, name="jobs", state="failed", node="elsewhere")) == []
    redis_client.hset(client.store.keys.task("batch-a-12"), "created", "1700000000")
    old = queue_page(dashboard, name="jobs", created_to="2023-11-14T23:00:00")
    assert rows(old) == ["batch-a-12"]
    between = queue_page(dashboard, name="jobs", created_from="2023-11-14T22:00",
                         created_to="2023-11-14T23:00", id="batch-a")
    assert rows(between) == ["batch-a-12"]
    recent = rows(queue_page(dashboard, name="jobs", state="failed",
                             updated_from=str(time.time() - 3600)))
    assert sorted(recent) == sorted(failed)
    text = queue_page(dashboard, name="jobs", created_from="yesterday")
    assert "is no time" in text and not rows(text)  # refused, said, nothing scanned


def test_a_filtered_page_looks_at_a_bounded_number_of_tasks(
        client: blueque.Client, dashboard: DashboardProcess) -> None:
    queue = client.get_queue("big")
    total = SCAN_LIMIT + 500
    queue.enqueue_many(["{}"] * total, task_ids=[f"t{n:05d}" for n in range(total)])
    wanted = f"t{SCAN_LIMIT + 100:05d}"  # the 2,101st next in line
    text = queue_page(dashboard, name="big", id=wanted[:-1])
    assert rows(text) == []
    assert f"all tasks 1 to {SCAN_LIMIT} of {total} (at most {SCAN_LIMIT} a page)" in text
    further = re.search(r'id="look-further" href="([^"]+)"', text)
    assert further is not None
    text = get(dashboard.url + html.unescape(further.group(1)))[1]
    assert rows(text) == [f"t{SCAN_LIMIT + 100 + n:05d}"[:-1] + str(n) for n in range(10)]
    assert f"all tasks {SCAN_LIMIT + 1} to {total} of {total}" in text
    assert "end of the list" in text


def test_bulk_retry_cancel_and_delete_need_the_token_and_say_what_they_refused(
        client: blueque.Client, dashboard: DashboardProcess) -> None:
    queue = client.get_queue("jobs")
    queue.enqueue_many(["{}"] * 6, task_ids=[f"w{n}" for n in range(6)])
    failed = [run(client, "jobs", fail="broken") for _ in range(3)]
    good = {"Origin": dashboard.url, "X-Blueque-Token": TOKEN}
    url = dashboard.url + "/actions/bulk-cancel"
    for headers in ({"Origin": dashboard.url}, {"X-Blueque-Token": TOKEN},
                    {"Origin": "http://evil.example", "X-Blueque-Token": TOKEN}):
        status, reply = post(url, {"task_ids": ["w3"]}, headers)
        assert status == 403, reply
    assert client.get_task("w3").status == "pending"
    text = queue_page(dashboard, name="jobs", state="pending")
    assert 'class="select-task" value="w3"' in text and 'data-bulk="bulk-cancel"' in text
    status, reply = post(url, {"task_ids": ["w3", "w4"]}, good)
    assert status == 200 and reply["message"] == \
        "2 task(s) cancelled (running ones are being stopped)"
    assert client.get_task("w3").cancelled and client.get_task("w4").cancelled
    status, reply = post(dashboard.url + "/actions/bulk-retry",
                         {"task_ids": [*failed[:2], "w5", "gone"]}, good)
    assert status == 409 and str(reply["message"]).startswith(
        "2 task(s) pending again; 2 refused: w5 (") and "gone" in str(reply["message"])
    assert [client.get_task(t).status for t in failed] == ["pending", "pending", "failed"]
    status, reply = post(dashboard.url + "/actions/bulk-delete",
                         {"task_ids": [failed[2], "w3", "w5"]}, good)
    assert status == 409 and "2 task(s) deleted; 1 refused: w5" in str(reply["message"])
    assert not client.get_task(failed[2], missing_ok=True).exists
    assert not client.get_task("w3", missing_ok=True).exists
    assert client.get_task("w5").status == "pending"
    for body in ({"task_ids": []}, {"task_ids": "w5"}, {"task_ids": [1]},
                 {"task_ids": ["x"] * 501}):
        status, reply = post(url, body, good)
        said = str(reply["message"])
        assert status == 409 and ("task_ids" in said or "at most 500" in said), body
    readonly = queue_page(dashboard, name="jobs")
    assert "select-task" in readonly  # with a token configured the boxes are there


def field_text(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}">(.*?)</(?:dd|p|span)>', page, re.S)
    assert found is not None, element_id
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip()


def test_the_redis_page_shows_version_memory_persistence_clients_and_replicas(
        redis_client: redis.Redis, dashboard: DashboardProcess) -> None:
    info = redis_client.info()
    status, page = get(dashboard.url + "/redis")
    assert status == 200 and 'href="/redis" class="current"' in page
    assert field_text(page, "redis-version").startswith(info["redis_version"])
    assert field_text(page, "redis-uptime") != "-"
    assert field_text(page, "maxmemory") == "no limit"
    assert field_text(page, "memory-policy") == "noeviction never evicts"
    assert re.fullmatch(r"[\d.]+ (B|KiB|MiB)", field_text(page, "memory-peak"))
    assert field_text(page, "aof") == "off" and field_text(page, "rdb") == "off"
    assert "restart of this Redis loses every task" in page  # the test server keeps nothing
    assert field_text(page, "last-bgsave") == "ok"
    assert field_text(page, "role") == "master" and field_text(page, "replica-count") == "0"
    assert int(field_text(page, "clients-connected").split()[0]) >= 1
    redis_client.config_set("appendonly", "yes")
    redis_client.config_set("save", "3600 1")
    redis_client.config_set("maxmemory", "64mb")
    try:
        port = redis_client.connection_pool.connection_kwargs["port"]
        with RedisServer() as replica:
            redis.Redis(port=replica.port).replicaof("127.0.0.1", port)
            wait_until(lambda: redis_client.info("replication")["connected_slaves"] == 1,
                       what="the replica connected")
            status, page = get(dashboard.url + "/redis")
            assert field_text(page, "replica-count") == "1"
            assert f"127.0.0.1:{replica.port}" in page
        assert field_text(page, "aof").startswith("on · last write ok")
        assert field_text(page, "rdb") == "save 3600 1"
        assert field_text(page, "maxmemory") == "64.0 MiB"
        assert "loses every task" not in page
    finally:  # the session's server: as it was
        redis_client.config_set("appendonly", "no")
        redis_client.config_set("save", "")
        redis_client.config_set("maxmemory", "0")


def chart_bars(page: str, queue: str) -> list[tuple[str, int, float]]:
    """(bar title's time, complete count, x) of each drawn bar of a queue's chart."""
    row = page[page.index(f'data-queue="{queue}"'):]
    row = row[: row.index("</tr>")]
    return [(when, int(done), float(x)) for when, done, x in re.findall(
        r"<g><title>([^<]*?)(?: \(hour\))?: (\d+) complete, [^<]*</title>"
        r'<rect class="ok" x="([\d.]+)"', row)]


def test_the_overview_charts_24_hours_and_7_days_from_hourly_counters(
        client: blueque.Client, redis_client: redis.Redis, dashboard: DashboardProcess) -> None:
    queue = client.get_queue("jobs")
    queue.enqueue_many(["{}"] * 3)
    for _ in range(2):
        task = client.get_listener("jobs").reserve()
        assert task is not None
        client.get_processor(task).start(4242)
        client.get_processor(task).complete("ok")
    client.cancel_task(queue.task_ids(PENDING)[0], "not wanted")
    now = client.store.now()
    hour = int(now // 3600 * 3600)
    key = client.store.keys.finished_per_hour("jobs", str(hour))
    assert redis_client.hgetall(key) == {"complete": "2", "cancelled": "1"}
    assert 691200 - 60 < redis_client.ttl(key) <= 691200
    # three days ago (as if counted then), and nine days ago (expired by then: never read)
    for days, done in ((3, 5), (9, 7)):
        redis_client.hset(client.store.keys.finished_per_hour("jobs", str(hour - days * 86400)),
                          "complete", done)
    day = get(dashboard.url + "/?range=24h")[1]
    assert 'class="tab current" data-range="24h"' in day and "finished per hour, last 24 h" in day
    # the newest bar (the one before it if the hour turned since)
    assert [(n, x) for _, n, x in chart_bars(day, "jobs")] in ([(2, 23 * 7.5)], [(2, 22 * 7.5)])
    assert "2 ok · 0 failed · 1 cancelled · 0 retried" in page_text(day)
    week = get(dashboard.url + "/?range=7d")[1]
    bars = chart_bars(week, "jobs")
    assert [n for _, n, _ in bars] == [5, 2]
    assert round(bars[1][2] - bars[0][2], 2) == round(72 * 180 / 168, 2)  # 72 hours apart
    assert "7 ok · 0 failed · 1 cancelled" in page_text(week)
    hourly = get(dashboard.url + "/")[1]  # the last hour, per minute, as before
    assert "finished per minute, last hour" in hourly
    assert [n for _, n, _ in chart_bars(hourly, "jobs")] == [2]
    assert get(dashboard.url + "/?range=bogus")[0] == 200  # the last hour


def end_runs(client: blueque.Client, queue: str, identity: str, outcomes: list[str]) -> None:
    """Runs of ``queue``'s tasks by a listener named ``identity``, ended as ``outcomes``."""
    client.get_queue(queue).enqueue_many(["{}"] * len(outcomes))
    listener = Listener(queue, client.store, identity=identity)
    for outcome in outcomes:
        task = listener.reserve()
        assert task is not None
        processor = client.get_processor(task)
        processor.start(4242)
        if outcome == "complete":
            processor.complete("ok")
        else:
            processor.fail("broken")


def test_the_nodes_page_lists_each_listeners_runs_live_and_gone(
        client: blueque.Client, redis_client: redis.Redis, dashboard: DashboardProcess) -> None:
    end_runs(client, "jobs", "gone-host_101", ["complete", "complete", "failed"])
    end_runs(client, "talk", "gone-host_101", ["complete"])
    end_runs(client, "jobs", "live-host_202", ["failed"])
    Listener("jobs", client.store, identity="gone-host_101").close()  # left cleanly
    client.store.write_listener_info("live-host_202", {"host": "live-host", "pid": "202"}, 60)
    Listener("jobs", client.store, identity="idle-host_303")  # registered, ran nothing
    client.store.write_listener_info("idle-host_303", {"host": "idle-host", "pid": "303"}, 60)
    counts = client.store.keys.listener_counts("jobs", "gone-host_101")
    assert redis_client.hgetall(counts) == {"complete": "2", "failed": "1"}
    assert 604800 - 60 < redis_client.ttl(counts) <= 604800
    seen = redis_client.zscore(client.store.keys.listeners_seen("jobs"), "gone-host_101")
    assert seen is not None and abs(seen - client.store.now()) < 60
    status, page = get(dashboard.url + "/nodes")
    assert status == 200
    history = page[page.index('id="listener-history"'):]
    found = {listener: re.sub(r"<[^>]+>|\s+", " ", cells).split()
             for listener, cells in re.findall(
                 r'<tr class="history-row" data-listener="([^"]+)">(.*?)</tr>', history, re.S)}
    assert list(found) == ["live-host_202", "gone-host_101"]  # latest first; idle: a card
    assert 'data-listener="idle-host_303"' in page
    # state, runs, complete, failed, retried, cancelled, preempted
    assert found["gone-host_101"][1:8] == ["gone", "4", "3", "1", "0", "0", "0"]
    assert found["live-host_202"][1:8] == ["live", "1", "0", "1", "0", "0", "0"]
    assert "jobs" in found["gone-host_101"] and "talk" in found["gone-host_101"]
    link = re.search(r'href="(/queue\?name=jobs&amp;node=gone-host_101[^"]*)"', history)
    assert link is not None
    shown = rows(get(dashboard.url + html.unescape(link.group(1)))[1])
    assert len(shown) == 2  # its complete runs of jobs, through the node filter


def test_a_7_day_overview_shows_fewer_queues_a_page(client: blueque.Client,
                                                    dashboard: DashboardProcess) -> None:
    """168 hourly reads a queue: 35 queues a page read about what 100 one-hour rows read."""
    for n in range(40):
        client.get_queue(f"q{n:02d}").enqueue("{}")
    week = get(dashboard.url + "/?range=7d")[1]
    assert week.count('class="queue-row"') == 35 and "queues 1 to 35 of 40" in week
    second = get(dashboard.url + "/?page=2&range=7d")[1]
    assert second.count('class="queue-row"') == 5
    assert 'href="/?page=1&amp;range=7d"' in second  # the pager keeps the span
    assert get(dashboard.url + "/")[1].count('class="queue-row"') == 40


def test_a_prefix_may_leave_out_the_queues_hash_tag(redis_url: str,
                                                     redis_client: redis.Redis) -> None:
    """In the hash-tagged layout stored ids start with {queue}: the prefix a user types
    (the id they gave) finds them, as does the stored form."""
    tagged = blueque.Client(redis_url, hash_tags=True)
    ids = tagged.get_queue("jobs").enqueue_many(["{}"] * 3,
                                                task_ids=["inv-1", "inv-2", "other"])
    assert list(ids) == ["{jobs}inv-1", "{jobs}inv-2", "{jobs}other"]
    for prefix in ("inv-", "{jobs}inv-"):
        found = scan(tagged.store, "jobs", PENDING, Filters(prefix=prefix), 0, 50)
        assert found.ids == ["{jobs}inv-1", "{jobs}inv-2"], prefix
        assert (found.start, found.stop, found.next_start) == (0, 2, None)
