"""blueque.waiting: the one decision every wait runs (what to read, when to listen, when to
stop), step by step on a fake clock; a task without a queue field; and the one progress
renderer, on a terminal and off one."""

from __future__ import annotations

import io
from collections.abc import Sequence

import pytest
import redis

import blueque
from blueque.display import ProgressLine
from blueque.errors import CorruptTask
from blueque.keys import Keys
from blueque.waiting import Listen, Read, Subscribe, WaitResult, follow, next_step, wait_all

K = Keys()
P = {"status": "pending", "queue": "q"}
DONE = {"status": "complete", "queue": "q"}
Listened = tuple[float, "list[str] | None", dict[str, dict[str, str]]]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def trace(hashes: dict[str, dict[str, str]], listens: Sequence[Listened],
          timeout: float | None = None) -> list[str]:
    """The steps ``follow`` takes over WaitResult(hashes): each Read answered from
    ``hashes``; each Listen lasts, hears and changes ``hashes`` as the next entry of
    ``listens`` says (seconds it lasted, ids heard or None for "missed", hashes changed)."""
    clock = Clock()
    result = WaitResult(list(hashes))
    steps = follow(result, timeout, every=1.0, clock=clock)
    pending = iter(listens)
    seen: list[str] = []
    heard: list[str] | None = None
    while (step := next_step(steps, heard)) is not None:
        heard = None
        if isinstance(step, Read):
            seen.append("read " + ",".join(step.what))
            result.took(step.what, [dict(hashes[i]) for i in step.what])
        elif isinstance(step, Subscribe):
            seen.append("subscribe " + ",".join(step.queues))
        else:
            assert isinstance(step, Listen)
            seen.append(f"listen {step.seconds:g}")
            lasted, heard, changes = next(pending)
            clock.now += lasted
            hashes.update(changes)
    return [*seen, "done" if result.done else "timed out"]


@pytest.mark.parametrize(("hashes", "listens", "timeout", "expected"), [
    pytest.param({"a": DONE, "b": {}}, [], None, ["read a,b", "done"],
                 id="ended or missing at the first read: no subscription"),
    pytest.param({"a": P, "b": P}, [(0.2, ["b"], {"b": DONE}), (0.8, [], {"a": DONE})], None,
                 ["read a,b", "subscribe q", "read a,b", "listen 1", "read b", "listen 0.8",
                  "read a", "done"],
                 id="subscribed after the first read, re-read, then what is told at once and "
                    "everything open at least every second"),
    pytest.param({"a": P}, [(0.3, ["other"], {}), (0.7, [], {"a": DONE})], None,
                 ["read a", "subscribe q", "read a", "listen 1", "listen 0.7", "read a",
                  "done"],
                 id="an end of another task of the queue reads nothing"),
    pytest.param({"a": P, "b": P}, [(0.1, None, {"a": DONE}), (1.0, [], {"b": DONE})], None,
                 ["read a,b", "subscribe q", "read a,b", "listen 1", "read a,b", "listen 1",
                  "read b", "done"],
                 id="messages missed: everything open is read at once"),
    pytest.param({"a": P}, [(1.0, [], {}), (1.0, [], {}), (0.5, [], {})], 2.5,
                 ["read a", "subscribe q", "read a", "listen 1", "read a", "listen 1",
                  "read a", "listen 0.5", "timed out"],
                 id="a timeout ends the wait unfinished"),
    pytest.param({"a": P}, [], 0, ["read a", "subscribe q", "read a", "timed out"],
                 id="a timeout of 0 reads after subscribing, then gives up"),
    pytest.param({"a": P, "b": {**P, "queue": "r"}}, [(0.1, ["a", "b"], {"a": DONE, "b": DONE})],
                 None, ["read a,b", "subscribe q,r", "read a,b", "listen 1", "read a,b", "done"],
                 id="the done channels of every open task's queue"),
])
def test_what_a_wait_reads_and_when(hashes: dict[str, dict[str, str]],
                                    listens: Sequence[Listened], timeout: float | None,
                                    expected: list[str]) -> None:
    assert trace(hashes, listens, timeout) == expected


def test_a_task_deleted_while_waited_for_ends_the_wait_as_missing() -> None:
    hashes = {"a": P, "b": P}
    assert trace(hashes, [(0.2, ["a"], {"a": {}}), (0.1, ["b"], {"b": DONE})])[-1] == "done"
    result = WaitResult(["a"])
    result.took(["a"], [{}])
    assert result.done and result.missing() == ["a"] and result.finished() == []


class Queue:
    """What blueque.spark follows by counts: a queue known before the first read."""

    def __init__(self) -> None:
        self.reads = 0

    @property
    def done(self) -> bool:
        return self.reads >= 2

    def queues(self) -> list[str]:
        return ["q"]

    def to_read(self, told: Sequence[str] | None) -> str:
        return "q"

    def took(self, what: str, reply: object) -> None:
        self.reads += 1


def test_a_queue_known_up_front_is_subscribed_before_the_first_read() -> None:
    followed = Queue()
    steps = follow(followed, None, clock=Clock())
    seen = []
    heard: list[str] | None = None
    while (step := next_step(steps, heard)) is not None:
        seen.append(type(step).__name__)
        heard = ["x"] if isinstance(step, Listen) else None
        if isinstance(step, Read):
            followed.took(step.what, None)
    assert seen == ["Subscribe", "Read", "Listen", "Read"]


def test_a_task_without_a_queue_field_cannot_be_waited_for(client: blueque.Client,
                                                            redis_client: redis.Redis) -> None:
    redis_client.hset(K.task("odd"), mapping={"status": "pending"})
    with pytest.raises(CorruptTask, match="no queue field"):
        client.get_task("odd").wait(timeout=5)
    with pytest.raises(CorruptTask, match="no queue field"):
        wait_all(client, ["odd"], timeout=5)


def test_wait_all_reports_every_read_and_what_is_missing(client: blueque.Client) -> None:
    queue = client.get_queue("q")
    task_id = queue.enqueue("p")
    task = client.get_listener("q").reserve()
    assert task is not None
    client.get_processor(task).start(1)
    client.get_processor(task).complete("r")
    reads: list[int] = []
    result = wait_all(client, [task_id, "never"], timeout=5,
                      on_update=lambda r: reads.append(len(r.finished())))
    assert reads == [1] and not result.timed_out
    assert result.missing() == ["never"] and result.tasks[task_id]["result"] == "r"


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_the_progress_line_is_redrawn_in_place_on_a_terminal() -> None:
    stream = Stream(tty=True)
    line = ProgressLine(stream)
    line.update("[#.] 1/2")
    line.update("[##] 2/2")
    line.close()
    assert stream.getvalue() == "\r\x1b[2K[#.] 1/2\r\x1b[2K[##] 2/2\n"


def test_off_a_terminal_a_line_at_most_every_interval_and_the_last() -> None:
    stream, clock = Stream(tty=False), Clock()
    line = ProgressLine(stream, every=10.0, clock=clock)
    for now, text in [(0, "first"), (4, "skipped"), (10, "third"), (12, "last")]:
        clock.now = now
        line.update(text)
    line.close()
    assert stream.getvalue() == "first\nthird\nlast\n"
    untouched = Stream(tty=False)
    ProgressLine(untouched).close()
    assert untouched.getvalue() == ""
