"""Warm task processes (PROTOCOL.md 6.7, ``blueque listen --reuse N``), end to end with real
processes: each task in a warm process gets its own attempt, stamp, output file, progress,
checkpoint and outcome; a warm process killed between two tasks or in the middle of one, one
stopped by a time limit or a cancel, and a listener SIGKILLed while warm processes live: every
task runs once, its ending is recorded once, and the node never holds more task processes than
--concurrency."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import psutil
import pytest

import blueque
from blueque.daemon.warm import WarmProcesses
from blueque.keys import Keys
from blueque.preemption import notice, on_preempt
from blueque.task_process import warm
from tests.daemons import (
    FAST,
    Daemon,
    gone,
    lines,
    listen_command,
    task_processes,
    wait_until,
)
from tests.test_reporting import outcomes
from tests.test_reporting import start as reporting_start

pytestmark = pytest.mark.slow

KEYS = Keys()


def start(started: list[Daemon], tmp_path: Path, url: str, *options: str,
          failpoints: str = "") -> Daemon:
    """test_reporting's listener, running tests.jobs:acts with its output in files."""
    return reporting_start(started, tmp_path, url, "--log-dir", str(tmp_path / "task-logs"),
                           *options, failpoints=failpoints, function="tests.jobs:acts")



def idle(daemon: Daemon) -> list[int]:
    """The listener's warm processes waiting for a task (its fork server's children)."""
    found = []
    for process in psutil.Process(daemon.pid).children(recursive=True):
        try:
            if process.cmdline()[:1] == ["blueque: work idle"]:
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def node_runs(redis_client: object) -> dict[str, str]:
    """Every run record of every node (blueque_node_[node])."""
    records: dict[str, str] = {}
    for key in redis_client.keys(KEYS.node_runs("*")):  # type: ignore[attr-defined]
        records.update(redis_client.hgetall(key))  # type: ignore[attr-defined]
    return records


def ran_by(marker: Path) -> list[int]:
    """The pid of each run the marker file records, in order."""
    return [int(line.split()[-1]) for line in lines(marker)]


def enqueue(client: blueque.Client, **params: object) -> str:
    options = {key: params.pop(key) for key in ("max_attempts", "time_limit") if key in params}
    return client.get_queue("work").enqueue(json.dumps(params), **options)  # type: ignore[arg-type]


