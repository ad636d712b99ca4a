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
from pathlib import Path
from urllib.parse import urlencode

import pytest
import redis

import blueque
from blueque import keys as k
from blueque.testing import RedisServer
from blueque.web.search import SCAN_LIMIT
from tests.daemons import wait_until
from tests.dashboard import DashboardProcess
from tests.test_dashboard import TOKEN, XSS, get, post, run


@pytest.fixture
def dashboard(redis_url: str, redis_client: redis.Redis, tmp_path: Path
              ) -> Iterator[DashboardProcess]:
    process = DashboardProcess(redis_url, tmp_path / "dashboard.log", token=TOKEN)
    yield process
    process.close()


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
    failed = queue.task_ids(k.FAILED)
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
    assert f"pending tasks 1 to {SCAN_LIMIT} of {total} (at most {SCAN_LIMIT} a page)" in text
    further = re.search(r'id="look-further" href="([^"]+)"', text)
    assert further is not None
    text = get(dashboard.url + html.unescape(further.group(1)))[1]
    assert rows(text) == [f"t{SCAN_LIMIT + 100 + n:05d}"[:-1] + str(n) for n in range(10)]
    assert f"pending tasks {SCAN_LIMIT + 1} to {total} of {total}" in text
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
    assert client.get_task(failed[2]).status is None and client.get_task("w3").status is None
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
