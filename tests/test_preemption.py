"""Preemption with notice (issue 13), end to end: real `blueque listen` daemons on two node
names, real task processes, `blueque preempt` (run in-process) and SIGUSR1. A task told its
node goes away saves, stops and resumes elsewhere from its checkpoint without spending an
attempt; one that ignores the notice is terminated at the deadline and put back the same way;
a task preempted too often fails instead of looping."""

from __future__ import annotations

import json
import logging
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

import blueque
from blueque.keys import Keys
from blueque.preemption import NodePreemption
from tests.conftest import Done
from tests.daemons import FAST, Daemon, listen_command, wait_until
from tests.readme import section_text

pytestmark = pytest.mark.slow

KEYS = Keys()


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


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


def test_an_adopted_run_that_ignores_the_preemption_is_put_back_not_failed(  # type: ignore[no-untyped-def]
        client, redis_client, redis_url, started, tmp_path, blueque_cli) -> None:
    """A listener SIGKILLed while its task runs leaves the run to the next listener of its
    node, which adopts it. When that node is preempted, the adopted run is told, and at the
    deadline terminated like a child of its own: its task goes back to pending as preempted
    (no attempt spent), not failed as a crash, and the preempted listener exits only once it
    is recorded. It used to leave the task started, and a sweep elsewhere then failed it
    (max_attempts=1) for a lease that stopped being renewed."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    first = listen(started, tmp_path, redis_url, "ignores_preemption", "spot-g")
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "release": str(release)}), max_attempts=1,
        kill_grace=1)
    wait_until(lambda: lines(marker), what="running")
    pid = int(lines(marker)[0].split()[2])
    first.kill()
    second = listen(started, tmp_path, redis_url, "ignores_preemption", "spot-g")
    wait_until(lambda: "1 adopted task(s)" in second.log(), what="the run adopted")
    assert blueque_cli(redis_url, "preempt", "--node", "spot-g", "--grace", "1s").returncode == 0
    assert second.process.wait(30) == 0
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    task = client.get_task(task_id)
    assert (task.status, task.attempts, task.data.get("preemptions")) == ("pending", 1, "1"), \
        task.data
    assert "preempted" in task.data.get("preempted_reason", "")
    assert redis_client.hget(KEYS.outcome_counts("work"), "preempted") == "1"
    release.touch()
    listen(started, tmp_path, redis_url, "ignores_preemption", "spot-h")
    task = client.get_task(task_id).wait(30)
    assert task.status == "complete" and task.result == "done by attempt 2"


def test_sigusr1_while_redis_is_away_warns_the_tasks_and_keeps_the_deadline(  # type: ignore[no-untyped-def]
        aof_server, started, tmp_path) -> None:
    """A spot machine's notice may come while Redis is away (a restart, a failover). SIGUSR1
    needs no Redis: the listener tells its tasks at once and terminates them at the deadline
    by its own clock, then records them as preempted once Redis is back. It used to act on
    the signal only when Redis answered again: its tasks heard nothing of the notice, and
    nothing stopped them at the deadline."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    client = blueque.Client(aof_server.url)
    first = listen(started, tmp_path, aof_server.url, "marks_preemption", "spot-u",
                   "--preempt-grace", "2s")
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "release": str(release)}), max_attempts=1,
        kill_grace=1)
    wait_until(lambda: lines(marker), what="running")
    pid = int(lines(marker)[0].split()[2])
    aof_server.kill()
    wait_until(lambda: "children keep running, retrying" in first.log(),
               what="the listener in its outage loop")
    first.signal(signal.SIGUSR1)
    wait_until(lambda: any(line.startswith("told ") for line in lines(marker)),
               what="the task told, Redis away")
    told = next(line for line in lines(marker) if line.startswith("told "))
    assert 0 < float(told.split()[1]) <= 2
    wait_until(lambda: not psutil.pid_exists(pid)
               or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
               what="the task terminated at the deadline, Redis away")
    assert first.alive()  # it cannot hand the task back yet
    aof_server.start()
    assert first.process.wait(30) == 0
    task = client.get_task(task_id)
    assert (task.status, task.attempts, task.data.get("preemptions")) == ("pending", 1, "1"), \
        task.data


def test_an_on_preempt_callback_that_raises_preempted_stops_the_task_where_it_is(  # type: ignore[no-untyped-def]
        client, redis_url, started, tmp_path, blueque_cli) -> None:
    """on_preempt's promise: a callback may raise blueque.Preempted to stop the task where it
    is. The exception used to be caught with any other a callback raises, logged, and the task
    went on until the deadline's SIGTERM."""
    marker = tmp_path / "marker"
    first = listen(started, tmp_path, redis_url, "stops_in_its_callback", "spot-k")
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker)}),
                                               max_attempts=1)
    wait_until(lambda: lines(marker), what="running")
    assert blueque_cli(redis_url, "preempt", "--node", "spot-k", "--grace", "60s").returncode == 0
    assert first.process.wait(30) == 0  # long before the deadline
    task = client.get_task(task_id)
    assert (task.status, task.data.get("preemptions")) == ("pending", "1"), task.data
    assert task.data["preempted_reason"] == "stopped by its on_preempt callback"
    assert lines(marker) == ["running 1", "stopping 1"]
    listen(started, tmp_path, redis_url, "stops_in_its_callback", "spot-l")
    task = client.get_task(task_id).wait(30)
    assert (task.status, task.result) == ("complete", "resumed")