def test_a_warm_process_runs_up_to_n_tasks_each_as_its_own_run(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """Seven tasks at --reuse 3: three processes (3, 3, 1 tasks), each task stamped with the
    pid that ran it, its own output file holding only its own output, its progress and
    checkpoint its own, and each ending recorded once."""
    marker = tmp_path / "marker"
    ids = [enqueue(client, marker=str(marker), print=f"output of task {n}",
                   progress=[0.5, f"half of {n}"], checkpoint=f"state {n}", value=n)
           for n in range(7)]
    start(started, tmp_path, redis_url, "--reuse", "3")
    tasks = [client.get_task(task_id).wait(30) for task_id in ids]
    assert [t.status for t in tasks] == ["complete"] * 7, [t.data for t in tasks]
    assert [t.result for t in tasks] == [str(n) for n in range(7)]
    pids = ran_by(marker)
    assert sorted(Counter(pids).values()) == [1, 3, 3]
    for n, task in enumerate(tasks):
        assert task.attempts == 1 and task.pid == pids[n]
        assert task.progress == 0.5 and task.progress_message == f"half of {n}"
        assert task.checkpoint == f"state {n}"
        output = (tmp_path / "task-logs" / "work" / f"{task.id}.1.log").read_text()
        assert output == f"output of task {n}\n"
    assert outcomes(redis_client, "complete") == 7
    assert node_runs(redis_client) == {}  # no process is named as running a task
    wait_until(lambda: len(task_processes()) <= 1, what="the two used-up processes gone")


def one_warm(client: blueque.Client, started: list[Daemon], tmp_path: Path, redis_url: str,
             marker: Path, failpoints: str = "") -> tuple[Daemon, int]:
    """A listener (--reuse 5) that has run one task: its process, now idle."""
    daemon = start(started, tmp_path, redis_url, "--reuse", "5", failpoints=failpoints)
    first = enqueue(client, marker=str(marker), value=1)
    assert client.get_task(first).wait(30).status == "complete"
    wait_until(lambda: idle(daemon), what="the warm process idle")
    assert idle(daemon) == ran_by(marker)
    return daemon, ran_by(marker)[0]


def test_a_warm_process_killed_between_two_tasks_is_forgotten_and_replaced(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """SIGKILL while idle: it held no task and no run record; nothing is recorded for it,
    and the next task runs in a fresh process."""
    marker = tmp_path / "marker"
    daemon, victim = one_warm(client, started, tmp_path, redis_url, marker)
    psutil.Process(victim).kill()
    # reaped, not only a zombie: the leader of a process with threads shows as a zombie while
    # its other threads still hold its files (its socket); a task given to it then would
    # be told to go, and its death recorded as the run's, as for a child killed at its go
    wait_until(lambda: not psutil.pid_exists(victim), what="the idle process reaped")
    second = enqueue(client, marker=str(marker), value=2)
    task = client.get_task(second).wait(30)
    assert task.status == "complete", (task.data, daemon.log())
    assert len(ran_by(marker)) == 2 and ran_by(marker)[1] != victim
    assert outcomes(redis_client, "complete") == 2
    assert outcomes(redis_client, "failed") == outcomes(redis_client, "retry") == 0
    assert node_runs(redis_client) == {}
    assert daemon.alive() and "Traceback" not in daemon.log()


def test_a_warm_process_killed_in_the_middle_of_a_task_has_its_death_recorded(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """SIGKILL while it runs its second task: that task's ending is its death, as for a
    forked child; the next task runs in a fresh process."""
    marker = tmp_path / "marker"
    daemon, victim = one_warm(client, started, tmp_path, redis_url, marker)
    second = enqueue(client, marker=str(marker), release=str(tmp_path / "never"),
                     max_attempts=1, print="said before the kill")
    wait_until(lambda: len(lines(marker)) == 2, what="the second task running")
    assert ran_by(marker)[1] == victim  # in the warm process
    psutil.Process(victim).kill()
    task = client.get_task(second).wait(30)
    assert task.status == "failed" and "SIGKILL" in (task.error or ""), task.data
    # its output went to its own attempt's file, none of the first task's
    output = tmp_path / "task-logs" / "work" / f"{second}.1.log"
    assert output.read_text() == "said before the kill\n"
    third = enqueue(client, marker=str(marker), value=3)
    assert client.get_task(third).wait(30).status == "complete"
    assert ran_by(marker)[2] != victim
    assert outcomes(redis_client, "complete") == 2 and outcomes(redis_client, "failed") == 1
    assert node_runs(redis_client) == {}
    assert daemon.alive()


@pytest.mark.parametrize("stop", ["time limit", "cancel"])
def test_a_warm_process_stopped_by_a_time_limit_or_a_cancel_is_replaced(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url, stop) -> None:
    """A time limit or a cancel on a warm process's task kills the process (its group) as
    for a forked child; the next task runs in a fresh process, never in the stopped one."""
    marker = tmp_path / "marker"
    _, victim = one_warm(client, started, tmp_path, redis_url, marker)
    limit = {"time_limit": 1} if stop == "time limit" else {}
    second = enqueue(client, marker=str(marker), release=str(tmp_path / "never"),
                     max_attempts=1, **limit)
    wait_until(lambda: len(lines(marker)) == 2, what="the second task running")
    assert ran_by(marker)[1] == victim
    if stop == "cancel":
        client.cancel_task(second, "not wanted")
    task = client.get_task(second).wait(30)
    assert task.status == "failed", task.data
    assert ("time limit" in (task.error or "")) if stop == "time limit" else task.cancelled
    wait_until(lambda: gone(victim), what="the stopped process gone")
    third = enqueue(client, marker=str(marker), value=3)
    assert client.get_task(third).wait(30).status == "complete"
    assert ran_by(marker)[2] != victim
    assert outcomes(redis_client, "complete") == 2


def test_a_listener_killed_while_warm_processes_live(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """SIGKILL to the listener with one warm process idle and one running a task: the idle
    one exits on its own (end of file); the busy one records its outcome itself and exits;
    the next listener adopts that run meanwhile, and the node never holds more task
    processes than --concurrency."""
    marker = tmp_path / "marker"
    options = ("--reuse", "10", "--concurrency", "2")
    first = start(started, tmp_path, redis_url, *options)
    releases = [tmp_path / f"release{n}" for n in range(3)]
    warm = [enqueue(client, marker=str(marker), release=str(releases[n]), value=n)
            for n in range(2)]
    wait_until(lambda: len(lines(marker)) == 2, what="two warm processes busy")
    for release in releases[:2]:
        release.touch()
    assert [client.get_task(t).wait(30).status for t in warm] == ["complete"] * 2
    wait_until(lambda: len(idle(first)) == 2, what="both warm processes idle")
    busy_id = enqueue(client, marker=str(marker), release=str(releases[2]), value=2)
    wait_until(lambda: len(lines(marker)) == 3, what="the third task running")
    busy = ran_by(marker)[2]
    (waiting,) = [pid for pid in idle(first) if pid != busy]
    first.kill()
    wait_until(lambda: gone(waiting), what="the idle process gone on its own")
    assert not gone(busy)

    def at_most_two() -> bool:
        assert len(task_processes()) <= 2, [p.cmdline() for p in task_processes()]
        return True

    second = start(started, tmp_path, redis_url, *options)
    more = [enqueue(client, marker=str(marker), value=n) for n in range(3, 6)]
    wait_until(lambda: at_most_two() and all(
        client.get_task(t).status == "complete" for t in more), what="three more tasks")
    releases[2].touch()
    task = client.get_task(busy_id).wait(30)
    assert task.status == "complete" and task.result == "2"
    assert task.pid == busy and str(first.pid) in (task.node or "")  # it recorded itself
    wait_until(lambda: at_most_two() and gone(busy), what="the orphan gone")
    assert len({line.split()[1] for line in lines(marker)}) == len(lines(marker)) == 6
    assert outcomes(redis_client, "complete") == 6  # each ran once, recorded once
    assert "1 adopted task(s) of dead listeners occupy its slots" in second.log()
    wait_until(lambda: node_runs(redis_client) == {}, what="no run record left")
    assert second.alive()


def test_a_task_that_leaves_a_process_behind_retires_its_warm_process(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """A run that left a process (a child still running) does not hand its process to the
    next task: the process retires, and what the run left is stopped as for any run whose
    task process ended (6.4); the next task runs in a fresh process."""
    pidfile = tmp_path / "pidfile"
    daemon = Daemon(listen_command(redis_url, "work", "tests.jobs:grandchild", *FAST,
                                   "--reuse", "5"), tmp_path / "daemon.log")
    started.append(daemon)
    queue = client.get_queue("work")
    first = client.get_task(queue.enqueue(json.dumps({"pidfile": str(pidfile), "seconds": 0})))
    assert first.wait(30).status == "complete"
    left = int(pidfile.read_text())
    wait_until(lambda: gone(left), what="the process it left stopped")
    wait_until(lambda: gone(first.refresh().pid or 0), what="its task process retired")
    second = client.get_task(queue.enqueue(json.dumps({"pidfile": str(pidfile), "seconds": 0})))
    assert second.wait(30).status == "complete"
    assert second.pid != first.pid
    assert outcomes(redis_client, "complete") == 2


def test_a_listener_killed_after_telling_a_warm_process_its_task_before_the_stamp(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """The warm process reads end of file instead of the word: its task is not started with
    its pid, so it leaves without running it; the next listener puts the task back and runs
    it, once, at attempt 1."""
    marker = tmp_path / "marker"
    first, warm = one_warm(client, started, tmp_path, redis_url, marker,
                           failpoints="listener-before-warm-stamp")
    second = enqueue(client, marker=str(marker), value=2)
    first.process.wait(20)
    assert first.process.returncode == -signal.SIGKILL, first.log()
    wait_until(lambda: gone(warm), what="the warm process gone without running it")
    start(started, tmp_path, redis_url, "--reuse", "5")
    task = client.get_task(second).wait(30)
    assert task.status == "complete" and task.result == "2" and task.attempts == 1
    assert len(lines(marker)) == 2 and ran_by(marker)[1] not in (warm, first.pid)
    assert outcomes(redis_client, "complete") == 2


def test_a_warm_process_forgets_the_preemption_notice_of_its_last_task() -> None:
    """Between two tasks: the on_preempt callbacks of the one before are dropped, and a
    notice it had is not the next one's."""
    on_preempt(lambda: None)
    notice.noticed, notice.deadline = True, 123.0
    try:
        warm._forget_last_task()
        assert notice.callbacks == [] and not notice.noticed and notice.deadline is None
    finally:
        warm._forget_last_task()


def test_a_process_whose_outcome_was_recorded_late_is_retired_not_given_a_task() -> None:
    """Found by an operator trial (Redis stopped 5 s, longer than a 2-s lease, under warm
    runs): a process whose outcome waited for Redis stopped waiting, recorded it itself and
    left, while its listener, recording it once Redis was back, kept it idle and gave it the
    next task, which was then recorded as failed without having run. A process whose
    outcome was recorded half its patience or more after it reported it is retired."""
    import socket

    from blueque.daemon.running import Running
    from blueque.policy import Policy
    from blueque.reporting import ChildChannel

    ours, theirs = socket.socketpair()
    try:
        running = Running("t", "work", 1, 0.0, 0.0, 1.0, Policy(), pid=2 ** 22 + 7,
                          channel=ChildChannel(ours), state="running", reported_at=10.0)
        processes = WarmProcesses(5, patience=2.0)
        late = "its outcome was recorded late"
        assert processes.retire_reason(running, set(), 11.0) == late
        assert processes.retire_reason(running, set(), 10.2) != late
        assert not processes.keep(running, set(), 12.0) and not processes.idle
    finally:
        ours.close()
        theirs.close()
