"""A node keeps its capacity whichever listeners share it (issue 29, point 1): listeners of two
and three queues on one node, stopped (SIGTERM with --on-stop=keep, or SIGKILL) and started
again in every order while their tasks run, with a process per task and with warm processes
(--reuse). A run left by a listener that went away occupies the slots of a listener serving
its queue, and until one is up it still counts against the queue's capacity on the node: at
no moment do more runs of a queue run on the node than its listener's --concurrency, as the
tasks' own start and end marks say. Real daemons, real task processes, one node."""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest

import blueque
from tests.daemons import FAST, Daemon, adopted_by, lines, listen_command, wait_until

pytestmark = pytest.mark.slow

#: The node's queues and their listeners' --concurrency.
CONCURRENCY = {"gpu": 1, "documents": 2, "reports": 1}
SECONDS = 4.0  # each task's run: one left behind outlives the restarts of its round


def spans(marker: Path) -> dict[str, list[tuple[float, int]]]:
    """Each queue's start (+1) and end (-1) marks, by the time the task wrote them."""
    events: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for line in lines(marker):
        kind, queue, _, _, at, _ = line.split()
        events[queue].append((float(at), 1 if kind == "start" else -1))
    return events


def most_at_once(events: list[tuple[float, int]]) -> int:
    """The most runs of one queue between their start and end marks at any moment (an end
    and a start at one instant: the end first)."""
    running = most = 0
    for _, step in sorted(events):
        running += step
        most = max(most, running)
    return most


class Node:
    """The node's listeners, one per queue, each started again after it was stopped."""

    def __init__(self, started: list[Daemon], tmp_path: Path, redis_url: str,
                 queues: Sequence[str], reuse: bool) -> None:
        self.started, self.tmp_path, self.url = started, tmp_path, redis_url
        self.reuse = reuse
        self.listeners = {queue: self.start(queue) for queue in queues}

    def start(self, queue: str) -> Daemon:
        options = [*FAST, "--concurrency", str(CONCURRENCY[queue])]
        if self.reuse:
            options += ["--reuse", "20"]
        daemon = Daemon(listen_command(self.url, queue, "tests.jobs:span", *options),
                        self.tmp_path / f"{queue}-{len(self.started)}.log")
        self.started.append(daemon)
        return daemon

    def stop(self, queue: str, how: signal.Signals) -> None:
        daemon = self.listeners[queue]
        if how == signal.SIGKILL:
            daemon.kill()
        else:
            assert daemon.stop() == 0  # --on-stop=keep: it exits at once, its runs go on

    def restart(self, queue: str) -> None:
        daemon = self.listeners[queue] = self.start(queue)
        # swept once: what it counts of its queue's runs it counts from here on
        wait_until(lambda: "listening on" in daemon.log(), what=f"the {queue} listener up")


