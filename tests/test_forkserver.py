"""The fork server (PROTOCOL.md 6.8), end to end with real processes: task processes are
forked by it and hold none of the listener's machinery; killed with children running, or
while it makes one, no task is lost or run twice and another starts; a listener SIGKILLed
while its fork server and task processes live: the fork server exits, the runs record
themselves and the next listener takes over, never more than --concurrency task processes."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path

import psutil
import pytest
import redis

import blueque
from blueque.config import Settings
from blueque.daemon import ListenerOptions
from blueque.daemon.forks import server_setup
from blueque.daemon.step import ListenerStep
from tests.daemons import Daemon, gone, lines, task_processes, wait_until
from tests.test_reporting import KEYS, outcomes
from tests.test_reporting import start as reporting_start

pytestmark = pytest.mark.slow

FUNCTION = "tests.forkserver_jobs:where"
MACHINERY = ("redis", "blueque.daemon", "blueque.cli", "blueque.web", "blueque.metrics",
             "blueque.client", "blueque.store")


def start(started: list[Daemon], tmp_path: Path, url: str, *options: str,
          failpoints: str = "") -> Daemon:
    return reporting_start(started, tmp_path, url, *options, failpoints=failpoints,
                           function=FUNCTION)


def fork_servers(daemon: Daemon) -> list[int]:
    found = []
    for process in psutil.Process(daemon.pid).children():
        try:
            if process.cmdline()[:1] == [f"blueque fork server {FUNCTION}"]:
                found.append(process.pid)
        except psutil.Error:
            continue
    return found



def ran(marker: Path) -> list[tuple[str, int, int]]:
    """(task id, pid, parent pid) of each run, in order."""
    return [(w[0], int(w[1]), int(w[2])) for w in (line.split() for line in lines(marker))]


def count() -> tuple[int, int]:
    """Task processes running a task, and all (with the idle one made ahead, 6.8)."""
    titles = []
    for process in task_processes():
        with contextlib.suppress(psutil.Error):  # gone meanwhile: neither
            titles.append(process.cmdline()[:1])
    return sum(title != ["blueque: work idle"] for title in titles), len(titles)


def enqueue(client: blueque.Client, marker: Path, **params: object) -> str:
    return client.get_queue("work").enqueue(json.dumps({"marker": str(marker), **params}))


@pytest.mark.parametrize("reuse", ["1", "3"])
def test_task_processes_are_forked_by_the_fork_server_and_hold_no_listener_machinery(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url, reuse) -> None:
    marker, modules = tmp_path / "marker", tmp_path / "modules.json"
    daemon = start(started, tmp_path, redis_url, "--reuse", reuse)
    wait_until(lambda: fork_servers(daemon) and "ready" in daemon.log(), what="its fork server")
    server = fork_servers(daemon)[0]
    ids = [enqueue(client, marker, value=n, modules=str(modules)) for n in range(4)]
    for n, task_id in enumerate(ids):
        task = client.get_task(task_id).wait(30)
        assert task.status == "complete" and task.result == str(n)
    runs = ran(marker)
    assert sorted(r[0] for r in runs) == sorted(ids)
    assert {r[2] for r in runs} == {server}  # each forked by the fork server
    if reuse == "3":  # warm processes come from it too, and take several tasks
        assert len({r[1] for r in runs}) < len(runs)
    loaded = json.loads(modules.read_text())
    assert [m for m in loaded if m.startswith(MACHINERY)] == []
    assert "blueque.task_process.child" in loaded
    assert outcomes(redis_client, "complete") == 4
    assert psutil.Process(server).memory_info().rss < psutil.Process(daemon.pid).memory_info().rss

    def zombies() -> list[int]:  # exits it reported: reaped once the listener settled them
        found = []
        for child in psutil.Process(server).children():
            with contextlib.suppress(psutil.Error):
                if child.status() == psutil.STATUS_ZOMBIE:
                    found.append(child.pid)
        return found

    if reuse == "1":
        wait_until(lambda: not zombies(), what="no zombie left under the fork server")


def test_a_task_process_that_uses_redis_makes_its_fork_server_load_the_client(  # type: ignore[no-untyped-def]
        client, started, tmp_path, redis_url) -> None:
    """The first task process that talks to Redis itself (here: Task.parents) imports
    redis-py and the client, a quarter of a second; it tells its fork server, which loads them
    once, so that the task processes it forks next find them loaded and do not pay again."""
    marker = tmp_path / "marker"
    daemon = start(started, tmp_path, redis_url)
    wait_until(lambda: fork_servers(daemon) and "ready" in daemon.log(), what="its fork server")
    first = enqueue(client, marker, parents=True, modules=str(tmp_path / "first.json"))
    assert client.get_task(first).wait(30).status == "complete"
    assert "redis" not in json.loads((tmp_path / "first.json").read_text())
    wait_until(lambda: "the client is loaded here now" in daemon.log(),
               what=f"the fork server to load the client: {daemon.log()}")
    second = enqueue(client, marker, parents=True, modules=str(tmp_path / "second.json"))
    assert client.get_task(second).wait(30).status == "complete"
    loaded = json.loads((tmp_path / "second.json").read_text())
    assert "redis" in loaded and "blueque.client" in loaded  # inherited, before it asked
    assert {r[2] for r in ran(marker)} == set(fork_servers(daemon))  # both forked by it
    assert daemon.log().count("the client is loaded here now") == 1


def test_a_task_process_finds_libc_looked_up_by_its_fork_server(  # type: ignore[no-untyped-def]
        client, started, tmp_path, redis_url) -> None:
    """Each task process sets its parent-death signal with libc's prctl. The fork server
    looks it up once, before it forks; its children inherit the cached one (the lookup was
    ctypes.util.find_library, which runs `ldconfig -p` in a subprocess: done in each task
    process, a process and about 3 ms of CPU per task, a third of a no-op drain; issue 20)."""
    marker = tmp_path / "marker"
    daemon = start(started, tmp_path, redis_url)
    wait_until(lambda: fork_servers(daemon) and "ready" in daemon.log(), what="its fork server")
    lookups = tmp_path / "lookups.json"
    task_id = enqueue(client, marker, lookups=str(lookups))
    assert client.get_task(task_id).wait(30).status == "complete"
    assert {r[2] for r in ran(marker)} == set(fork_servers(daemon))  # forked by it
    # looked up once, before the fork (the miss is the fork server's); the child's was a hit
    assert json.loads(lookups.read_text()) == {"hits": 1, "misses": 1}


def test_a_fork_server_killed_with_children_running_loses_nothing_and_is_restarted(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    marker, release = tmp_path / "marker", tmp_path / "release"
    daemon = start(started, tmp_path, redis_url, "--concurrency", "2")
    wait_until(lambda: fork_servers(daemon) and "ready" in daemon.log(), what="its fork server")
    first = fork_servers(daemon)[0]
    threads = tmp_path / "threads"
    ids = [enqueue(client, marker, value=n, release=str(release), threads=str(threads))
           for n in range(2)]
    wait_until(lambda: len(lines(marker)) == 2, what="both tasks running")
    assert {r[2] for r in ran(marker)} == {first}
    psutil.Process(first).kill()
    # its children come to the listener, each told so by its parent-death signal: their
    # listener lives and still reads their output, so none takes its pipe over (no thread)
    wait_until(lambda: all(psutil.Process(pid).ppid() == daemon.pid
                           for _, pid, _ in ran(marker)), what="the children reparented")
    wait_until(lambda: fork_servers(daemon) and fork_servers(daemon) != [first]
               and daemon.log().count("ready") >= 2, what="another fork server")
    release.touch()
    for n, task_id in enumerate(ids):
        task = client.get_task(task_id).wait(30)
        assert task.status == "complete" and task.result == str(n) and task.attempts == 1
    assert f"fork server {first} exited (killed by signal 9)" in daemon.log()
    assert sorted(int(line.split()[1]) for line in lines(threads)) == [1, 1]
    # their exits came to the listener (a child subreaper), which settled them
    wait_until(lambda: outcomes(redis_client, "complete") == 2, what="both recorded")
    second = fork_servers(daemon)[0]
    following = enqueue(client, marker, value="next")
    assert client.get_task(following).wait(30).result == "next"
    # made by the new fork server, or the process made ahead while the two ran (by the
    # first: an orphan the listener reaps, test_a_spare_whose_fork_server_dies...)
    assert ran(marker)[-1][2] in (second, daemon.pid)
    assert Counter(r[0] for r in ran(marker)) == Counter([*ids, following])
    assert daemon.alive()


def test_a_fork_server_killed_while_it_makes_a_child_loses_no_task_and_runs_none_twice(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """Killed between its fork and its answer (every time: each new one is killed too): the
    child it made is told to stop before its word and leaves; the listener forks the task's
    process itself. The three tasks come in one enqueue_many, so that one step takes them
    all: the first goes to the process made ahead (the spare, 6.8), the others need a fork
    each (a spare is made again only once the step has filled its slots)."""
    marker = tmp_path / "marker"
    daemon = start(started, tmp_path, redis_url, "--concurrency", "3",
                   failpoints="forkserver-after-fork")
    wait_until(lambda: "ready" in daemon.log(), what="its fork server")
    ids = client.get_queue("work").enqueue_many(
        [json.dumps({"marker": str(marker), "value": n}) for n in range(3)])
    for n, task_id in enumerate(ids):
        task = client.get_task(task_id).wait(30)
        assert task.status == "complete" and task.result == str(n) and task.attempts == 1
    assert Counter(r[0] for r in ran(marker)) == Counter(ids)  # each ran once
    # forked by the listener itself (a first task may go to the process the fork server made
    # ahead of it, before the first request for a task's process killed it)
    assert daemon.pid in {r[2] for r in ran(marker)}
    assert "exited (killed by signal 9)" in daemon.log()
    assert "went away while making its process" in daemon.log()
    assert outcomes(redis_client, "complete") == 3 and outcomes(redis_client, "failed") == 0
    assert daemon.alive()


def test_a_listener_killed_while_its_fork_server_and_task_processes_live(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    marker, release = tmp_path / "marker", tmp_path / "release"
    first = start(started, tmp_path, redis_url, "--concurrency", "2")
    wait_until(lambda: fork_servers(first) and "ready" in first.log(), what="its fork server")
    server = fork_servers(first)[0]
    ids = [enqueue(client, marker, value=n, release=str(release)) for n in range(3)]
    wait_until(lambda: len(lines(marker)) == 2, what="two tasks running")
    running = [r[1] for r in ran(marker)]
    first.kill()
    wait_until(lambda: gone(server), what="the fork server gone with its listener")
    assert not any(gone(pid) for pid in running)  # its children live on
    second = start(started, tmp_path, redis_url, "--concurrency", "2")
    wait_until(lambda: fork_servers(second), what="the next listener's fork server")
    seen = [count()]
    release.touch()  # the two adopted runs end; the third task runs beside nothing

    def done() -> bool:
        seen.append(count())
        return all(client.get_task(i).status == "complete" for i in ids)

    wait_until(done, timeout=60, what="every task complete")
    # never more runs than --concurrency on the node, and one process made ahead at most
    assert max(busy for busy, _ in seen) <= 2 and max(every for _, every in seen) <= 3, seen
    assert Counter(r[0] for r in ran(marker)) == Counter(ids)
    assert all(client.get_task(i).attempts == 1 for i in ids)
    assert outcomes(redis_client, "complete") == 3


def test_settings_that_cannot_be_passed_to_a_fork_server_mean_forking_from_the_listener(  # type: ignore[no-untyped-def]
        caplog, redis_url) -> None:
    """A redis option that cannot be pickled (a callable) cannot reach a fork server's
    children: the listener says so and forks its task processes itself (6.8)."""
    settings = Settings.from_url(redis_url, redis_connect_func=lambda connection: None)
    assert server_setup(FUNCTION, settings, None, None, None) is None
    assert "forked from the listener" in caplog.text
    assert server_setup(FUNCTION, Settings.from_url(redis_url), None, None, None) is not None


def test_one_rule_says_when_a_listener_uses_a_fork_server(redis_url) -> None:  # type: ignore[no-untyped-def]
    """An import path and connection settings: a fork server; a Python callable, or a client
    made from a ready redis-py client: the listener forks its task processes itself."""
    settings = Settings.from_url(redis_url)
    assert ListenerOptions({"work": 1}, FUNCTION).uses_fork_server(settings)
    assert not ListenerOptions({"work": 1}, FUNCTION).uses_fork_server(None)
    assert not ListenerOptions({"work": 1}, lambda task: None).uses_fork_server(settings)
    by_url = ListenerStep(blueque.Client(redis_url), ListenerOptions({"work": 1}, FUNCTION))
    assert by_url.supervisor.fork_server is not None
    ready = blueque.Client(redis.Redis.from_url(redis_url, decode_responses=True))
    assert ListenerStep(ready, ListenerOptions({"work": 1}, FUNCTION)).supervisor.fork_server \
        is None


# --- a process ready before its task (6.8, the spare) ---------------------------------------------
def spares(daemon: Daemon) -> list[int]:
    """The idle task processes its fork server made ahead of their tasks."""
    found = []
    for server in fork_servers(daemon):
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(server).children():
                with contextlib.suppress(psutil.Error):
                    if child.cmdline()[:1] == ["blueque: work idle"]:
                        found.append(child.pid)
    return found


@pytest.mark.parametrize("reuse", ["1", "3"])
def test_an_idle_listener_has_a_process_ready_before_its_task(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url, reuse) -> None:
    """Issue 20's pickup target: the fork is out of the pickup's path. The task runs in the
    process made ahead of it, with its own attempt, stamp, run record and output file; with
    --reuse 1 that process then exits and another is made for the next task."""
    marker, logs = tmp_path / "marker", tmp_path / "task-logs"
    daemon = start(started, tmp_path, redis_url, "--reuse", reuse, "--log-dir", str(logs))
    wait_until(lambda: len(spares(daemon)) == 1, what=f"a spare: {daemon.log()}")
    spare = spares(daemon)[0]
    assert not any(redis_client.hlen(key) for key in redis_client.keys(KEYS.node_runs("*")))
    first = enqueue(client, marker, value=1, say="first's output")
    task = client.get_task(first).wait(30)
    assert task.status == "complete" and task.result == "1" and task.attempts == 1
    assert ran(marker) == [(first, spare, fork_servers(daemon)[0])]  # it ran in the spare
    assert (logs / "work" / f"{first}.1.log").read_text() == "first's output\n"
    if reuse == "1":  # it ran its one task and left; another is ready for the next
        wait_until(lambda: gone(spare), what="the spare that ran its task gone")
        wait_until(lambda: spares(daemon) and spares(daemon) != [spare], what="a new spare")
    else:  # kept idle for its next task, as a warm process: no second one is made
        wait_until(lambda: spares(daemon) == [spare], what="the same process idle again")
    second = enqueue(client, marker, value=2, say="second's output")
    assert client.get_task(second).wait(30).result == "2"
    assert (logs / "work" / f"{second}.1.log").read_text() == "second's output\n"
    assert (ran(marker)[1][1] == spare) is (reuse == "3")
    busy, every = count()  # never more runs than --concurrency; one made ahead at most
    assert busy <= 1 and every <= 2
    assert outcomes(redis_client, "complete") == 2


def test_a_spare_killed_while_it_waits_is_replaced_and_loses_nothing(  # type: ignore[no-untyped-def]
        client, started, tmp_path, redis_url) -> None:
    marker = tmp_path / "marker"
    daemon = start(started, tmp_path, redis_url)
    wait_until(lambda: len(spares(daemon)) == 1, what="a spare")
    killed = spares(daemon)[0]
    psutil.Process(killed).kill()
    wait_until(lambda: spares(daemon) and spares(daemon) != [killed], what="another spare")
    task_id = enqueue(client, marker, value=3)
    task = client.get_task(task_id).wait(30)
    assert task.status == "complete" and task.result == "3" and task.attempts == 1
    assert [r[1] for r in ran(marker)] != [killed]
    assert daemon.alive()


def test_a_listener_killed_with_a_spare_leaves_no_process_behind(  # type: ignore[no-untyped-def]
        client, started, tmp_path, redis_url) -> None:
    """The spare holds no task and no run record: its listener gone, it reads end of file
    and exits; the next listener makes its own, never more than --concurrency."""
    marker = tmp_path / "marker"
    first = start(started, tmp_path, redis_url)
    wait_until(lambda: len(spares(first)) == 1, what="a spare")
    spare = spares(first)[0]
    first.kill()
    wait_until(lambda: gone(spare), what="the dead listener's spare gone")
    second = start(started, tmp_path, redis_url)
    wait_until(lambda: len(spares(second)) == 1, what="the next listener's spare")
    assert len(task_processes()) == 1
    ready = spares(second)[0]
    task_id = enqueue(client, marker, value=4)
    assert client.get_task(task_id).wait(30).result == "4"
    assert [r[1] for r in ran(marker)] == [ready]


def test_a_fork_server_killed_while_it_makes_a_spare_leaves_no_process_too_many(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """Killed between the spare's fork and its answer (every time: each new one is killed
    too): the listener closes its end of that pair, so the spare it never heard of reads end
    of file and exits; tasks are forked by the listener meanwhile and each runs once."""
    marker = tmp_path / "marker"
    daemon = start(started, tmp_path, redis_url, failpoints="forkserver-after-spare-fork")
    wait_until(lambda: "exited (killed by signal 9)" in daemon.log(), what="a killed server")
    seen = [len(task_processes())]
    ids = [enqueue(client, marker, value=n) for n in range(3)]

    def done() -> bool:
        seen.append(len(task_processes()))
        return all(client.get_task(i).status == "complete" for i in ids)

    wait_until(done, timeout=60, what="every task complete")
    assert max(seen) <= 1, seen
    assert Counter(r[0] for r in ran(marker)) == Counter(ids)
    assert all(client.get_task(i).attempts == 1 for i in ids)
    wait_until(lambda: not [p for p in task_processes() if p.ppid() == daemon.pid
                            and p.cmdline()[:1] == ["blueque: work idle"]],
               what="no spare of a dead fork server left")
    assert outcomes(redis_client, "complete") == 3 and daemon.alive()


def test_a_spare_whose_fork_server_dies_still_runs_the_next_task(  # type: ignore[no-untyped-def]
        client, redis_client, started, tmp_path, redis_url) -> None:
    """The spare comes to the listener (its child subreaper) with the fork server's death and
    waits on: the next task runs in it, once; the new fork server makes the spare after it."""
    marker = tmp_path / "marker"
    daemon = start(started, tmp_path, redis_url)
    wait_until(lambda: len(spares(daemon)) == 1, what="a spare")
    spare, server = spares(daemon)[0], fork_servers(daemon)[0]
    psutil.Process(server).kill()
    wait_until(lambda: psutil.Process(spare).ppid() == daemon.pid, what="the spare reparented")
    wait_until(lambda: fork_servers(daemon) and fork_servers(daemon) != [server]
               and daemon.log().count("ready") >= 2, what="another fork server")
    task_id = enqueue(client, marker, value=5)
    task = client.get_task(task_id).wait(30)
    assert task.status == "complete" and task.result == "5" and task.attempts == 1
    assert ran(marker) == [(task_id, spare, daemon.pid)]  # the orphaned spare ran it
    wait_until(lambda: gone(spare) and len(spares(daemon)) == 1, what="the next spare")
    assert outcomes(redis_client, "complete") == 1 and daemon.alive()