def test_a_preemption_with_no_grace_stops_a_running_listener_at_once(  # type: ignore[no-untyped-def]
        client, redis_url, started, tmp_path, blueque_cli) -> None:
    """`blueque preempt --grace 0` (the node goes now) reaches a running listener after its
    deadline, by a few milliseconds: it is not an old request left over from before the
    listener started, so the listener acts on it. It used to be ignored as "ended", while
    the command told the operator that the listener took no more tasks."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    first = listen(started, tmp_path, redis_url, "ignores_preemption", "spot-n")
    task_id = client.get_queue("work").enqueue(
        json.dumps({"marker": str(marker), "release": str(release)}), max_attempts=1,
        kill_grace=1)
    wait_until(lambda: lines(marker), what="running")
    assert blueque_cli(redis_url, "preempt", "--node", "spot-n", "--grace", "0").returncode == 0
    assert first.process.wait(20) == 0
    task = client.get_task(task_id)
    assert (task.status, task.attempts, task.data.get("preemptions")) == ("pending", 1, "1"), \
        task.data


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


def test_the_listeners_preemption_lines_are_logged_as_the_listeners(  # type: ignore[no-untyped-def]
        client, caplog) -> None:
    """An operator filtering the listener's log (its "logger" field in --log-format json)
    sees its preemption with its other lines: they came as blueque.child, the task's side."""
    preemption = NodePreemption(client.store, "spot-q", "spot-q_1", time.monotonic)
    with caplog.at_level(logging.INFO):
        assert preemption.announce(time.time() + 60, "SIGUSR1", lambda message, signum: 0, [])
    assert [(r.name, r.levelname) for r in caplog.records] == [("blueque.daemon", "WARNING")]
    assert "spot-q goes away in" in caplog.records[0].getMessage()


# --- the tutorial's example ---------------------------------------------------------------
def readme_blocks(language: str) -> list[str]:
    """The ```python or ```sh blocks of the tutorial's "Long jobs that resume" section
    (docs/tutorial.md), in order."""
    section = section_text("tutorial.md", "Long jobs that resume")
    return re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)


def test_the_readme_preemption_example_runs_as_written(  # type: ignore[no-untyped-def]
        client, redis_url, started, tmp_path, blueque_cli) -> None:
    """The README's render_frames with preempted(), as its task function under real
    listeners (its render() writes the frame to a file), its enqueue line and its
    `blueque preempt` line: the task stops at the frame it reached, goes back to pending, and
    a listener of another node renders the rest, no frame twice, at max_attempts=3."""
    _, enqueue, function = readme_blocks("python")[:3]
    frames = tmp_path / "frames"
    package = tmp_path / "project" / "mypackage"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(
        f"import time\n\n\ndef render(frame):\n    time.sleep(0.05)\n"
        f"    with open({str(frames)!r}, 'a') as out:\n        out.write(f'{{frame}}\\n')\n\n\n"
        + function)

    def listen_here(node: str) -> Daemon:
        daemon = Daemon(listen_command(redis_url, "frames", "mypackage.jobs:render_frames",
                                       *FAST, "--node-name", node),
                        tmp_path / f"daemon{len(started)}.log", cwd=tmp_path / "project")
        started.append(daemon)
        return daemon

    first = listen_here("spot-7")
    assert 'max_attempts=3' in enqueue
    namespace = {"queue": client.get_queue("frames"), "json": json}
    exec(enqueue.replace("5000", "60").replace("queue.enqueue(", "task_id = queue.enqueue("),
         namespace)  # the README's own line
    task_id = str(namespace["task_id"])
    wait_until(lambda: len(lines(frames)) >= 10, what="ten frames rendered")
    preempt = next(line for line in readme_blocks("sh")[0].splitlines()
                   if line.startswith("blueque preempt --node spot-7 --grace"))
    done = blueque_cli(redis_url, *preempt.split("#")[0].split()[1:])
    assert done.returncode == 0, done.stderr
    assert first.process.wait(20) == 0
    task = client.get_task(task_id)
    assert (task.status, task.data.get("preemptions")) == ("pending", "1"), task.data
    stopped_at = json.loads(task.checkpoint or "{}")["next"]
    assert task.data["preempted_reason"] == f"stopped at frame {stopped_at}"
    listen_here("spot-8")
    task = client.get_task(task_id).wait(30)
    assert task.status == "complete" and json.loads(task.result or "{}") == {"frames": 60}
    assert [int(line) for line in lines(frames)] == list(range(60))  # none twice
