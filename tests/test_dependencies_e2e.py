"""Task dependencies end to end (issue 22): real listener daemons run the parents, and their
endings release or end the dependents — a chain, a fan-in of 10,000 over two queues and two
listeners, failure and cancel cascades, a dependent enqueued after its parents ended."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest
import redis

import blueque
from blueque.testing import RedisServer
from tests.daemons import (
    Daemon,
    kill_session_children,
    lines,
    listen_command,
    wait_until,
)
from tests.readme import block, commands
from tests.test_cli import ROOT, cli, environment

pytestmark = pytest.mark.slow


def _listen(started: list[Daemon], url: str, queues: str, tmp_path: Path, name: str,
            function: str = "tests.dependency_jobs:adds", *options: str) -> None:
    started.append(Daemon(listen_command(url, queues, function, "--interval", "0.5",
                                         "--poll", "0.1", *options),
                          tmp_path / f"{name}.log"))


def test_a_chain_of_three_runs_in_order_each_reading_the_previous_result(
        redis_url: str, client: blueque.Client, tmp_path: Path,
        started: list[Daemon]) -> None:
    marker = tmp_path / "runs"
    queue = client.get_queue("chain")
    first = queue.enqueue(json.dumps({"value": 1, "marker": str(marker)}))
    second = queue.enqueue(json.dumps({"value": 10, "marker": str(marker)}), after=first)
    third = client.get_queue("chain-end").enqueue(
        json.dumps({"value": 100, "marker": str(marker)}), after=second)
    assert client.get_task(third).status == "waiting"
    _listen(started, redis_url, "chain,chain-end", tmp_path, "listener")
    assert client.get_task(third).wait(timeout=60).result == "111"
    assert lines(marker) == [f"ran {first}", f"ran {second}", f"ran {third}"]
    assert [t.status for t in client.get_task(third).parents()] == ["complete"]


@pytest.mark.timeout(1200)  # 10,000 task processes on a shared machine
def test_a_fan_in_of_ten_thousand_on_two_queues_releases_its_dependent_once(
        redis_url: str, client: blueque.Client, redis_client: redis.Redis, tmp_path: Path,
        started: list[Daemon]) -> None:
    marker = tmp_path / "assembled"
    pages = [client.get_queue(q).enqueue_many(["{}"] * 5000) for q in ("pages-a", "pages-b")]
    parents = [*pages[0], *pages[1]]
    book = client.get_queue("book").enqueue(json.dumps({"marker": str(marker)}),
                                            after=parents)
    assert client.get_task(book).status == "waiting"
    assert len(client.get_task(book).awaiting()) == 10_000
    _listen(started, redis_url, "pages-a,book", tmp_path, "a",
            "tests.dependency_jobs:counts_parents", "--concurrency", "4")
    _listen(started, redis_url, "pages-b,book", tmp_path, "b",  # warm processes on this one
            "tests.dependency_jobs:counts_parents", "--concurrency", "4", "--reuse", "50")
    done = client.get_task(book).wait(timeout=900)
    assert json.loads(done.result or "")["complete"] == 10_000
    assert lines(marker) == [f"ran {book}"]  # released once, run once
    assert done.attempts == 1
    assert all(client.get_queue(q).stats().complete == 5000 for q in ("pages-a", "pages-b"))
    assert not redis_client.exists(f"blueque_awaits_{book}")
    assert not any(redis_client.exists(f"blueque_dependents_{p}") for p in parents[:100])


def test_a_failure_ends_three_levels_of_dependents_naming_their_parent(
        redis_url: str, client: blueque.Client, tmp_path: Path,
        started: list[Daemon]) -> None:
    marker = tmp_path / "runs"
    queue = client.get_queue("cascade")
    root = queue.enqueue(json.dumps({"fail": "the scan was blank", "marker": str(marker)}))
    levels = [root]
    for depth in range(3):
        levels.append(client.get_queue(f"cascade-{depth}").enqueue(
            json.dumps({"marker": str(marker)}), after=levels[-1]))
    _listen(started, redis_url, "cascade,cascade-0,cascade-1,cascade-2", tmp_path, "listener")
    for child, parent in zip(levels[1:], levels, strict=False):
        task = client.get_task(child).wait(timeout=60)
        assert task.status == "failed" and not task.cancelled
        assert (task.error or "").startswith(f"parent {parent} failed: ")
        assert "the scan was blank" in (task.error or "")
    assert lines(marker) == [f"ran {root}"]  # no dependent ever ran


def test_cancelling_a_running_parent_ends_three_levels_of_dependents(
        redis_url: str, client: blueque.Client, tmp_path: Path,
        started: list[Daemon]) -> None:
    marker, release = tmp_path / "marks", tmp_path / "release"
    _listen(started, redis_url, "work", tmp_path, "listener", "tests.jobs:acts")
    root = client.get_queue("work").enqueue(json.dumps(
        {"marker": str(marker), "release": str(release)}))
    levels = [root]
    for _ in range(3):
        levels.append(client.get_queue("work").enqueue("{}", after=levels[-1]))
    wait_until(lambda: lines(marker), what="the root task to start")
    assert client.cancel_task(root, "wrong input") == "requested"
    for child, parent in zip(levels[1:], levels, strict=False):
        task = client.get_task(child).wait(timeout=60)
        assert task.status == "failed"
        assert (task.error or "").startswith(f"parent {parent} was cancelled: "
                                             if parent == root else f"parent {parent} failed: ")
    assert client.get_task(root).state == "cancelled"
    assert client.get_queue("work").stats().waiting == 0


def test_a_dependent_enqueued_after_its_parents_ended_runs_at_once(
        redis_url: str, client: blueque.Client, tmp_path: Path,
        started: list[Daemon]) -> None:
    queue = client.get_queue("late")
    parents = [queue.enqueue(json.dumps({"value": n})) for n in (1, 2)]
    _listen(started, redis_url, "late", tmp_path, "listener")
    for parent in parents:
        client.get_task(parent).wait(timeout=60)
    late = queue.enqueue(json.dumps({"value": 100}), after=parents)
    assert client.get_task(late).status in ("pending", "reserved", "started", "complete")
    assert client.get_task(late).wait(timeout=60).result == "103"


# --- the tutorial's section, as written -------------------------------------------------------
DEPENDENCIES = "Tasks that wait for other tasks"  # the tutorial's section


def test_the_readme_dependency_example_runs_as_written(
        redis_url: str, client: blueque.Client, tmp_path: Path,
        started: list[Daemon]) -> None:
    function, producer = (block(DEPENDENCIES, n, "tutorial.md").text for n in (1, 2))
    assert function.startswith("# mypackage/book.py\n")
    assert producer.count('"redis://localhost:6379/0"') == 1
    project = tmp_path / "project"
    (project / "mypackage").mkdir(parents=True)
    (project / "mypackage" / "__init__.py").write_text("")
    (project / "mypackage" / "book.py").write_text(function)
    started.append(Daemon([sys.executable, str(ROOT / "bin" / "blueque"), "listen",
                           "pages,books", "mypackage.book:work", "--url", redis_url,
                           "--concurrency", "2", "--interval", "0.5", "--poll", "0.1"],
                          tmp_path / "listen.log", cwd=project))
    done = subprocess.run(
        [sys.executable, "-c", producer.replace('"redis://localhost:6379/0"', repr(redis_url))],
        capture_output=True, text=True, env=environment(), cwd=project, timeout=300)
    assert done.returncode == 0, done.stderr + started[0].log()
    assert done.stdout.splitlines() == ["waiting", '{"pages": 100, "words": 15050}',
                                        "complete"]


def test_the_readme_dependency_commands_run_as_written(redis_url: str,
                                                       client: blueque.Client) -> None:
    outputs = []
    for line in commands(block(DEPENDENCIES, 3, "tutorial.md").text):
        words = shlex.split(line.split("  #", 1)[0])
        assert words[0] == "blueque"
        done = cli(redis_url, *words[1:])
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert "waiting for 2 of 2 parent(s) to end (runs when all complete): " \
           "page-1 (pending), page-2 (pending)" in outputs[3]
    book = client.get_task("book-1")
    assert book.status == "failed"
    assert book.error == "parent page-2 was cancelled: cancelled: by operator"


def test_the_dependency_benchmark_runs() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.dependencies", "--smoke"],
                          capture_output=True, text=True, env=environment(), cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    lines_ = done.stdout.splitlines()
    assert [line.split("  ")[0] for line in lines_] == [
        "enqueue without after=", "enqueue with after= (one parent)",
        "parent's end -> dependent starts", "Redis memory per dependency edge"]


#: Fan-ins of the crash test (the issue's figure; BLUEQUE_CRASH_FANINS=50 for a quick run).
CRASH_FANINS = int(os.environ.get("BLUEQUE_CRASH_FANINS", "1000"))


@pytest.mark.timeout(1500)  # 21,000 task processes on a shared machine
def test_crashes_leave_every_dependent_ended_once_and_none_waiting(
        aof_server: RedisServer, tmp_path: Path, started: list[Daemon]) -> None:
    """1,000 fan-ins of 20 parents each (on two queues) run by listeners (a process per task
    and warm processes); meanwhile a listener is SIGKILLed with its task processes, a parent
    is cancelled, and Redis is SIGKILLed and started again from its append-only file. Every
    dependent ends, once."""
    client = blueque.Client(aof_server.url)
    for queue in ("crash-a", "crash-b", "crash-deps"):
        client.get_queue(queue).configure(max_attempts=5, retry_backoff=0.1)
    fanins = []
    for n in range(CRASH_FANINS):
        parents = [*client.get_queue("crash-a").enqueue_many(["{}"] * 10),
                   *client.get_queue("crash-b").enqueue_many(["{}"] * 10)]
        fanins.append(client.get_queue("crash-deps").enqueue(
            json.dumps({"marker": str(tmp_path / "runs")}), task_id=f"fanin-{n}",
            after=parents))
    # a process per task on the first (SIGKILLed below), warm processes on the others
    for name, reuse in (("first", "1"), ("second", "50")):
        _listen(started, aof_server.url, "crash-a,crash-b,crash-deps", tmp_path, name,
                "tests.dependency_jobs:counts_parents", "--concurrency", "4", "--reuse", reuse)
    stats = client.get_queue("crash-deps").stats
    wait_until(lambda: stats().complete >= CRASH_FANINS // 20, timeout=300,
               what="some fan-ins to complete")
    kill_session_children([c.pid for c in psutil.Process(started[0].pid).children(True)])
    started[0].kill()
    doomed = _cancel_a_waiting_parent(client, fanins)
    aof_server.kill()
    aof_server.start()
    _listen(started, aof_server.url, "crash-a,crash-b,crash-deps", tmp_path, "third",
            "tests.dependency_jobs:counts_parents", "--concurrency", "4", "--reuse", "50")
    wait_until(lambda: stats().waiting == 0 and stats().complete + stats().failed
               == CRASH_FANINS, timeout=900, what="every fan-in to end")
    runs = Counter(line.split()[1] for line in lines(tmp_path / "runs"))
    for task_id in fanins:
        task = client.get_task(task_id)
        ended = [h["outcome"] for h in task.history if h["outcome"] in ("complete", "failed")]
        if task_id == doomed:
            assert task.status == "failed" and "was cancelled" in (task.error or "")
            assert runs[task_id] == 0
            continue
        assert task.status == "complete", (task_id, task.data)
        assert json.loads(task.result or "")["complete"] == 20
        assert ended == ["complete"] and 1 <= runs[task_id] <= (task.attempts or 0)
    assert client.redis.llen(client.keys.pending("crash-deps")) == 0


def _cancel_a_waiting_parent(client: blueque.Client, fanins: list[str]) -> str:
    """Cancel a parent not yet run of the last waiting fan-in; returns that fan-in."""
    for task_id in reversed(fanins):
        if client.get_task(task_id).status != "waiting":
            continue
        for parent in client.get_task(task_id).awaiting():
            try:
                if client.cancel_task(parent, "crash test") == "cancelled":
                    return task_id
            except blueque.InvalidTaskState:
                continue
    raise AssertionError("no parent left to cancel")
