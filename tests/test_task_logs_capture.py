"""Task output read by the listener (PROTOCOL.md 5.19, issue 20 item 4), end to end with real
listeners: a task process starts no thread for its output; each attempt of a warm process
gets its own output, its last line included; the cap holds; a crash keeps what was written
up to it; and a task whose listener is SIGKILLed (or leaves it running) reads its own pipe
from then on, its run adopted by the next listener, and loses nothing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

import blueque
from blueque.tails import read_output
from tests.daemons import gone, wait_until

pytestmark = pytest.mark.slow

MODES = pytest.mark.parametrize("reuse", ["1", "20"], ids=["fork", "warm"])


def attempt_file(logs_dir: Path, task_id: str, attempt: int = 1) -> Path:
    return logs_dir / "work" / f"{task_id}.{attempt}.log"


def whole_output(path: Path) -> bytes:
    """The attempt's output on the node: its older half (``.1``, at the cap) and its file."""
    older = path.with_name(path.name + ".1")
    return (older.read_bytes() if older.exists() else b"") + path.read_bytes()


def ended_output(client: blueque.Client, task_id: str) -> str:
    """The newest attempt's tail in Redis, once its end mark is there."""
    def ended() -> bool:
        output = read_output(client.store, task_id)
        return output is not None and output.ended

    wait_until(ended, what=f"the end mark of task {task_id}'s output")
    output = read_output(client.store, task_id)
    assert output is not None
    return output.text


def numbered(text: str, word: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith(word + " ")]


@MODES
def test_each_attempt_gets_its_own_output_from_a_process_that_starts_no_thread(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, logs_dir: Path, reuse: str) -> None:
    """The task process's only thread is its main one (the capture thread is gone: its
    listener reads the pipe); in a warm process each task's output, down to the line printed
    without its newline just before it returned, is in its own attempt's file and tail."""
    # a longer lease: a process whose outcome is recorded half a lease late is retired (6.7)
    start_logging("tests.output_jobs:threads_and_lines", "--reuse", reuse, "--interval", "2")
    queue = client.get_queue("work")
    pids = set()
    for _ in range(6):
        task_id = queue.enqueue(json.dumps({"lines": 30}))
        task = client.get_task(task_id).wait(30)
        assert task.status == "complete", task.error
        result = json.loads(str(task.result))
        assert (result["threads"], result["proc_threads"]) == (1, 1), result
        pids.add(result["pid"])
        expected = "".join(f"{task_id} line {n}\n" for n in range(30))
        expected += f"{task_id} last line, no newline"
        assert attempt_file(logs_dir, task_id).read_text() == expected
        assert ended_output(client, task_id) == expected
    if reuse == "1":
        assert len(pids) == 6
    else:  # one process ran them all (but for one retired when the machine stalled it)
        assert len(pids) <= 2, pids


@MODES
def test_the_cap_holds_and_the_next_attempt_starts_its_own_file(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, logs_dir: Path, reuse: str) -> None:
    """Three tasks in a row, each printing 3 MB against a 1 MiB cap: each attempt's file and
    its ``.1`` stay within the cap, hold only that task's lines, and end with its last line."""
    start_logging("tests.output_jobs:threads_and_lines", "--reuse", reuse, "--log-max-bytes", "1M")
    queue = client.get_queue("work")
    for _ in range(3):
        task_id = queue.enqueue(json.dumps({"lines": 5, "bytes": 3_000_000}))
        assert client.get_task(task_id).wait(60).status == "complete"
        path = attempt_file(logs_dir, task_id)
        older = path.with_name(path.name + ".1")
        assert path.stat().st_size <= 1 << 20 and older.stat().st_size <= 1 << 20
        text = whole_output(path).decode()
        assert text.endswith(f"{task_id} last line, no newline")
        assert all(line.startswith(f"{task_id} ") for line in text.splitlines())
        fills = numbered(text.replace(f"{task_id} fill", "fill"), "fill")
        assert fills == list(range(fills[0], fills[0] + len(fills)))  # none lost in between
        tail = ended_output(client, task_id)
        assert tail.endswith(f"{task_id} last line, no newline") and text.endswith(tail)


