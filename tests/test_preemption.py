"""Preemption with notice (issue 13), end to end: real `blueque listen` daemons on two node
names, real task processes, `blueque preempt` (run in-process) and SIGUSR1. A task told its
node goes away saves, stops and resumes elsewhere from its checkpoint without spending an
attempt; one that ignores the notice is terminated at the deadline and put back the same way;
a task preempted too often fails instead of looping."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import blueque
from blueque.keys import Keys
from tests.conftest import Done
from tests.daemons import Daemon, daemons, listen_command, wait_until

pytestmark = pytest.mark.slow

FAST = ("--interval", "0.5", "--poll", "0.1")
KEYS = Keys()


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Daemon]]:
    with daemons(tmp_path) as running:
        yield running


def listen(started: list[Daemon], tmp_path: Path, url: str, function: str, node: str,
           *options: str) -> Daemon:
    daemon = Daemon(listen_command(url, "work", f"tests.checkpoint_jobs:{function}", *FAST,
                                   "--node-name", node, *options),
                    tmp_path / f"daemon{len(started)}.log")
    started.append(daemon)
    return daemon


@pytest.fixture
def blueque_cli(blueque_main: Callable[..., Done]) -> Callable[..., Done]:
    """``blueque_cli(url, *arguments)``: the `blueque` command, in-process."""
    return lambda url, *arguments: blueque_main(*arguments, "--url", url)


def test_a_preempted_task_saves_stops_and_resumes_elsewhere_without_spending_an_attempt(  # type: ignore[no-untyped-def]
        client, redis_client, redis_url, started, tmp_path, blueque_cli) -> None:
    marker = tmp_path / "marker"
    n, k = 40, 5
    first = listen(started, tmp_path, redis_url, "count_until_preempted", "spot-a")
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "n": n, "k": k, "step": 0.05}), max_attempts=1)
    wait_until(lambda: sum(line.startswith("step 1 ") for line in lines(marker)) >= 12,
               what="a dozen steps done")
    told = time.time()
    done = blueque_cli(redis_url, "preempt", "--node", "spot-a", "--grace", "30s", "--json")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["node"] == "spot-a" and len(reply["listeners"]) == 1
    assert reply["deadline"] == pytest.approx(told + 30, abs=5)
    wait_until(lambda: any(line.startswith("preempted 1 ") for line in lines(marker)),
               what="the task saved and stopped")
    stopped_at = int(next(line for line in lines(marker) if line.startswith("preempted"))
                     .split()[2])
    assert first.process.wait(20) == 0  # handed back its only task, it exits
    assert "preempted, and every task it ran is handed back" in first.log()
    task = client.get_task(task_id)
    assert task.status == "pending" and task.data["preemptions"] == "1"
    assert redis_client.lrange(KEYS.pending("work"), -1, -1) == [task_id]  # next in line
    assert int(redis_client.hget(KEYS.outcome_counts("work"), "preempted")) == 1

    listen(started, tmp_path, redis_url, "count_until_preempted", "spot-b")
    task = client.get_task(task_id).wait(30)
    assert task.status == "complete", task.data  # max_attempts=1: the preemption spent none
    result = json.loads(task.result or "{}")
    assert result["resumed_from"] == stopped_at and result["attempt"] == 2
    steps = [line for line in lines(marker) if line.startswith("step ")]
    assert len(steps) == n  # nothing done twice: it saved at the step it stopped at
    assert int(redis_client.hget(KEYS.outcome_counts("work"), "complete")) == 1


def test_sigusr1_preempts_and_a_task_that_ignores_it_is_terminated_and_put_back(  # type: ignore[no-untyped-def]
        client, redis_client, redis_url, started, tmp_path, blueque_cli) -> None:
    marker, release = tmp_path / "marker", tmp_path / "release"
    first = listen(started, tmp_path, redis_url, "ignores_preemption", "spot-c",
                   "--preempt-grace", "2s")
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "release": str(release)}), max_attempts=1,
        kill_grace=1)
    wait_until(lambda: lines(marker), what="running")
    first.signal(signal.SIGUSR1)

    def shown_preempting() -> bool:
        status = blueque_cli(redis_url, "status")
        return "preempting: node goes away in" in status.stdout

    wait_until(shown_preempting, what="blueque status to show the preempting listener")
    assert first.process.wait(30) == 0  # at the deadline: terminated, handed back, exits
    task = client.get_task(task_id)
    assert task.status == "pending" and task.data["preemptions"] == "1"
    assert "SIGUSR1" in first.log() and "preempted" in task.data.get("preempted_reason", "")
    # the listener's own line, under its logger (it was blueque.child's, the task side's)
    assert any("blueque.daemon: listener" in line and "node spot-c goes away in" in line
               for line in first.log().splitlines()), first.log()
    release.touch()
    listen(started, tmp_path, redis_url, "ignores_preemption", "spot-d")
    task = client.get_task(task_id).wait(30)
    assert task.status == "complete" and task.result == "done by attempt 2"
    assert [line.split()[:2] for line in lines(marker)] == [["running", "1"], ["running", "2"]]


def test_a_task_preempted_more_than_its_limit_fails(  # type: ignore[no-untyped-def]
        client, redis_url, started, tmp_path, blueque_cli) -> None:
    marker = tmp_path / "marker"
    first = listen(started, tmp_path, redis_url, "count_until_preempted", "spot-e")
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "n": 400, "k": 5, "step": 0.05}),
        max_preemptions=0)
    wait_until(lambda: lines(marker), what="running")
    assert blueque_cli(redis_url, "preempt", "--node", "spot-e", "--grace", "20s").returncode == 0
    task = client.get_task(task_id).wait(20)
    assert task.status == "failed"
    assert "preempted 1 times, more than its max_preemptions of 0" in (task.error or "")
    assert first.process.wait(20) == 0


def test_a_listener_started_after_a_preemption_ended_takes_tasks_and_withdraw_works(  # type: ignore[no-untyped-def]
        client, redis_url, started, tmp_path, blueque_cli) -> None:
    """A request whose deadline has passed is over (the node is still here): a listener
    starting then ignores it. A withdrawn request is gone; withdrawing none exits 4."""
    assert blueque_cli(redis_url, "preempt", "--node", "spot-f", "--grace", "0").returncode == 0
    marker = tmp_path / "marker"
    listen(started, tmp_path, redis_url, "count_until_preempted", "spot-f")
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "n": 3, "k": 5, "step": 0.01}))
    assert client.get_task(task_id).wait(20).status == "complete"
    assert blueque_cli(redis_url, "preempt", "--node", "spot-f", "--withdraw").returncode == 0
    again = blueque_cli(redis_url, "preempt", "--node", "spot-f", "--withdraw")
    assert again.returncode == 4 and "no preemption of node spot-f" in again.stdout
    assert not blueque.Client(redis_url).store.preemption("spot-f")
