"""Old fields never look current (issue 21 item 7): each run's ending is kept in the task's
``history`` (PROTOCOL.md 3.2), written by the script that records the ending, and the current
fields describe the current attempt only.

Contract tests through the Processor and the store (both sync clients, fakeredis included),
then `blueque show` and the dashboard's task page on a task a real listener ran twice."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import redis

import blueque
from blueque import protocol
from blueque.keys import Keys
from blueque.store import load_script
from tests.daemons import Daemon, listen_command, wait_until
from tests.dashboard import DashboardProcess
from tests.test_cli import cli

K = Keys()
LUA = Path(__file__).resolve().parent.parent / "blueque" / "lua"


def reserved(client: blueque.Client, queue: str = "q") -> tuple[blueque.Task, str]:
    listener = client.get_listener(queue)
    task = listener.reserve()
    assert task is not None
    return task, listener.id


def start_run(client: blueque.Client, pid: int = 4242) -> tuple[blueque.Processor, str]:
    task, listener = reserved(client)
    processor = client.get_processor(task)
    processor.start(pid)
    return processor, listener


def test_a_task_completed_on_its_second_attempt_shows_no_error_of_the_first(
        any_client: blueque.Client) -> None:
    r = any_client.redis
    task_id = any_client.get_queue("q").enqueue("{}", max_attempts=2)
    first, listener = start_run(any_client)
    first.retry("ValueError: bad page", time.time() - 1, traceback="Traceback ...\nValueError")
    data = r.hgetall(K.task(task_id))
    assert data["status"] == "scheduled" and data["error"] == "ValueError: bad page"
    # waiting for its next attempt: no run of it is current
    assert not {"node", "pid", "started_at", "progress"} & set(data)
    assert any_client.get_queue("q").enqueue_due_tasks() == [task_id]
    assert "eta" not in r.hgetall(K.task(task_id))  # no longer scheduled
    second, _ = start_run(any_client, pid=4343)
    data = r.hgetall(K.task(task_id))
    assert "error" not in data and "traceback" not in data  # the new attempt's are its own
    second.complete("done")
    task = any_client.get_task(task_id)
    assert (task.status, task.result, task.error) == ("complete", "done", None)
    assert "traceback" not in task.data and "eta" not in task.data
    assert task.node == listener and task.pid == 4343  # the current (last) run's
    history = task.history
    assert [(h["attempt"], h["outcome"]) for h in history] == [(1, "retry"), (2, "complete")]
    assert history[0]["error"] == "ValueError: bad page" and history[0]["node"] == listener
    assert history[0]["pid"] == 4242 and history[0]["eta"] < history[0]["at"]
    assert history[1]["pid"] == 4343 and "error" not in history[1]
    assert history[1]["at"] >= history[1]["started"] >= history[0]["at"]


def same_entry(shown: dict[str, object], stored: dict[str, object]) -> bool:
    """Two history entries of one ending: the same keys and values, times within 0.1 ms (a
    stored entry's are rounded there: cjson's 14 digits)."""
    if set(shown) != set(stored):
        return False
    return all(abs(float(value) - float(stored[key])) < 2e-4  # type: ignore[arg-type]
               if key in ("at", "started") else value == stored[key]
               for key, value in shown.items())


def test_a_finished_tasks_last_ending_is_its_fields_and_is_written_once(
        any_client: blueque.Client) -> None:
    """Issue 29: finish.lua appends no entry when it completes or fails a run (the fields say
    it: PROTOCOL.md 3.2), nor keeps finished_at (its updated) or pid_created; the readers show
    that ending all the same, and retry_failed writes it before it clears those fields."""
    r = any_client.redis
    queue = any_client.get_queue("q")
    done = queue.enqueue("{}", max_attempts=2)
    first, listener = start_run(any_client)
    first.retry("ValueError: bad page", time.time() - 1)
    queue.enqueue_due_tasks()
    second, _ = start_run(any_client, pid=4343)
    second.complete("done")
    stored = json.loads(r.hget(K.task(done), "history") or "[]")
    assert [(h["attempt"], h["outcome"]) for h in stored] == [(1, "retry")]  # only the first
    assert [(h["attempt"], h["outcome"]) for h in any_client.get_task(done).history] == [
        (1, "retry"), (2, "complete")]

    failed = queue.enqueue("{}")
    run, _ = start_run(any_client, pid=4444)
    run.fail("é" * 400, traceback="Traceback ...\nValueError")
    data = r.hgetall(K.task(failed))
    assert not {"history", "finished_at", "pid_created"} & set(data)
    task = any_client.get_task(failed)
    assert task.finished_at == float(data["updated"])
    [shown] = task.history
    assert shown == {"attempt": 1, "outcome": "failed", "at": float(data["updated"]),
                     "node": listener, "pid": 4444, "started": float(data["started_at"]),
                     "error": "é" * 250 + "..."}  # cut as the scripts cut it
    cancelled = queue.enqueue("{}")
    run, _ = start_run(any_client)
    run.record(replace(run.run_end("failed", "cancelled: wrong input (its process group was "
                                   "terminated)"), cancelled=True))
    [entry] = any_client.get_task(cancelled).history
    assert (entry["outcome"], entry["error"]) == (
        "cancelled", "cancelled: wrong input (its process group was terminated)")
    any_client.retry_task(failed)  # the fields go: their entry is written first (the twin)
    stored = json.loads(r.hget(K.task(failed), "history") or "[]")
    assert [h["outcome"] for h in stored] == ["failed", "retried"]
    assert same_entry(shown, stored[0]), (shown, stored[0])
    assert any_client.get_task(failed).history == stored


def test_a_task_finished_before_issue_29_reads_as_it_did(any_client: blueque.Client) -> None:
    """Its history holds its last ending already, and it has finished_at: the readers add
    no second entry from its fields, nor does retry_failed write one."""
    r = any_client.redis
    queue = any_client.get_queue("q")
    for status in ("complete", "failed"):
        task_id = queue.enqueue("{}")
        entry = {"attempt": 1, "outcome": status, "at": 1700000100.1234, "node": "old_1",
                 "pid": 7, "started": 1700000000.5}
        if status == "failed":
            entry["error"] = "boom"
        r.hset(K.task(task_id), mapping={
            "status": status, "attempts": "1", "node": "old_1", "pid": "7",
            "started_at": "1700000000.5", "finished_at": "1700000100.123412",
            "updated": "1700000100.123412", "error": "boom", "history": json.dumps([entry])})
        task = any_client.get_task(task_id)
        assert task.history == [entry] and task.finished_at == 1700000100.123412
    r.lpush(K.failed("q"), task_id)
    any_client.retry_task(task_id)
    assert [h["outcome"] for h in any_client.get_task(task_id).history] == ["failed",
                                                                            "retried"]


def test_a_recovered_or_cancelled_ending_is_written_once(client: blueque.Client) -> None:
    """The scripts that end a task otherwise (recover's failed verdict, a cancel) still
    write their entry, with what the fields do not say (recovered, was): the readers see
    that it is the one the fields say, and add no other."""
    queue = client.get_queue("q")
    task_id = queue.enqueue("{}")
    listener = client.get_listener("q")
    running = listener.reserve()
    assert running is not None
    client.get_processor(running).start(4242)
    client.redis.zadd(K.leases("q"), {listener.id: 1})
    counts = client.store.recover("q", listener.id, [(task_id, "1", "failed", None, "it died")],
                                  time.time(), mode="lease")
    assert counts[2] == 1  # failed
    [entry] = client.get_task(task_id).history
    assert (entry["outcome"], entry["recovered"]) == ("failed", True)
    assert "pid_created" not in client.redis.hgetall(K.task(task_id))
    waiting = queue.enqueue("{}")
    assert client.cancel_task(waiting, "not needed") == "cancelled"
    [entry] = client.get_task(waiting).history
    assert (entry["outcome"], entry["was"]) == ("cancelled", "pending")


def test_a_failed_task_keeps_no_eta_and_a_preempted_one_no_node(
        any_client: blueque.Client) -> None:
    r = any_client.redis
    task_id = any_client.get_queue("q").schedule("{}", time.time() + 3600)
    r.zadd(K.scheduled("q"), {task_id: 1})  # due long ago: the scheduler moves it now
    assert any_client.get_queue("q").enqueue_due_tasks() == [task_id]
    processor, _ = start_run(any_client)
    processor.progress(0.5, "half way")
    processor.preempt("the node goes away")
    data = r.hgetall(K.task(task_id))
    assert data["status"] == "pending" and data["preempted_reason"] == "the node goes away"
    assert not {"node", "pid", "pid_created", "started_at", "progress", "progress_message",
                "eta"} & set(data)
    processor.preempt("the node goes away")  # repeated after a lost reply: told by history
    assert r.hget(K.task(task_id), "preemptions") == "1"
    second, _ = start_run(any_client)
    second.fail("for good")
    task = any_client.get_task(task_id)
    assert task.status == "failed" and task.eta is None and task.error == "for good"
    assert [(h["attempt"], h["outcome"]) for h in task.history] == [(1, "preempted"),
                                                                     (2, "failed")]
    assert task.history[0]["error"] == "the node goes away"


def test_recovery_records_each_verdict_and_puts_tasks_back_without_their_run(
        client: blueque.Client) -> None:
    r = client.redis
    queue = client.get_queue("q")
    ids = [queue.enqueue("{}", max_attempts=3) for _ in range(3)]
    listener = client.get_listener("q")
    reserved_only = listener.reserve()
    running = listener.reserve()
    never_stamped = r.lmove(K.pending("q"), K.reserved("q", listener.id), "RIGHT", "LEFT")
    assert reserved_only is not None and running is not None and never_stamped == ids[2]
    client.get_processor(running).start(4242)
    r.zadd(K.leases("q"), {listener.id: 1})
    eta = time.time() + 60
    assert client.store.recover("q", listener.id, [
        (reserved_only.id, "1", "pending", None, ""),
        (running.id, "1", "retry", eta, "listener gone: killed"),
        (never_stamped, "", "pending", None, "")], time.time(), mode="lease") == [2, 1, 0, 0, 0]
    back = client.get_task(reserved_only.id)
    assert back.status == "pending" and back.node is None
    assert [(h["attempt"], h["outcome"], h["node"]) for h in back.history] == [
        (1, "requeued", listener.id)]
    retried = client.get_task(running.id)
    assert retried.status == "scheduled" and retried.node is None and retried.pid is None
    assert [(h["outcome"], h["pid"], h["error"], h["eta"]) for h in retried.history] == [
        ("retry", 4242, "listener gone: killed", pytest.approx(eta))]
    assert client.get_task(never_stamped).history == []  # no attempt of it was counted


def test_the_history_keeps_the_last_twenty_endings_and_whole_characters(
        any_client: blueque.Client) -> None:
    r = any_client.redis
    task_id = any_client.get_queue("q").enqueue("{}", max_attempts=100)
    long_error = "é" * 400  # 800 bytes: cut at 500, between two characters
    for _ in range(23):
        processor, _ = start_run(any_client)
        processor.retry(long_error, time.time() - 1)
        any_client.get_queue("q").enqueue_due_tasks()
    history = any_client.get_task(task_id).history
    assert len(history) == protocol.HISTORY_KEEP == 20
    assert [h["attempt"] for h in history] == list(range(4, 24))
    assert history[-1]["error"] == "é" * 250 + "..."
    assert r.hget(K.task(task_id), "error") == long_error  # the current field is whole
    r.hset(K.task(task_id), "history", "not json")  # a corrupt field starts afresh
    processor, _ = start_run(any_client)
    processor.complete("ok")
    assert [h["outcome"] for h in any_client.get_task(task_id).history] == ["complete"]


def test_a_cancel_of_a_waiting_or_retrying_task_is_its_history_too(
        contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue("q")
    task_id = queue.enqueue("{}", max_attempts=2)
    processor, _ = start_run(contract_client)
    processor.retry("first try", time.time() + 600, traceback="Traceback ...")
    assert contract_client.cancel_task(task_id, "not needed") == "cancelled"
    task = contract_client.get_task(task_id)
    assert task.eta is None and "traceback" not in task.data  # the retry's, gone
    assert [(h["outcome"], h.get("was")) for h in task.history] == [("retry", None),
                                                                   ("cancelled", "scheduled")]
    assert task.history[-1]["error"] == "cancelled: not needed"


def test_every_script_that_writes_history_uses_the_one_history_library() -> None:
    """The history is written in one place (lua/lib/history.lua, which every script that
    writes it includes with ``-- uses: history``): it keeps HISTORY_KEEP entries and
    HISTORY_ERROR_BYTES of an error, and no script writes the field itself."""
    library = (LUA / "lib" / "history.lua").read_text()
    assert f"while #list > {protocol.HISTORY_KEEP} do" in library
    assert library.count(str(protocol.HISTORY_ERROR_BYTES)) >= 3
    def writes_history(path: Path) -> bool:  # itself, or through a library (lib/stamp)
        return bool(re.search(r"remember\(|with_entry\(|added\(|with_last\(",
                              load_script(path.stem).replace(library, "")))

    users = [path for path in sorted(LUA.glob("*.lua")) if writes_history(path)]
    assert {path.name for path in users} >= {"finish.lua", "recover.lua", "cancel.lua",
                                            "cancel_pending.lua", "cancel_scheduled.lua",
                                            "stamp.lua", "take.lua", "retry_failed.lua",
                                            "tell.lua", "reclaim.lua"}
    for path in [*sorted(LUA.glob("*.lua")), *sorted((LUA / "lib").glob("*.lua"))]:
        body = path.read_text()
        if path.name == "history.lua":
            continue
        # the field is written only with the value the library made (with_entry)
        assert set(re.findall(r"'history',\s*([^\s)]+)", body)) <= {"history"}, path.name
        if "'history', history" in body:
            assert re.search(r"local history = (with_entry|added|with_last)\(", body), path.name
        if path in users:
            assert "-- uses: history" in body, path.name
            assert library in load_script(path.stem), path.name


# --- as an operator sees it -----------------------------------------------------------------
@pytest.mark.slow
def test_show_and_the_task_page_tell_the_current_attempt_from_the_history(
        redis_url: str, client: blueque.Client, redis_client: redis.Redis, tmp_path: Path,
        started: list[Daemon]) -> None:
    pytest.importorskip("starlette", reason="the dashboard needs the web extra")
    started.append(Daemon(listen_command(redis_url, "work", "tests.jobs:flaky", "--interval",
                                           "0.5", "--poll", "0.1"), tmp_path / "listener.log"))
    task_id = client.get_queue("work").enqueue(json.dumps({"succeed_on": 2}), max_attempts=2,
                                               retry_backoff=0.2)
    wait_until(lambda: client.get_task(task_id).status == "complete", timeout=30,
               what="attempt 2 completes")
    task = client.get_task(task_id)
    assert task.error is None and "traceback" not in task.data and task.eta is None
    assert [(h["attempt"], h["outcome"]) for h in task.history] == [(1, "retry"), (2, "complete")]
    assert "attempt 1 failed" in task.history[0]["error"]

    shown = cli(redis_url, "show", task_id)
    assert shown.returncode == 0, shown.stderr
    history = shown.stdout[shown.stdout.index("history:"):]
    assert re.search(r"^ *1 +retry .*attempt 1 failed", history, re.M), history
    assert re.search(r"^ *2 +complete ", history, re.M), history
    assert "RuntimeError" not in shown.stdout.split("history:")[0]  # no error field shown
    record = json.loads(cli(redis_url, "show", task_id, "--json").stdout)
    assert [h["outcome"] for h in record["history"]] == ["retry", "complete"]

    dashboard = DashboardProcess(redis_url, tmp_path / "dashboard.log")
    try:
        with urllib.request.urlopen(f"{dashboard.url}/task?id={task_id}", timeout=10) as reply:
            page = reply.read().decode()
    finally:
        dashboard.close()
    assert 'id="error"' not in page and 'id="traceback"' not in page  # no red box
    table = page[page.index('id="history"'):page.index("</table>", page.index('id="history"'))]
    assert table.count("<tr>") == 3  # its header and the two runs
    assert "attempt 1 failed" in table and 'class="outcome-complete">complete' in table