@MODES
@pytest.mark.parametrize("ending", [{}, {"exit": 5}], ids=["sigkill", "os._exit"])
def test_a_task_that_dies_mid_line_keeps_its_output_up_to_the_crash(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, logs_dir: Path, reuse: str,
        ending: dict[str, int]) -> None:
    """What the task wrote before it died, down to half a line, is in its file (the listener
    drains the pipe once it reaps it) and its tail in Redis, with the end mark; the next
    task (in a warm listener, a fresh process) has its own."""
    start_logging("tests.output_jobs:writes_then_dies", "--reuse", reuse)
    queue = client.get_queue("work")
    for _ in range(2):
        task_id = queue.enqueue(json.dumps({"bytes": 300_000, **ending}))
        assert client.get_task(task_id).wait(30).status == "failed"
        text = attempt_file(logs_dir, task_id).read_text()
        assert text.endswith("half a line")
        lines = numbered(text, "line")
        assert lines == list(range(len(lines))) and len(lines) * 75 >= 300_000
        tail = ended_output(client, task_id)
        assert tail.endswith("half a line") and text.endswith(tail)


@MODES
def test_a_task_killed_from_outside_while_it_writes_keeps_every_whole_line(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, logs_dir: Path, reuse: str) -> None:
    start_logging("tests.output_jobs:writes_until_killed", "--reuse", reuse)
    task_id = client.get_queue("work").enqueue("{}")
    path = attempt_file(logs_dir, task_id)
    wait_until(lambda: path.exists() and path.stat().st_size > 200_000, what="output")
    pid = client.get_task(task_id).pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert client.get_task(task_id).wait(30).status == "failed"
    tail = ended_output(client, task_id)
    text = path.read_text()
    lines = numbered(text, "line")
    assert lines == list(range(len(lines))) and text.endswith("\n")
    assert text.endswith(tail) and len(tail) > 1000


@pytest.mark.parametrize("keep", [0, 1], ids=["piped", "keep_processes"])
@pytest.mark.parametrize("leaving", ["sigkill", "on-stop-keep"])
def test_a_task_whose_listener_is_gone_reads_its_own_output_and_loses_none(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, logs_dir: Path, tmp_path: Path, leaving: str,
        keep: int) -> None:
    """The listener read the task's pipe; it is SIGKILLed (the kernel's parent-death signal
    tells the task process) or leaves it running (``--on-stop keep``: it tells it). From then
    the task process reads its own pipe: it then prints more than a pipe holds (a process
    nobody read would block there for good), its run is adopted by the next listener (which
    cannot read that pipe), and every line is in its file, the tail and the end mark in
    Redis, shipped by the process itself. A task that keeps its processes writes its file
    itself: its listener shipped it, then the process does."""
    go, release = tmp_path / "go", tmp_path / "release"
    first = start_logging("tests.output_jobs:ticks_then_floods", "--on-stop", "keep")
    task_id = client.get_queue("work").enqueue(json.dumps(
        {"go": str(go), "release": str(release), "bytes": 400_000}), keep_processes=keep)
    path = attempt_file(logs_dir, task_id)
    wait_until(lambda: path.exists() and "tick 20\n" in path.read_text(), what="ticks")
    def shipped() -> str:
        output = read_output(client.store, task_id)
        return output.text if output is not None else ""

    wait_until(lambda: "tick 20\n" in shipped(), what="ticks shipped by the listener")
    pid = client.get_task(task_id).pid
    assert pid is not None
    if leaving == "sigkill":
        first.kill()
    else:
        assert first.stop() == 0
    assert not gone(pid)
    go.touch()
    wait_until(lambda: "FLOOD DONE" in path.read_text(), what="the flood past the pipe's size")
    second = start_logging("tests.output_jobs:ticks_then_floods")
    wait_until(lambda: "1 adopted task(s)" in second.log(), what="the run adopted")
    release.touch()
    task = client.get_task(task_id).wait(30)
    assert task.status == "complete" and str(first.pid) in (task.node or "")  # it recorded
    wait_until(lambda: gone(pid), what="the orphan gone")
    text = path.read_text()
    ticks, floods = numbered(text, "tick"), numbered(text, "flood")
    assert ticks == list(range(len(ticks))) and len(ticks) > 20
    assert floods == list(range(len(floods))) and len(floods) * 76 >= 400_000
    # then the process's own word that it records its outcome itself (its log is its stderr)
    assert f"FLOOD DONE\nbye from {pid}\n" in text and text.endswith("itself\n")
    tail = ended_output(client, task_id)
    assert f"FLOOD DONE\nbye from {pid}\n" in tail and text.endswith(tail)
    assert second.alive()
