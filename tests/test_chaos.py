"""Chaos: three listeners with their own node names, hundreds of tasks, and for a minute the
things operators and machines do to them: SIGKILL, SIGTERM and restart of listeners, SIGSTOP of
a whole node, SIGKILL and SIGTERM of task processes, SIGKILL of a listener's fork server,
Redis SIGKILLed and restarted from its append-only file, once for longer than a lease, Redis
refusing writes (out of memory, or unable to persist) for a few seconds, Redis stalled (DEBUG
SLEEP) for longer than a lease while a `blueque scheduler` sweeps too, and a node's link to
Redis cut (each node reaches Redis through a blueque.testing.DelayingProxy) for less than a
lease, or for longer than a lease while every slot of the fleet is busy: the first such cut
comes while every node runs two long tasks, which the cut node's sweepers put back for their
retries behind a long line, and which it reclaims at the heal (PROTOCOL.md 5.12b).

At the end no task is lost (every one complete), no task's work finished twice, no two runs of
one task overlapped while one of them went on to finish its work, no node ever ran more task
processes than its --concurrency, and no process is left behind. The figures are printed for
the closing notes of the issues that rely on it."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import redis

import blueque
from blueque.process import signal_pid
from blueque.testing import DelayingProxy, RedisServer
from tests.daemons import Daemon, listen_command, wait_until
from tests.refusals import SERVER_ARGS, Refusal

pytestmark = pytest.mark.slow

TAG = "BLUEQUE_CHAOS_TAG"
INTERVAL = 2.0  # lease 4 s, renewed every second
LEASE = 2 * INTERVAL
TASKS_BEFORE, TASKS_DURING = 160, 60
CONCURRENCY = 2
CHAOS_SECONDS = 50.0
#: Tasks at the head of the line that outlast a long cut: every node starts with two of them.
LONG_TASKS, LONG_SECONDS = 3 * CONCURRENCY, 15.0
#: How long a long cut lasts: past the lease, and past the sweeps that recover the node.
LONG_CUT = (LEASE + 2.0, LEASE + 3.0)
#: Pending tasks a long cut needs: the rest of the fleet does not reach the cut node's put-back
#: retries (at the back of the line) before the heal, so no slot ever starts one.
BACKLOG = 50


def tagged(tag: str, node: str | None = None) -> list[psutil.Process]:
    """Processes started for this run (a node's, or all): the tag is in their environment,
    which forked task processes inherit, even once their listener is gone."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            environ = process.environ()
            if environ.get(TAG) == tag and (node is None or environ.get("CHAOS_NODE") == node):
                found.append(process)
    return found


def command_line(process: psutil.Process) -> list[str] | None:
    """A process's command line, read once; None once it is gone or a zombie. Empty while it
    exits: its memory is released before it becomes a zombie, and no code of its runs then."""
    try:
        return process.cmdline()
    except psutil.Error:
        return None


def fork_server(command: list[str]) -> bool:
    """A listener's fork server (PROTOCOL.md 6.8), by its title, or by its command line while
    it starts (imports, before it sets its title)."""
    return command[1:3] == ["-m", "blueque.task_process.forkserver"] or (
        bool(command) and command[0].startswith("blueque fork server"))


@dataclass
class Node:
    name: str
    url: str
    directory: Path
    tag: str
    options: tuple[str, ...] = ()  # more `blueque listen` options (--reuse)
    daemon: Daemon | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    def start(self) -> None:
        if self.daemon is not None:
            self.daemon.close()  # its log file; the process is gone already
        self.starts += 1
        log = self.directory / f"{self.name}-{self.starts}.log"
        self.logs.append(log)
        command = listen_command(
            self.url, "chaos", "tests.chaos_jobs:work", "--node-name", self.name,
            "--concurrency", str(CONCURRENCY), "--interval", str(INTERVAL), "--poll", "0.2",
            *self.options,
        )
        self.daemon = Daemon(command, log, env={TAG: self.tag, "CHAOS_NODE": self.name})

    def alive(self) -> bool:
        return self.daemon is not None and self.daemon.alive()

    def listener_pid(self) -> int | None:
        return self.daemon.pid if self.alive() and self.daemon is not None else None

    def task_processes(self) -> dict[int, str]:
        """The node's live task processes, by pid, with their titles: neither its listener
        nor its fork server (6.8), nor a process that is exiting or gone (seen in CI: a
        killed listener's fork server, exiting, read as an empty command line)."""
        found = {}
        for process in tagged(self.tag, self.name):
            command = command_line(process)
            if command and process.pid != self.listener_pid() and not fork_server(command):
                found[process.pid] = " ".join(command)[:80]
        return found

    def runs(self, processes: dict[int, str] | None = None) -> dict[int, str]:
        """Its task processes (``processes``, else read now) that run a task: not the idle
        ones, a spare made ahead of its task or a warm process between tasks (PROTOCOL.md
        6.7), told by their title."""
        found = self.task_processes() if processes is None else processes
        return {pid: title for pid, title in found.items()
                if title.startswith("blueque: chaos ") and not title.rstrip().endswith(" idle")}


class SlotWatch(threading.Thread):
    """Samples how many task processes each node runs: adopted runs and fenced runs being
    stopped included, never more than its listener's --concurrency (issue 9, section 3), and
    at most one idle process beside them (the next task's, made while the tasks run: 6.7)."""

    def __init__(self, nodes: list[Node]) -> None:
        super().__init__(daemon=True)
        self.nodes = nodes
        self.most: Counter[str] = Counter()
        self.over: list[tuple[str, list[str]]] = []  # the node, its processes' pid and title
        self.samples = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.1):
            for node in self.nodes:
                processes = node.task_processes()
                runs = node.runs(processes)
                self.most[node.name] = max(self.most[node.name], len(runs))
                if len(runs) > CONCURRENCY or len(processes) > CONCURRENCY + 1:
                    self.over.append((node.name, [f"{pid}: {title}"
                                                  for pid, title in processes.items()]))
            self.samples += 1

    def stop(self) -> None:
        self._done.set()
        self.join(10)