@pytest.mark.parametrize(("queues", "reuse"), [
    (("gpu", "documents"), False),
    (("gpu", "documents"), True),
    (("gpu", "documents", "reports"), False),
    (("gpu", "documents", "reports"), True),
], ids=["two queues", "two queues, --reuse", "three queues", "three queues, --reuse"])
def test_no_queue_runs_more_on_the_node_than_its_concurrency_across_restarts(
        client: blueque.Client, redis_url: str, started: list[Daemon], tmp_path: Path,
        queues: tuple[str, ...], reuse: bool) -> None:
    """Every order: a round stops the listeners one after the other, the first while the
    others run on, and with tasks waiting starts them again in the reverse order, so that a
    listener of another queue sweeps (and adopts) the runs left behind first. The rounds
    stop them in each rotation of the queues, and so start them in each reversed one: for
    two and three listeners, every order of stopping or starting comes once. Each listener is
    stopped by SIGTERM (--on-stop=keep) in some rounds and SIGKILL in others."""
    marker = tmp_path / "marker"
    params = json.dumps({"marker": str(marker), "seconds": SECONDS})
    ids: list[str] = []

    def enqueue() -> set[str]:  # one task per slot
        batch = {task_id for queue in queues for task_id in (
            client.get_queue(queue).enqueue(params, max_attempts=5, retry_backoff=0.01)
            for _ in range(CONCURRENCY[queue]))}
        ids.extend(batch)
        return batch

    def running(batch: set[str]) -> set[str]:
        """The queues with a run of ``batch`` in progress."""
        marks = [line.split() for line in lines(marker)]
        begun = {mark[2]: mark[1] for mark in marks if mark[0] == "start" and mark[2] in batch}
        ended = {mark[2] for mark in marks if mark[0] == "end"}
        return {queue for task_id, queue in begun.items() if task_id not in ended}

    node = Node(started, tmp_path, redis_url, queues, reuse)
    for round_ in range(len(queues)):
        order = queues[round_:] + queues[:round_]
        batch = enqueue()
        wait_until(lambda b=batch: running(b) == set(queues),  # type: ignore[misc]
                   what="a new run of every queue")
        for queue in order:
            kill = (queues.index(queue) + round_) % 2
            node.stop(queue, signal.SIGKILL if kill else signal.SIGTERM)
        enqueue()  # waiting while the runs left behind go on
        for queue in reversed(order):
            node.restart(queue)
    for task_id in ids:
        task = client.get_task(task_id).wait(60)
        assert task.status == "complete", task.data
    events = spans(marker)
    assert {queue: most_at_once(events[queue]) for queue in queues} == {
        queue: CONCURRENCY[queue] for queue in queues}  # full, never over
    ended = [line.split()[2] for line in lines(marker) if line.startswith("end")]
    assert sorted(ended) == sorted(ids)  # each task's work done once
    assert all(daemon.alive() for daemon in node.listeners.values())


def test_a_deploy_of_one_listener_beside_another_queues_listener(
        client: blueque.Client, redis_url: str, started: list[Daemon], tmp_path: Path) -> None:
    """The issue's scenario: a --concurrency 1 gpu listener and a documents listener on one
    node; the gpu listener is redeployed (SIGTERM) while its task runs, a new gpu task is
    enqueued, and the documents listener sweeps first. The run waits for a gpu listener,
    counted against gpu's capacity on the node: the new gpu listener counts it from its first
    sweep and starts the new task only once it ended. The adoption is logged with the task,
    its queue and its listener; the listener that left is gone from status at once."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    hold = json.dumps({"marker": str(marker), "release": str(release)})
    node = Node(started, tmp_path, redis_url, (), reuse=False)
    node.listeners["documents"] = node.start("documents")
    gpu = node.listeners["gpu"] = Daemon(
        listen_command(redis_url, "gpu", "tests.jobs:hold", *FAST, "--concurrency", "1"),
        tmp_path / "gpu-first.log")
    started.append(gpu)
    first = client.get_queue("gpu").enqueue(hold)
    wait_until(lambda: any(line.startswith(f"start {first}") for line in lines(marker)),
               what="the first gpu task running")
    gone = client.get_task(first).node
    assert gone is not None and gpu.stop() == 0  # the deploy: its task runs on
    assert gone not in {item.listener for item in client.listeners()}  # gone at once
    documents = node.listeners["documents"]
    wait_until(lambda: f"task {first} of queue gpu" in documents.log(),
               what="the documents listener adopting the gpu run")
    assert "the next listener of gpu starts with it counted" in documents.log()
    assert adopted_by(client, first) == ""  # on no listener's slots: gpu's capacity
    second = client.get_queue("gpu").enqueue(hold)
    successor = Daemon(
        listen_command(redis_url, "gpu", "tests.jobs:hold", *FAST, "--concurrency", "1"),
        tmp_path / "gpu-second.log")
    started.append(successor)
    wait_until(lambda: adopted_by(client, first).endswith(f"_{successor.pid}"),
               what="the new gpu listener counting the run")
    assert f"task {first} of queue gpu" in successor.log()
    assert "on the slots of listener" in successor.log()
    assert client.get_task(second).status == "pending"  # its one slot is the adopted run's
    release.touch()
    done = [client.get_task(task_id).wait(30) for task_id in (first, second)]
    assert [task.status for task in done] == ["complete", "complete"]
    assert done[1].started_at is not None and done[0].finished_at is not None
    assert done[1].started_at >= done[0].finished_at  # one gpu task at a time
    assert not any(line.startswith(f"start {first}") for line in lines(marker)[1:])
