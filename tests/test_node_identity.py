"""Node identity (issue 9, section 2): nodes that share a host name never judge each other's
pids, and no two live listeners share an id.

Real daemons on the private redis-server; the look-alike node is a real PID namespace
(`unshare --pid --fork --mount-proc`), whose first pid is set free in the root namespace so
that a pid check from the wrong namespace finds nothing there (as on another machine)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

import blueque
from blueque.keys import Keys
from blueque.listener import Listener
from blueque.node import hostname
from tests.daemons import FAST, Daemon, listen_command, wait_until

KEYS = Keys()


def _pid_namespaces_work() -> bool:
    try:
        done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                              capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


needs_pid_namespaces = pytest.mark.skipif(
    not _pid_namespaces_work(),
    reason="PID namespaces are not available here (unshare --pid needs root or "
           "CAP_SYS_ADMIN); node identities are still covered with --node-name")


def free_pid_range(size: int = 200) -> int:
    """A first pid whose range is unused in this (root) namespace."""
    in_use = set(psutil.pids())
    for base in range(30000, 10000, -2500):
        if not in_use & set(range(base, base + size)):
            return base
    raise AssertionError("no free pid range for the namespace")


def in_new_pid_namespace(command: Sequence[str], first_pid: int) -> list[str]:
    """``command`` as pid ``first_pid`` of a new PID namespace (killed with the namespace
    when unshare is killed)."""
    script = f'echo {first_pid - 1} > /proc/sys/kernel/ns_last_pid && "$@"'
    return ["unshare", "--pid", "--mount-proc", "--kill-child", "sh", "-c", script, "sh",
            *command]


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


@pytest.fixture
def spawn(tmp_path: Path, started: list[Daemon]):  # type: ignore[no-untyped-def]
    def spawn_daemon(command: Sequence[str]) -> Daemon:
        daemon = Daemon(command, tmp_path / f"daemon{len(started)}.log")
        started.append(daemon)
        return daemon

    return spawn_daemon


def hold(tmp_path: Path, name: str) -> tuple[str, Path, Path]:
    marker, release = tmp_path / f"{name}.marker", tmp_path / f"{name}.release"
    return json.dumps({"marker": str(marker), "release": str(release)}), marker, release


def recovered_decoy(client: blueque.Client, redis_client, round_: int) -> None:  # type: ignore[no-untyped-def]
    """A dead listener on another node, lease lapsed, holding a task: waiting until someone
    requeued its task proves that a recovery sweep ran after it was planted."""
    decoy = Listener("work", client.store, identity=f"decoy{round_}.example_1")
    task_id = client.get_queue("work").enqueue(f"decoy {round_}")
    assert decoy.reserve() is not None
    redis_client.zadd(KEYS.leases("work"), {decoy.id: 1})
    wait_until(lambda: not redis_client.exists(KEYS.reserved("work", decoy.id)),
               what="a sweep")
    redis_client.lrem(KEYS.pending("work"), 0, task_id)  # nobody should run it
    redis_client.delete(KEYS.task(task_id))


@pytest.mark.slow
@needs_pid_namespaces
def test_same_host_name_in_two_pid_namespaces_never_judge_each_others_pids(  # type: ignore[no-untyped-def]
        client, redis_url, redis_client, spawn, tmp_path):
    queue = client.get_queue("work")
    first = free_pid_range()
    params_ns, marker_ns, release_ns = hold(tmp_path, "ns")
    in_ns = queue.enqueue(params_ns, max_attempts=3, retry_backoff=0.01)
    spawn(in_new_pid_namespace(listen_command(redis_url, "work", "tests.jobs:hold", *FAST),
                               first))
    wait_until(lambda: lines(marker_ns), what="task running in the other namespace")
    ns_listener = f"{hostname()}_{first}"
    assert client.get_task(in_ns).node == ns_listener  # same host name, pid of its namespace

    params_root, marker_root, release_root = hold(tmp_path, "root")
    in_root = queue.enqueue(params_root, max_attempts=3, retry_backoff=0.01)
    root = spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST))
    wait_until(lambda: lines(marker_root), what="task running in the root namespace")
    root_listener = f"{hostname()}_{root.pid}"
    infos = [client.store.listener_info(x) for x in (ns_listener, root_listener)]
    assert infos[0]["node"] != infos[1]["node"]
    assert all(info["node"].startswith(hostname() + ":") for info in infos)
    for round_ in range(3):  # only the listeners sweep: each sees the other as on its host
        recovered_decoy(client, redis_client, round_)
    scheduler = spawn([sys.executable, "-m", "blueque.cli", "scheduler", "--url", redis_url,
                       "--interval", "0.1", "--recovery-interval", "0.1"])
    round_ = 3
    while "recovered listener decoy" not in scheduler.log():  # until the scheduler swept too
        assert round_ < 50, "the scheduler recovered no decoy"
        recovered_decoy(client, redis_client, round_)
        round_ += 1

    for task_id, marker in ((in_ns, marker_ns), (in_root, marker_root)):
        task = client.get_task(task_id)
        assert (task.status, task.attempts) == ("started", 1), task.error
        assert len(lines(marker)) == 1  # started once, not ended: still running
    assert {ns_listener, root_listener} <= redis_client.smembers(KEYS.listeners("work"))
    logs = "".join(d.log() for d in (root, scheduler))
    assert "recovered dead listener" not in logs and "lost its lease" not in logs
    release_ns.touch()
    release_root.touch()
    for task_id in (in_ns, in_root):
        task = client.get_task(task_id).wait(20)
        assert (task.status, task.attempts) == ("complete", 1)
    assert len(lines(marker_ns)) == 2 and len(lines(marker_root)) == 2


@pytest.mark.slow
@pytest.mark.parametrize("where", ["same node", "other node"])
def test_listener_refuses_an_id_held_by_a_live_listener(  # type: ignore[no-untyped-def]
        client, redis_url, spawn, where):
    if where == "other node" and not _pid_namespaces_work():
        pytest.skip("PID namespaces are not available here")
    command = listen_command(redis_url, "work", "tests.jobs:hold", *FAST,
                             "--identity", "twin.example_1")
    holder = spawn(command if where == "same node" else
                   in_new_pid_namespace(command, free_pid_range()))
    wait_until(lambda: client.store.listener_info("twin.example_1").get("renewed"),
               what="the first listener registered")
    owner = client.store.listener_info("twin.example_1")
    second = spawn(command)
    wait_until(lambda: not second.alive(), what="the second listener refusing to start")
    assert second.process.returncode == 2  # bad configuration (blueque --help: exit codes)
    text = second.log()
    assert "blueque: error: listener id twin.example_1 is in use by" in text
    assert ("--identity" if where == "same node" else "--node-name") in text
    assert holder.alive()
    assert client.store.listener_info("twin.example_1")["pid_created"] == owner["pid_created"]
    assert client.store.listener_info("twin.example_1")["node"] == owner["node"]


@pytest.mark.slow
def test_node_name_names_the_listener_and_its_node(client, redis_url, spawn):  # type: ignore[no-untyped-def]
    daemon = spawn(listen_command(redis_url, "work", "tests.jobs:hold", *FAST,
                                  "--node-name", "gpu-7.example"))
    listener = f"gpu-7.example_{daemon.pid}"
    wait_until(lambda: client.store.listener_info(listener).get("renewed"),
               what="registered under its node name")
    info = client.store.listener_info(listener)
    assert info["host"] == "gpu-7.example" and info["node"].startswith("gpu-7.example:")
    assert info["pid"] == str(daemon.pid)


@pytest.mark.slow
@needs_pid_namespaces
def test_a_dead_holder_of_the_id_on_another_node_is_waited_out_and_recovered(  # type: ignore[no-untyped-def]
        client, redis_url, spawn, tmp_path):
    """A container restarted with the same host name and pid: the old listener is in another
    (now gone) PID namespace, so only its lease can say it is dead."""
    params, marker, release = hold(tmp_path, "task")
    task_id = client.get_queue("work").enqueue(params, max_attempts=2, retry_backoff=0.01)
    command = listen_command(redis_url, "work", "tests.jobs:hold", *FAST,
                             "--identity", "twin.example_1")
    container = spawn(in_new_pid_namespace(command, free_pid_range()))
    wait_until(lambda: lines(marker), what="attempt 1 running in the old container")
    container.kill()  # the namespace dies with its init: the listener and its task process
    restarted = spawn(command)
    wait_until(lambda: len(lines(marker)) == 2, what="attempt 2 run by the new listener")
    task = client.get_task(task_id)
    assert (task.status, task.attempts, task.node) == ("started", 2, "twin.example_1")
    assert "twin.example_1 stopped renewing its lease" in task.history[-1]["error"]
    assert "waiting for its lease to lapse" in restarted.log()
    release.touch()
    assert client.get_task(task_id).wait(20).status == "complete"
    assert restarted.alive()
    assert client.store.listener_info("twin.example_1")["pid"] == str(restarted.pid)


# --- the rules, step by step (injected liveness and kill; real redis-server) ------------------
def test_local_process_compares_node_identities_exactly() -> None:
    from blueque.node import local_process

    node = "localhost:aaaaaaaaaaaa"
    ours = {"node": node, "pid": "41", "pid_created": "12.5"}
    assert local_process("localhost_41", ours, node, "localhost") == (41, 12.5)
    other = {**ours, "node": "localhost:bbbbbbbbbbbb"}
    assert local_process("localhost_41", other, node, "localhost") is None
    # no node identity: blueque 1.0.1's rule, by the host name in the id
    assert local_process("localhost_41", {}, node, "localhost") == (41, None)
    assert local_process("elsewhere_41", {}, node, "localhost") is None


@needs_pid_namespaces
def test_node_identity_differs_between_pid_namespaces_only() -> None:
    from blueque.node import node_identity

    code = "from blueque.node import node_identity; print(node_identity('n'))"
    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()
    there = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                            code], capture_output=True, text=True, check=True).stdout.strip()
    assert here == node_identity("n") and here.startswith("n:") and len(here) == 2 + 12
    assert there.startswith("n:") and there != here
    assert node_identity("m") != node_identity("n")


def test_sweep_stops_only_runs_whose_task_was_taken_back(client: blueque.Client) -> None:
    from blueque.recovery import Recovery, RecoveryReport

    store, node = client.store, "box:cccccccccccc"
    queue = client.get_queue("work")
    current, taken = queue.enqueue("a"), queue.enqueue("b", kill_grace=0.2)
    watched = queue.enqueue("c")
    for task_id, attempts, holder in ((current, "1", "box_10"), (taken, "2", "far_7"),
                                      (watched, "3", "box_20")):
        client.redis.hset(KEYS.task(task_id), mapping={
            "status": "started", "attempts": attempts, "node": holder})
    store.write_listener_info("box_10", {"node": node, "pid": "10", "pid_created": "1"}, 60)
    store.write_listener_info("box_20", {"node": node, "pid": "20", "pid_created": "1"}, 60)

    def run(task_id: str, attempt: int, listener: str, owner: int | None = None) -> str:
        return json.dumps({"task": task_id, "queue": "work", "attempt": attempt,
                           "created": 5.0, "listener": listener, "listener_pid": owner,
                           "listener_created": 1.0})

    store.record_runs(node, {"101": run(current, 1, "box_10"), "102": run(taken, 1, "box_10"),
                             "103": run(watched, 3, "box_20", owner=20),
                             "104": run(taken, 1, "box_10"), "105": "not json",
                             # box_20's id, but an earlier process (a pid reused): dead
                             "106": run(watched, 2, "box_20", owner=19)}, 60)
    alive = {101, 102, 103, 106, 20}  # listener box_10 and run 104 are gone; box_20 lives
    killed: list[tuple[int, int]] = []
    recovery = Recovery(store, host="box", node=node, alive=lambda pid, _: pid in alive,
                        kill=lambda pid, signum: killed.append((pid, signum)))
    report = RecoveryReport()
    recovery.stop_fenced_runs(report)
    assert sorted(killed) == [(102, signal.SIGTERM), (106, signal.SIGTERM)]
    assert report.stopped_runs == 2
    # ended and unreadable entries dropped
    assert set(store.node_runs(node)) == {"101", "102", "103", "106"}
    alive.discard(106)
    killed.clear()
    recovery.stop_fenced_runs(RecoveryReport())
    assert killed == [(106, signal.SIGKILL), (102, signal.SIGTERM)] or killed == [
        (102, signal.SIGTERM), (106, signal.SIGKILL)]  # 106 gone: its group; 102 again

    def killed_once_grace_passed() -> bool:
        recovery.stop_fenced_runs(RecoveryReport())
        return killed[-1] == (102, signal.SIGKILL)

    wait_until(killed_once_grace_passed, what="SIGKILL after kill_grace")
    alive.discard(102)
    recovery.stop_fenced_runs(RecoveryReport())  # gone: its group is killed once more, dropped
    assert killed[-1] == (102, signal.SIGKILL) and set(store.node_runs(node)) == {"101", "103"}
    assert {pid for pid, _ in killed} == {102, 106}  # the current and the watched run live on


@pytest.mark.slow
@needs_pid_namespaces
def test_a_listener_that_is_pid_1_preempts_its_runs_instead_of_leaving_them(  # type: ignore[no-untyped-def]
        client, redis_url, spawn, tmp_path):
    """A container's main process: when pid 1 of a PID namespace exits, the kernel kills
    every process in it, so --on-stop=keep cannot keep a run for adoption. The listener
    preempts its runs instead (--on-stop=preempt, the default there): a run that does not
    stop within --preempt-grace is terminated and put back pending without spending an
    attempt, instead of left to die unrecorded (its task 'started' until some node's lease
    sweep, a retry burned for nothing)."""
    params, marker, _ = hold(tmp_path, "task")
    task_id = client.get_queue("work").enqueue(params, max_attempts=1)
    container = spawn(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                       *listen_command(redis_url, "work", "tests.jobs:hold", *FAST,
                                       "--preempt-grace", "1s")])
    wait_until(lambda: lines(marker), what="the task running in the container")
    listener = next(p for p in psutil.Process(container.pid).children(recursive=True)
                    if p.cmdline()[0].startswith("blueque listen"))
    assert client.get_task(task_id).node == f"{hostname()}_1"
    listener.send_signal(signal.SIGTERM)  # docker stop
    assert container.process.wait(20) == 0
    task = client.get_task(task_id)
    assert (task.status, task.attempts, task.data.get("preemptions")) == ("pending", 1, "1"), \
        task.data
    assert "runs as pid 1 of its PID namespace" in container.log()
    assert "(SIGTERM): taking no more tasks" in container.log()
    assert not client.store.listener_ids("work")  # it left cleanly: nothing to recover