@dataclass
class Run:
    attempt: str
    pid: int
    started: float
    ended: float | None = None


def runs_of(journal: Path) -> list[Run]:
    runs: dict[int, Run] = {}
    for line in journal.read_text().splitlines():
        event, attempt, pid, at = line.split()
        if event == "start":
            runs[int(pid)] = Run(attempt, int(pid), float(at))
        else:
            runs[int(pid)].ended = float(at)
    return sorted(runs.values(), key=lambda run: run.started)


@pytest.fixture
def chaos_server(tmp_path: Path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    server = RedisServer(extra_args=("--appendonly", "yes", "--appendfsync", "always",
                                     "--enable-debug-command", "local", *SERVER_ARGS),
                         directory=str(tmp_path / "redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Chaos:
    """The operator from hell: one random action per step, on a random node."""

    ACTIONS = {"kill listener": 2, "term listener": 2, "stop node": 2, "kill child": 3,
               "term child": 1, "restart redis": 1, "refuse writes": 1, "stall redis": 1,
               "cut node": 2, "cut node long": 1, "kill fork server": 2}

    def __init__(self, server: RedisServer, nodes: list[Node], rng: random.Random,
                 links: dict[str, DelayingProxy] | None = None,
                 backlog: Callable[[], int] = lambda: 0) -> None:
        self.server, self.nodes, self.rng = server, nodes, rng
        self.links = links or {}  # node name -> the proxy its processes reach Redis through
        self.backlog = backlog  # how many tasks wait in the line
        self.events: Counter[str] = Counter()
        self.signalled: set[int] = set()  # task processes the chaos itself killed or stopped
        self.long_outage_due = True  # one Redis outage longer than a lease, the rest shorter
        self.long_cut_due = True  # one cut longer than a lease early, while the long tasks run
        self.cut_off: set[str] = set()  # listener ids cut off longer than their lease
        self.ended: set[str] = set()  # listener ids whose process the chaos ended

    def choose(self, elapsed: float) -> str:
        """The next action: drawn from the menu, but for the long cut and the long outage,
        each once at its time; a long cut only while the fleet is busy (else a short one)."""
        kind = self.rng.choices(list(self.ACTIONS), weights=list(self.ACTIONS.values()))[0]
        if self.long_cut_due and elapsed > 4 and self.fleet_busy():
            kind, self.long_cut_due = "cut node long", False
        if self.long_outage_due and elapsed > 20:
            kind = "restart redis"
        if kind == "cut node long" and not self.fleet_busy():
            kind = "cut node"
        return kind

    def step(self, elapsed: float) -> None:
        node = self.rng.choice(self.nodes)
        kind = self.choose(elapsed)
        if kind == "restart redis":
            self.restart_redis()
        elif kind == "refuse writes":
            self.refuse_writes()
        elif kind == "stall redis":
            self.stall_redis()
        elif kind.startswith("cut node") and node.name in self.links:
            self.cut(node, long=kind == "cut node long")
        elif not node.alive():
            node.start()  # a listener the chaos stopped comes back
            return
        elif kind in ("kill listener", "term listener"):
            self.restart_listener(node, kind == "kill listener")
        elif kind == "stop node":
            self.freeze(node)
        elif not self.signal_process(node, kind):
            return
        self.events[kind] += 1

    def restart_redis(self) -> None:
        down = 3 * LEASE if self.long_outage_due else self.rng.uniform(0.5, 3.0)
        self.long_outage_due = False
        self.server.kill()
        time.sleep(down)  # the outage itself: how long Redis stays away
        self.server.start()

    def refuse_writes(self) -> None:
        """Redis out of memory or unable to persist (issue 19): it answers, refuses writes."""
        refusal = Refusal(self.server)
        refusal.refuse(self.rng.choice(["out of memory", "cannot persist"]))
        time.sleep(self.rng.uniform(0.5, 3.0))  # how long until the operator frees space
        refusal.free()
        refusal.admin.close()

    def stall_redis(self) -> None:
        """Redis answers nobody for longer than a lease, shorter than any socket timeout
        (DEBUG SLEEP): a stall is no death, for the listeners' sweeps and the scheduler's."""
        stall = self.rng.uniform(LEASE, 1.25 * LEASE)
        redis.Redis(port=self.server.port).execute_command("DEBUG", "SLEEP", f"{stall:.2f}")

    def cut(self, node: Node, long: bool = False) -> None:
        """The node's link to Redis goes (its connections drop, new ones are refused) for
        less than a lease, or (``long``) for longer: its listener is recovered elsewhere, and
        at the heal it reclaims the runs still going and records the endings of the others,
        while no put-back retry has started (the fleet is busy: fleet_busy)."""
        link = self.links[node.name]
        daemon = node.daemon
        if long and daemon is not None:
            self.cut_off.add(f"{node.name}_{daemon.pid}")
            back = daemon.log().count("Redis is back")
        link.cut()
        time.sleep(self.rng.uniform(*LONG_CUT) if long else self.rng.uniform(0.3, LEASE / 2))
        link.restore()
        if long and daemon is not None:
            # the cut ends once the node is back (it reclaimed its runs in its first renewal,
            # before it says so): a listener killed in that instant leaves them to its
            # successor, which stops them as fenced (adoption does not reclaim)
            deadline = time.monotonic() + 2 * LEASE
            while daemon.log().count("Redis is back") == back and time.monotonic() < deadline:
                time.sleep(0.05)

    def fleet_busy(self) -> bool:
        """Every node's listener alive and every slot running a task, and a line long enough
        that the fleet does not get through it during a long cut."""
        return (self.backlog() >= BACKLOG
                and all(node.alive() and len(node.runs()) >= CONCURRENCY
                        for node in self.nodes))

    def restart_listener(self, node: Node, kill: bool) -> None:
        assert node.daemon is not None
        self.ended.add(f"{node.name}_{node.daemon.pid}")
        if kill:
            node.daemon.kill()
            time.sleep(self.rng.uniform(0.0, 1.0))  # how long the node stays without one
        else:
            node.daemon.stop(timeout=30)
        node.start()

    def freeze(self, node: Node) -> None:
        frozen = tagged(node.tag, node.name)
        for process in frozen:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGSTOP)
        time.sleep(self.rng.uniform(0.3, LEASE / 2))  # a pause shorter than a lease
        for process in frozen:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGCONT)

    def signal_process(self, node: Node, kind: str) -> bool:
        """A task process SIGKILLed or SIGTERMed, or the fork server SIGKILLed; False: none."""
        if kind == "kill fork server":
            return self.kill_fork_server(node)
        return self.signal_child(node, signal.SIGKILL if kind == "kill child" else signal.SIGTERM)

    @staticmethod
    def kill_fork_server(node: Node) -> bool:
        """SIGKILL the node's fork server (6.8): its children live on and come to the listener,
        which starts another; a fork it was making is made again by the listener."""
        servers = [p for p in tagged(node.tag, node.name) if fork_server(command_line(p) or [])]
        for process in servers:
            with contextlib.suppress(psutil.Error):
                process.kill()
        return bool(servers)

    def signal_child(self, node: Node, signum: int) -> bool:
        children = node.task_processes()
        if not children:
            return False
        victim = self.rng.choice(sorted(children))
        self.signalled.add(victim)
        signal_pid(victim, signum)
        return True


def check_journal(ids: list[str], journal: Path, signalled: set[int]) -> dict[str, int]:
    """Every task's work finished, and more than once only where the chaos killed a run after
    its work and before its outcome was recorded; only the chaos's own signals to task
    processes cut runs short (a listener killed, stopped or restarted, or Redis away, must
    never stop a live run); no run that finished overlapped another run of its task."""
    runs = {task_id: runs_of(journal / task_id) for task_id in ids}
    # a run the chaos signalled after its work may still be the one recorded (its listener
    # took its outcome in first): its finish counts, but it cannot excuse a second clean one
    clean = {t: sum(run.ended is not None and run.pid not in signalled for run in r)
             for t, r in runs.items()}
    ended = {t: sum(run.ended is not None for run in r) for t, r in runs.items()}
    twice = {t: runs[t] for t in ids if clean[t] > 1 or ended[t] == 0}
    assert not twice, f"work finished other than once: {twice}"
    cut_short = {t: r for t, r in runs.items()
                 if any(run.ended is None and run.pid not in signalled for run in r)}
    assert not cut_short, f"runs stopped that nobody signalled: {cut_short}"
    overlapping = {
        task_id: task_runs for task_id, task_runs in runs.items()
        for run in task_runs if run.ended is not None and any(
            other is not run and run.started <= other.started <= run.ended
            for other in task_runs)
    }
    assert not overlapping, f"a run that finished overlapped another run: {overlapping}"
    total = sum(len(r) for r in runs.values())
    return {"runs": total, "reruns": total - len(ids),
            "cut_short_by_chaos": sum(run.ended is None for r in runs.values() for run in r),
            "most_runs_of_one_task": max(len(r) for r in runs.values())}


def unleash(chaos: Chaos, rng: random.Random, began: float,
            enqueue: Callable[[int], list[str]]) -> list[str]:
    """CHAOS_SECONDS of chaos, with more tasks enqueued meanwhile: the ids of those."""
    ids: list[str] = []
    while (elapsed := time.monotonic() - began) < CHAOS_SECONDS:
        time.sleep(rng.uniform(0.5, 1.5))  # the pace of the chaos, not a wait for a state
        if len(ids) < TASKS_DURING and elapsed > 10:
            ids += enqueue(20)  # enqueues ride out the outages too
        chaos.step(elapsed)
    return ids


def clean_up(nodes: list[Node], others: list[Daemon], links: dict[str, DelayingProxy],
             tag: str) -> None:
    for daemon in others + [node.daemon for node in nodes if node.daemon is not None]:
        daemon.close()
    for link in links.values():
        link.close()
    for process in tagged(tag):  # a failing run must not leave processes behind either
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGCONT)
            process.kill()


@pytest.mark.parametrize("mode", [(), ("--reuse", "3")], ids=["fork", "warm"])
def test_chaos_loses_nothing_and_runs_nothing_twice(chaos_server: RedisServer,
                                                    tmp_path: Path, mode: tuple[str, ...]
                                                    ) -> None:
    """In both modes: a process per task, and warm processes (PROTOCOL.md 6.7)."""
    seed = int(os.environ.get("BLUEQUE_CHAOS_SEED", "0")) or random.randrange(1 << 30)
    rng = random.Random(seed)
    tag = f"chaos-{os.getpid()}-{seed}"
    journal = tmp_path / "journal"
    journal.mkdir()
    links = {f"node-{letter}": DelayingProxy(chaos_server.port) for letter in "abc"}
    nodes = [Node(name, link.url(), tmp_path, tag, mode) for name, link in links.items()]
    client = blueque.Client(chaos_server.url)
    queue = client.get_queue("chaos")
    chaos = Chaos(chaos_server, nodes, rng, links, backlog=lambda: queue.stats().pending)

    def enqueue(count: int, seconds: float | None = None) -> list[str]:
        return [
            queue.enqueue(json.dumps({"dir": str(journal),
                                      "seconds": seconds or rng.uniform(0.3, 3.0)}),
                          max_attempts=30, retry_backoff=0)
            for _ in range(count)
        ]

    ids = enqueue(LONG_TASKS, LONG_SECONDS)  # first in line: every node starts with two
    ids += enqueue(TASKS_BEFORE)
    began = time.monotonic()
    scheduler: Daemon | None = None
    slots = SlotWatch(nodes)
    slots.start()
    try:
        for node in nodes:
            node.start()
        # a scheduler sweeps too (it judged leases by a 30-s stall rule of its own and took
        # listeners stalled behind a DEBUG SLEEP for dead)
        scheduler = Daemon([sys.executable, "-m", "blueque.cli", "scheduler", "--url",
                            chaos_server.url, "--interval", "0.5", "--recovery-interval", "1"],
                           tmp_path / "scheduler.log", env={TAG: tag})
        ids += unleash(chaos, rng, began, enqueue)
        chaos_took = time.monotonic() - began
        for node in nodes:
            if not node.alive():
                node.start()

        def drained() -> bool:
            counts = queue.stats()
            return counts.complete + counts.failed >= len(ids)

        wait_until(drained, timeout=240, what=f"{len(ids)} tasks ended")
        drained_at = time.monotonic() - began
        slots.stop()
        assert slots.samples > 0 and not slots.over, (
            f"more runs than slots (seed {seed}): {slots.over[:5]}")
        statuses = Counter(client.get_task(task_id).status for task_id in ids)
        assert statuses == {"complete": len(ids)}, statuses
        assert {client.get_task(task_id).result for task_id in ids} == {"ok"}
        figures = check_journal(ids, journal, chaos.signalled)
        # the scheduler took no live listener for dead: only those cut off longer than their
        # lease, or ended by the chaos (a node left without a listener for longer than a
        # lease: its next one, killed in turn, never adopted the runs and renewed the lease)
        recovered = set(re.findall(r"recovered listener (\S+) on queue", scheduler.log()))
        assert scheduler.alive() and recovered <= chaos.cut_off | chaos.ended, (
            recovered, chaos.cut_off, chaos.ended)
        assert chaos.events["cut node long"] >= 1, chaos.events
        scheduler.stop(timeout=30)
        for node in nodes:
            assert node.daemon is not None
            node.daemon.stop(timeout=30)
        # nothing left behind: every task is complete, so no task process (a fenced run, an
        # adopted child) may outlive the listeners
        wait_until(lambda: not tagged(tag), timeout=15, what="no process left behind")
    finally:
        slots.stop()
        clean_up(nodes, [scheduler] if scheduler is not None else [], links, tag)
    print("chaos figures:", json.dumps({
        "seed": seed, "tasks": len(ids), "complete": statuses["complete"], **figures,
        "events": dict(chaos.events), "listener_starts": sum(n.starts for n in nodes),
        "reclaimed": sum(log.read_text(errors="replace").count("taken back, its run")
                         for node in nodes for log in node.logs),
        "most_runs_on_a_node": max(slots.most.values()), "slot_samples": slots.samples,
        "chaos_s": round(chaos_took, 1), "drained_s": round(drained_at, 1),
    }))
