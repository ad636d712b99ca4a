"""Task output: captured per attempt on the node, kept in Redis, read with `blueque logs` from
any process; the listener's own log stays clean; task processes carry readable titles."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import redis

import blueque
from blueque.daemon.running import describe_ending
from blueque.display import format_seconds
from blueque.errors import RedisUnavailable
from blueque.keys import Keys
from blueque.tails import follow_output, read_output, read_outputs
from blueque.tasklog import TAIL_BYTES, Shipper, TaskLogSettings
from blueque.web.task_page import task_page
from tests.daemons import FAST, ROOT, Daemon, daemons, listen_command, wait_until

pytestmark = pytest.mark.slow



def blueque_cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "blueque.cli", *args, "--url", redis_url],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)


def test_each_attempt_has_its_file_and_its_tail_in_redis(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, start_logging, logs_dir: Path) -> None:
    daemon = start_logging("tests.output_jobs:chatty", "--log-format", "json")
    task_id = client.get_queue("work").enqueue("{}", max_attempts=2, retry_backoff=0.01)
    assert client.get_task(task_id).wait(30).status == "complete"

    first = (logs_dir / "work" / f"{task_id}.1.log").read_text()
    second = (logs_dir / "work" / f"{task_id}.2.log").read_text()
    assert "hello from attempt 1" in first and "not json {{{" in first
    assert "ValueError: first attempt fails" in first  # the traceback, where it failed
    assert "hello from attempt 2" in second and "second attempt done" in second
    assert "attempt 1" not in second

    shown = blueque_cli(redis_url, "logs", task_id)  # another process, through Redis only
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == second
    earlier = blueque_cli(redis_url, "logs", task_id, "--attempt", "1")
    assert earlier.returncode == 0 and earlier.stdout == first

    # the listener's own log is JSON lines only, though the task printed garbage to both
    # of its streams; and it says how each attempt ended
    wait_until(lambda: "complete in" in daemon.log(), what="the ending logged")
    events = [json.loads(line) for line in daemon.log().splitlines()]
    endings = [e["message"] for e in events if e.get("event") == "ended"]
    assert any("attempt 1 failed in" in m and "retry in" in m
               and "ValueError: first attempt fails" in m for m in endings), endings
    assert any("attempt 2 complete in" in m for m in endings), endings


def test_logs_of_unknown_task_and_of_missing_attempt(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str) -> None:
    missing = blueque_cli(redis_url, "logs", "no-such-task")
    assert missing.returncode == 4 and "no-such-task" in missing.stderr
    task_id = client.get_queue("work").enqueue("{}")
    silent = blueque_cli(redis_url, "logs", task_id)  # no output: said, not a failure
    assert silent.returncode == 0 and "has not run yet: it has no output" in silent.stderr
    beyond = blueque_cli(redis_url, "logs", task_id, "--attempt", "1")
    assert beyond.returncode == 1 and "there is no attempt 1" in beyond.stderr


def test_logs_json_is_the_attempts_output_as_one_record(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, blueque_main) -> None:
    """--json gives the attempt's output, its number and whether it ended; with --follow
    (which streams text as it comes) it is refused as a usage error."""
    task_id = client.get_queue("work").enqueue("{}", max_attempts=2)
    task = client.get_listener("work").reserve()
    assert task is not None
    client.get_processor(task).start(4242)
    client.store.append_output(task_id, "1", "a line\n", 7)
    done = blueque_main("logs", task_id, "--json", "--url", redis_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"id": task_id, "attempt": 1, "text": "a line\n",
                                       "ended": False}
    # the attempt ends: its entry and the rest move to the task's output tails (5.19)
    assert client.store.end_output(task_id, "1", "the end\n", 15, 60_000, TAIL_BYTES) == 15
    ended = json.loads(blueque_main("--json", "logs", task_id, "--url", redis_url).stdout)
    assert ended["text"] == "a line\nthe end\n" and ended["ended"] is True
    assert not client.redis.exists(Keys().task_log(task_id))  # the stream went with it
    refused = blueque_main("--json", "logs", task_id, "--follow", "--url", redis_url)
    assert refused.returncode == 2 and "--follow" in refused.stderr and refused.stdout == ""


def test_logs_of_a_task_cancelled_before_it_ran_say_so(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, blueque_main) -> None:
    """Not "no output" (which would send one looking for --no-task-logs): it never ran."""
    task_id = client.get_queue("work").enqueue("{}")
    assert client.cancel_task(task_id, "not needed after all") == "cancelled"
    for follow in ((), ("--follow",)):
        done = blueque_main("logs", task_id, *follow, "--url", redis_url)
        assert (done.returncode, done.stdout) == (0, ""), follow
        assert "was cancelled before it ran" in done.stderr, done.stderr
        assert "not needed after all" in done.stderr and "no output of" not in done.stderr


def test_follow_streams_a_running_task_until_it_ends(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, start_logging, tmp_path: Path) -> None:
    start_logging("tests.output_jobs:ticking")
    release = tmp_path / "release"
    task_id = client.get_queue("work").enqueue(json.dumps({"release": str(release)}))
    wait_until(lambda: read_output(client.store, task_id) is not None, what="first output")
    out_path = tmp_path / "follow.out"
    with open(out_path, "w") as out:
        follower = subprocess.Popen(
            [sys.executable, "-m", "blueque.cli", "logs", task_id, "--follow", "--url",
             redis_url], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out)
        try:
            seen = 0

            def ticks() -> int:
                return out_path.read_text().count("tick ")

            wait_until(lambda: ticks() > 5, what="ticks streamed")
            seen = ticks()
            wait_until(lambda: ticks() > seen + 5, what="more ticks while it runs")
            assert follower.poll() is None  # still following a running task
            release.touch()
            follower.wait(30)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    assert follower.returncode == 0
    text = out_path.read_text()
    assert text.endswith("bye\n")
    numbers = [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick")]
    assert numbers == list(range(len(numbers)))  # every tick once, in order


@pytest.mark.parametrize("ending", [{}, {"exit": 3}, {"exit": 0}],
                         ids=["segfault", "exit-3", "exit-0"])
def test_a_crashed_run_has_its_last_output_shipped_by_the_listener(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, ending: dict[str, int]) -> None:
    """Exit codes 3 and 0 are also the ones the child uses to say it did not start the task
    or that its outcome is recorded: from a run told to go, they are its task's own exit,
    and its output was lost and its log line said "not started"."""
    daemon = start_logging("tests.output_jobs:flood_then_crash")
    task_id = client.get_queue("work").enqueue(json.dumps({"bytes": 300_000, **ending}))
    assert client.get_task(task_id).wait(30).status == "failed"
    wait_until(lambda: "failed in" in daemon.log(), what="the ending logged")
    assert f"task {task_id} queue work attempt 1 failed in" in daemon.log()
    assert "died, node" in daemon.log() and "not started" not in daemon.log()

    def shipped() -> bool:
        output = read_output(client.store, task_id)
        return output is not None and output.ended

    wait_until(shipped, what="the attempt's end mark")
    output = read_output(client.store, task_id)
    assert output is not None
    assert output.text.endswith("LAST LINE BEFORE THE CRASH\n")
    assert len(output.text.encode()) <= TAIL_BYTES + 16 * 1024  # the tail, not 300 KB
    assert output.text.count("line ") > 100


def test_a_log_file_that_cannot_be_opened_costs_the_output_not_the_listener(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, logs_dir: Path, tmp_path: Path) -> None:
    """The attempt's file cannot be opened (here its queue's directory is a file; a
    permission or a disk error does the same): the listener died of the NotADirectoryError
    when it shipped the rest of the file, and the task's output went into the listener's own
    log. Now the task runs, its output is dropped with a word in the log, the daemon lives."""
    logs_dir.mkdir(parents=True)
    (logs_dir / "work").write_text("a file where the queue's directory should be")
    daemon = start_logging("tests.output_jobs:flood", "--log-format", "json")
    (tmp_path / "release").touch()
    queue = client.get_queue("work")
    params = json.dumps({"bytes": 2000, "release": str(tmp_path / "release")})
    for _ in range(2):
        task_id = queue.enqueue(params)
        assert client.get_task(task_id).wait(20).status == "complete"
    def endings() -> int:  # the ended events (their message and ending both say "complete")
        return sum(json.loads(line).get("outcome") == "complete"
                   for line in daemon.log().splitlines())
    wait_until(lambda: endings() == 2, what="both endings logged")
    assert daemon.alive()
    assert "FLOOD DONE" not in daemon.log() and "line 0000" not in daemon.log()
    events = [json.loads(line) for line in daemon.log().splitlines()]  # JSON lines only
    assert any("output not captured" in str(e["message"]) for e in events)
    assert read_output(client.store, task_id) is None


def test_task_process_has_a_readable_title_and_delete_removes_the_output(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_client, start_logging, tmp_path: Path) -> None:
    daemon = start_logging("tests.output_jobs:waits")
    release = tmp_path / "release"
    queue = client.get_queue("work")
    task_id = queue.enqueue(json.dumps({"release": str(release)}))
    wait_until(lambda: client.get_task(task_id).status == "started", what="running")
    pid = client.get_task(task_id).pid
    assert pid is not None
    wait_until(lambda: psutil.Process(pid).cmdline()[:1] == [
        f"blueque: work {task_id} attempt 1"], what="the task process's title")
    listener = client.get_task(task_id).node
    assert listener is not None and listener.endswith(f"_{daemon.pid}")
    assert psutil.Process(daemon.pid).cmdline()[:1] == [
        f"blueque listen work tests.output_jobs:waits ({listener})"]
    release.touch()
    task = client.get_task(task_id).wait(20)
    wait_until(lambda: redis_client.exists(Keys().task_output(task_id)), what="its tail")
    queue.delete_task(task)
    assert not redis_client.exists(Keys().task_output(task_id))
    assert not redis_client.exists(Keys().task_log(task_id))


def test_an_attempt_that_writes_nothing_costs_no_stream_writes(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_client, start_logging) -> None:
    """A no-op task's output costs nothing in Redis: no entry, not even an end mark."""
    start_logging("tests.jobs:text")
    task_id = client.get_queue("work").enqueue("quiet")
    assert client.get_task(task_id).wait(20).result == "processed quiet"
    assert not redis_client.exists(Keys().task_log(task_id))
    assert not redis_client.exists(Keys().task_output(task_id))
    assert read_output(client.store, task_id) is None


def test_a_quiet_attempt_leaves_no_file_and_a_last_unfinished_line_is_output(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, start_logging, logs_dir: Path) -> None:
    """A node running millions of quiet tasks keeps no million empty files; and a last line
    printed without its newline reaches the file, and Redis, before the attempt's end."""
    first = start_logging("tests.jobs:text")
    quiet = client.get_queue("work").enqueue("quiet")
    assert client.get_task(quiet).wait(20).status == "complete"
    # the listener removes the quiet attempt's empty file once it reaped its process
    quiet_file = logs_dir / "work" / f"{quiet}.1.log"
    wait_until(lambda: not quiet_file.exists(), what="the quiet attempt's file removed")
    first.stop()  # the next task is the next listener's
    start_logging("tests.output_jobs:unfinished_line")
    ended = client.get_queue("work").enqueue("{}")
    assert client.get_task(ended).wait(20).status == "complete"
    assert (logs_dir / "work" / f"{ended}.1.log").read_text() == (
        "first line\n50% and no newline")
    shown = blueque_cli(redis_url, "logs", ended)
    assert shown.returncode == 0 and shown.stdout.endswith("50% and no newline"), shown


def test_file_cap_moves_the_older_output_aside_and_old_files_are_cleaned(  # type: ignore[no-untyped-def]
        client: blueque.Client, tmp_path: Path) -> None:
    settings = TaskLogSettings(tmp_path / "logs", max_bytes=4096, keep=3600)
    path = settings.path("work", "t/1", 1)
    assert path.parent == settings.directory / "work" and "/" not in path.name
    path.parent.mkdir(parents=True)
    path.write_text("a" * 5000)
    shipper = Shipper(client.store, settings, "t/1", 1, path, None)
    shipper.ship()
    assert path.stat().st_size == 0
    assert path.with_name(path.name + ".1").read_text() == "a" * 5000
    with open(path, "a") as handle:
        handle.write("after the cut\n")
    shipper.ship(end=True)
    output = read_output(client.store, "t/1")
    assert output is not None and output.ended
    assert output.text.endswith("a" * 100 + "after the cut\n")
    old = time.time() - 7200
    os.utime(path, (old, old))
    assert settings.clean() == 1 and not path.exists()
    assert path.with_name(path.name + ".1").exists()  # it is recent


@pytest.mark.parametrize("queue", ["..", ".", "a/../..", "", "\0"])
@pytest.mark.parametrize("task_id", ["..", ".", "../x", "t"])
def test_every_attempts_file_is_one_level_down_in_the_log_directory(
        tmp_path: Path, queue: str, task_id: str) -> None:
    """Queue names and task ids are anyone's text: a queue named '..' put its files beside
    the log directory instead of in it (where the cleaning never looked)."""
    settings = TaskLogSettings(tmp_path / "logs")
    path = settings.path(queue, task_id, 2)
    assert path.parent.parent == settings.directory
    assert path.parent.name not in ("", ".", "..") and path.name.endswith(".2.log")
    assert os.path.normpath(path) == str(path)  # nothing in it walks up or stays put
    assert "\0" not in str(path)  # open() refuses it (ValueError, not OSError)


@pytest.mark.parametrize(("fields", "outcome", "expected"), [
    ({"status": "complete", "attempts": "2"}, "complete", "complete in 3h12m"),
    ({"status": "failed", "attempts": "2", "error": "bad",
      "traceback": "Traceback...\nValueError: bad\n"}, "failed",
     "failed in 3h12m: ValueError: bad"),
    ({"status": "failed", "attempts": "2", "error": "by operator (stopped)",
      "cancelled": "1795000000.5"}, "cancelled", "cancelled in 3h12m: by operator (stopped)"),
    ({"status": "scheduled", "attempts": "2", "error": "boom", "eta": "9e18"}, "retrying",
     "failed in 3h12m, retry in "),
    ({"status": "pending", "attempts": "2", "updated": "1795000000.5",
      "preempted_at": "1795000000.5"}, "preempted", "preempted in 3h12m: the task is pending"),
    ({"status": "pending", "attempts": "2", "updated": "1795000009.5",
      "preempted_at": "1795000000.5"}, "requeued", "ended in 3h12m, put back: the task is "),
    ({"status": "started", "attempts": "3"}, "superseded", "ended in 3h12m, superseded: the "
                                                           "task is started at attempt 3"),
    # cancelled meanwhile: the log line says cancelled, not failed (its status)
    ({"status": "failed", "attempts": "3", "cancelled": "1795000000.5"}, "superseded",
     "ended in 3h12m, superseded: the task is cancelled at attempt 3"),
    ({"status": "started", "attempts": "2"}, "unsettled", "ended in 3h12m; the task is started"),
    ({}, "missing", "ended in 3h12m; its task's hash is not in Redis (deleted, expired, or "
                    "lost with Redis' data: a server restarted empty, a failover to a replica "
                    "without it)"),
])
def test_describe_ending(fields: dict[str, str], outcome: str, expected: str) -> None:
    said = describe_ending(fields, 2, "3h12m", time.time())
    assert said[0] == outcome and said[1].startswith(expected)


def _read_until(fd: int, wanted: str, timeout: float = 20.0) -> str:
    """Read a pty's output until ``wanted`` appears (select with a deadline)."""
    seen = ""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{wanted!r} not shown; the terminal got {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                seen += os.read(fd, 4096).decode(errors="replace")
            except OSError:  # the other end closed
                break
    return seen


def test_wait_on_one_task_shows_its_progress_on_a_terminal_only(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, tmp_path: Path) -> None:
    with daemons(tmp_path) as started:
        started.append(Daemon(listen_command(redis_url, "work", "tests.jobs:progress", *FAST),
                              tmp_path / "daemon.log"))
        release = tmp_path / "release"
        params = json.dumps({"release": str(release), "seconds": 60,
                             "marker": str(tmp_path / "marker")})
        task_id = client.get_queue("work").enqueue(params)
        master, slave = pty.openpty()
        waiter = subprocess.Popen(
            [sys.executable, "-m", "blueque.cli", "wait", task_id, "--url", redis_url],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
            stderr=slave)
        os.close(slave)
        try:
            shown = _read_until(master, "50% half way")
            assert "[" + "#" * 15 + "." * 15 + "]" in shown
            release.touch()
            # its last bar says how it ended, not the last step it reported (50% half way
            # above a table that says complete read as if it stopped half way)
            assert "[" + "#" * 30 + "] 100% complete" in _read_until(master, "100% complete")
            out, _ = waiter.communicate(timeout=30)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
            os.close(master)
        assert waiter.returncode == 0 and "complete" in out.decode()

        # not a terminal: the table only, no bar
        plain = subprocess.run(
            [sys.executable, "-m", "blueque.cli", "wait", task_id, "--url", redis_url],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
            text=True, timeout=30)
        assert plain.returncode == 0 and plain.stderr == "" and "complete" in plain.stdout


def test_tasks_shows_when_scheduled_tasks_run(redis_url: str, client: blueque.Client) -> None:
    later = blueque_cli(redis_url, "enqueue", "work", "{}", "--delay", "2h")
    assert later.returncode == 0
    shown = blueque_cli(redis_url, "tasks", "work")
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if later.stdout.strip() in line)
    assert "scheduled" in row and ("in 1h59m" in row or "in 2h00m" in row)


def test_durations_read_as_people_write_them() -> None:
    assert [format_seconds(s) for s in (0.25, 42, 425, 3 * 3600 + 12 * 60, 7 * 86400,
                                        2 * 86400 + 4 * 3600)] == [
        "250ms", "42s", "7m05s", "3h12m", "7d", "2d04h"]
    # seconds are cut, never rounded up past the unit: 59.96 s is not "60s" (then 1m00s)
    assert [format_seconds(s) for s in (59.96, 119.6, 3599.9)] == ["59s", "1m59s", "59m59s"]
    # a corrupt field (inf, nan) read as a time must not stop a listing
    assert [format_seconds(s) for s in (math.inf, -math.inf, math.nan)] == ["-", "-", "-"]


def test_listener_caps_and_cleans_its_task_log_files(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, logs_dir: Path, tmp_path: Path) -> None:
    """--log-max-bytes: an attempt's file past the cap moves aside to .1 and starts again;
    --log-keep: the listener's sweeps remove files that old (a real listener, its own
    options)."""
    start_logging("tests.output_jobs:flood", "--log-max-bytes", "64K", "--log-keep", "3")
    release = tmp_path / "release"
    task_id = client.get_queue("work").enqueue(
        json.dumps({"bytes": 300_000, "release": str(release)}))
    path = logs_dir / "work" / f"{task_id}.1.log"
    rotated = path.with_name(path.name + ".1")

    def flood_done() -> bool:  # between its move aside and its new file, there is no file
        with contextlib.suppress(FileNotFoundError):
            return rotated.exists() and "FLOOD DONE" in rotated.read_text() + path.read_text()
        return False

    wait_until(flood_done, what="the file moved aside at the cap, and the flood's end written")
    assert path.stat().st_size <= 64 * 1024 and rotated.stat().st_size <= 64 * 1024
    release.touch()
    assert client.get_task(task_id).wait(20).status == "complete"
    output = read_output(client.store, task_id)
    assert output is not None and output.ended and "FLOOD DONE" in output.text
    wait_until(lambda: not path.exists() and not rotated.exists(), timeout=20,
               what="the files older than --log-keep removed by the listener")


def test_the_file_cap_holds_for_a_task_that_writes_as_fast_as_it_can(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, logs_dir: Path) -> None:
    """Issue 19 item 8: the shipper cut the file every half second, and a task writing at C
    speed filled 200 MB against a 10 MB cap in between. Now no file of the attempt ever
    holds more than --log-max-bytes, and the end of the output is kept and shipped."""
    start_logging("tests.output_jobs:blast", "--log-max-bytes", "1M")
    task_id = client.get_queue("work").enqueue(json.dumps({"bytes": 64 << 20}))
    path = logs_dir / "work" / f"{task_id}.1.log"
    rotated = path.with_name(path.name + ".1")
    sizes: list[int] = []

    def ended() -> bool:
        for file in (path, rotated):
            with contextlib.suppress(OSError):
                sizes.append(file.stat().st_size)
        return client.get_task(task_id).status == "complete"

    wait_until(ended, timeout=60, what="the task complete")
    assert sizes and max(sizes) <= 1 << 20, max(sizes)
    assert path.stat().st_size <= 1 << 20 and rotated.stat().st_size <= 1 << 20
    assert (rotated.read_bytes() + path.read_bytes()).endswith(b"BLAST DONE\n")
    output = read_output(client.store, task_id)
    assert output is not None and output.text.endswith("BLAST DONE\n")


def test_follow_waits_for_a_task_that_has_not_started(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, start_logging, tmp_path: Path) -> None:
    """`blueque logs ID --follow` right after enqueueing: it waits for the first line."""
    release = tmp_path / "release"
    task_id = client.get_queue("work").enqueue(json.dumps({"release": str(release)}))
    out_path = tmp_path / "follow.out"
    with open(out_path, "w") as out:
        follower = subprocess.Popen(
            [sys.executable, "-m", "blueque.cli", "logs", task_id, "--follow", "--url",
             redis_url], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out,
            stderr=subprocess.PIPE, text=True)
        try:
            def follower_reading() -> bool:  # its connection's last command: a read of the stream
                return follower.poll() is not None or any(
                    c.get("cmd") in ("xrange", "hgetall") for c in client.redis.client_list())

            wait_until(follower_reading, what="the follower to look for output")
            assert follower.poll() is None, follower.communicate()[1]  # waiting, not failing
            start_logging("tests.output_jobs:ticking")
            wait_until(lambda: "tick 5" in out_path.read_text(), what="ticks followed")
            release.touch()
            _, err = follower.communicate(timeout=30)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    assert follower.returncode == 0, err
    assert out_path.read_text().startswith("tick 0\n") and out_path.read_text().endswith("bye\n")


def test_follow_stops_when_a_later_attempt_begins(client: blueque.Client,
                                                  redis_url: str, tmp_path: Path) -> None:
    """An attempt whose process died unwatched (with its listener) has no end mark; once the
    task's next attempt writes, following the old one stops and says where to look."""
    task_id = client.get_queue("work").enqueue("{}", max_attempts=3)
    task = client.get_listener("work").reserve()
    assert task is not None
    client.get_processor(task).start(4242)
    store = client.store
    store.append_output(task_id, "1", "first attempt's line\n", 21)
    out_path = tmp_path / "follow.out"
    with open(out_path, "w") as out:
        follower = subprocess.Popen(
            [sys.executable, "-m", "blueque.cli", "logs", task_id, "--follow", "--url",
             redis_url], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out,
            stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: "first attempt's line" in out_path.read_text(),
                       what="attempt 1 printed")
            store.append_output(task_id, "1", "more of attempt 1\n", 39)
            wait_until(lambda: "more of attempt 1" in out_path.read_text(), what="followed")
            assert follower.poll() is None
            store.append_output(task_id, "2", "attempt 2 begins\n", 17)
            _, err = follower.communicate(timeout=20)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    assert follower.returncode == 0
    assert out_path.read_text() == "first attempt's line\nmore of attempt 1\n"
    assert "attempt 2 has begun" in err


def test_listener_log_says_cancelled_and_time_limit_with_queue_and_node(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, tmp_path: Path) -> None:
    daemon = start_logging("tests.output_jobs:waits", "--log-format", "json", "--node-name",
                   "ocr-7", "--concurrency", "2")
    queue = client.get_queue("work")
    never = json.dumps({"release": str(tmp_path / "never")})
    cancelled = queue.enqueue(never)
    limited = queue.enqueue(never, time_limit=0.5, kill_grace=0.2)
    wait_until(lambda: client.get_task(cancelled).status == "started", what="started")
    client.cancel_task(cancelled, "by an operator")
    assert client.get_task(cancelled).wait(20).status == "failed"
    assert client.get_task(limited).wait(20).status == "failed"

    def endings() -> dict[str, dict[str, object]]:
        events = [json.loads(line) for line in daemon.log().splitlines()]  # JSON lines only
        return {str(e["task_id"]): e for e in events if e.get("event") == "ended"}

    wait_until(lambda: {cancelled, limited} <= set(endings()), what="both endings logged")
    for task_id, said in ((cancelled, "attempt 1 cancelled in "),
                          (limited, "attempt 1 failed in ")):
        event = endings()[task_id]
        message = str(event["message"])
        assert message.startswith(f"task {task_id} queue work {said}"), message
        assert event["queue"] == "work" and str(event["node"]).startswith("ocr-7")
        assert f"node {event['node']}" in message
    assert "by an operator" in str(endings()[cancelled]["message"])
    assert "time limit of 0.5 s exceeded" in str(endings()[limited]["message"])


def test_a_task_id_or_reason_cannot_forge_lines_in_the_listeners_text_log(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, tmp_path: Path) -> None:
    """Task ids and cancel reasons are anyone's text, and the text log wrote them raw: a
    newline in a task id (ids may hold any character but a space) forged a line of the log,
    and an escape sequence reached the terminal of whoever tails it. Each record is one line,
    control characters written out."""
    daemon = start_logging("tests.output_jobs:waits", "--concurrency", "2")
    queue = client.get_queue("work")
    never = json.dumps({"release": str(tmp_path / "never")})
    by_id = queue.enqueue(never, task_id="x\n2001-01-01\tINFO\tforged\x1b]0;owned\x07")
    by_reason = queue.enqueue(never)
    for task_id in (by_id, by_reason):
        wait_until(lambda t=task_id: client.get_task(t).status == "started", what="started")
        client.cancel_task(task_id, "by an operator\n2001-01-01 INFO forged \x1b[2J")
        assert client.get_task(task_id).wait(20).status == "failed"
    wait_until(lambda: daemon.log().count("cancelled in") == 2, what="both endings logged")
    lines = daemon.log().splitlines()
    assert not [line for line in lines if line.startswith("2001")], lines
    assert not set(daemon.log()) & {"\x1b", "\x07"}
    assert "task x\\x0a2001-01-01\tINFO\tforged\\x1b]0;owned\\x07 queue work" in daemon.log()
    assert "\\x1b[2J" in daemon.log()


def test_tasks_shows_when_a_retrying_task_runs_again_and_show_survives_far_dates(
        redis_url: str, client: blueque.Client, redis_client: redis.Redis) -> None:
    task_id = client.get_queue("work").enqueue("{}", max_attempts=3)
    task = client.get_listener("work").reserve()
    assert task is not None
    processor = client.get_processor(task)
    processor.start(4242)
    processor.retry("it broke once", time.time() + 600)
    shown = blueque_cli(redis_url, "tasks", "work")
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if task_id in line)
    assert "scheduled" in row and ("in 9m5" in row or "in 10m00s" in row), row
    far = blueque_cli(redis_url, "enqueue", "work", "{}", "--delay", "600000w")
    assert far.returncode == 0, far.stderr
    shown = blueque_cli(redis_url, "show", far.stdout.strip())
    assert shown.returncode == 0, shown.stderr
    assert "(not a date)" in shown.stdout
    # an eta Redis holds as inf or nan (corrupt, or written by hand) keeps the listing up
    for value in ("inf", "nan"):
        redis_client.hset(Keys().task(far.stdout.strip()), "eta", value)
        shown = blueque_cli(redis_url, "tasks", "work")
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
        row = next(line for line in shown.stdout.splitlines() if far.stdout.strip() in line)
        assert "scheduled  -" in row, row


class RedisAway:
    """A store whose output writes fail, as while Redis is unreachable; reads go through."""

    def __init__(self, store: object) -> None:
        self.store, self.away = store, True

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def append_output(self, *args: object, **kwargs: object) -> str:
        if self.away:
            raise RedisUnavailable("Redis is away (test)")
        return self.store.append_output(*args, **kwargs)  # type: ignore[attr-defined,no-any-return]


def test_output_written_while_redis_is_away_is_shipped_when_it_is_back(
        client: blueque.Client, tmp_path: Path) -> None:
    settings = TaskLogSettings(tmp_path / "logs", keep=3600)
    path = settings.path("work", "t1", 1)
    path.parent.mkdir(parents=True)
    store = RedisAway(client.store)
    shipper = Shipper(store, settings, "t1", 1, path, None)  # type: ignore[arg-type]
    with open(path, "a") as handle:
        handle.write("printed while Redis was away\n")
    shipper.ship()  # fails: Redis is away
    store.away = False
    with open(path, "a") as handle:
        handle.write("printed after\n")
    shipper.ship(end=True)
    output = read_output(client.store, "t1")
    assert output is not None and output.ended
    assert output.text == "printed while Redis was away\nprinted after\n"


def test_output_is_cut_between_characters_never_inside_one(client: blueque.Client,
                                                          tmp_path: Path) -> None:
    """Shipments, their 16 KiB entries and the 64 KiB tail begin and end on UTF-8 character
    boundaries: a byte count used to cut a 3-byte character, and `blueque logs` showed U+FFFD
    in the middle of a task's output (found printing Japanese text from a real listener)."""
    settings = TaskLogSettings(tmp_path / "logs", keep=3600)
    path = settings.path("work", "t1", 1)
    path.parent.mkdir(parents=True)
    shipper = Shipper(client.store, settings, "t1", 1, path, None)
    text = "日本語のテキスト ✓\n" * 3000  # 3-byte characters: 16 KiB is not a multiple of 3
    kanji = "漢".encode()
    with open(path, "ab") as handle:
        handle.write(text.encode())
        handle.write(kanji[:2])  # a fully buffered writer (C stdio) flushes mid-character
    shipper.ship()
    with open(path, "ab") as handle:
        handle.write(kanji[2:] + b" done\n")
    shipper.ship(end=True)
    output = read_output(client.store, "t1")
    assert output is not None and output.ended
    assert "\ufffd" not in output.text
    assert (text + "漢 done\n").endswith(output.text)  # the tail: whole characters from its head
    assert len(output.text.encode()) > TAIL_BYTES // 2


def test_the_file_cap_holds_while_redis_is_away(client: blueque.Client,
                                                tmp_path: Path) -> None:
    settings = TaskLogSettings(tmp_path / "logs", max_bytes=4096, keep=3600)
    path = settings.path("work", "t1", 1)
    path.parent.mkdir(parents=True)
    shipper = Shipper(RedisAway(client.store), settings, "t1", 1, path,  # type: ignore[arg-type]
                      None)
    with open(path, "a") as handle:
        handle.write("x" * 10_000 + "\n")
    shipper.ship()  # fails: Redis is away
    assert path.stat().st_size <= settings.max_bytes


def test_a_file_that_cannot_be_cut_still_ships_and_never_raises(client: blueque.Client,
                                                                 tmp_path: Path) -> None:
    """Cutting the file past its cap can fail (a full disk; here its .1 is a directory): the
    error escaped ship(), which in the listener ended the daemon. Now the output ships, the
    file stays whole, and the next shipment tries again."""
    settings = TaskLogSettings(tmp_path / "logs", max_bytes=4096, keep=3600)
    path = settings.path("work", "t1", 1)
    path.with_name(path.name + ".1").mkdir(parents=True)
    path.write_text("x" * 5000 + "\n")
    Shipper(client.store, settings, "t1", 1, path, None).ship(end=True)
    output = read_output(client.store, "t1")
    assert output is not None and output.ended and output.text == "x" * 5000 + "\n"
    assert path.stat().st_size == 5001


def test_an_ended_attempts_output_moves_to_the_tails_and_its_stream_goes(
        client: blueque.Client, tmp_path: Path) -> None:
    """Issue 29: a stream of one entry cost Redis 4.7 KB (its listpack node and radix tree)
    for the whole log retention. An ended attempt's tail is one string of the task's (5.19):
    an attempt that ended before its first shipment never has a stream, one that shipped
    while it ran has its entries moved there, and the stream goes with its last entry."""
    r, keys = client.redis, Keys()
    settings = TaskLogSettings(tmp_path / "logs", keep=3600)
    first = settings.path("work", "t1", 1)
    first.parent.mkdir(parents=True)
    first.write_text("x" * 99 + "\n")
    Shipper(client.store, settings, "t1", 1, first, None).ship(end=True)
    assert not r.exists(keys.task_log("t1"))
    assert json.loads(r.get(keys.task_output("t1"))) == {"1": [100, "x" * 99 + "\n"]}
    assert 3590_000 < r.pttl(keys.task_output("t1")) <= 3600_000  # the log retention
    assert r.memory_usage(keys.task_output("t1")) < 512
    second = settings.path("work", "t1", 2)
    second.write_text("running\n")
    shipper = Shipper(client.store, settings, "t1", 2, second, None)
    shipper.ship()
    client.store.append_output("t1", "3", "a zombie's line\n", 16)  # not attempt 2's: stays
    with open(second, "a") as handle:
        handle.write("done\n")
    shipper.ship(end=True)
    assert [fields["attempt"] for _, fields in r.xrange(keys.task_log("t1"))] == ["3"]
    outputs, newest = read_outputs(client.store, "t1")
    assert {attempt: (o.text, o.ended) for attempt, o in outputs.items()} == {
        "1": ("x" * 99 + "\n", True), "2": ("running\ndone\n", True),
        "3": ("a zombie's line\n", False)}
    assert newest == "3"
    assert client.store.end_output("t1", "2", "", 13, 1000, TAIL_BYTES) == 0  # a repeat
    assert json.loads(r.get(keys.task_output("t1")))["2"] == [13, "running\ndone\n"]
    client.store.end_output("t1", "3", "", 16, 1000, TAIL_BYTES)
    assert not r.exists(keys.task_log("t1"))  # its last entry moved: the stream is gone


def test_follow_prints_what_an_ended_tail_holds_past_what_it_printed(
        client: blueque.Client) -> None:
    """The attempt ended between two looks: its last entries and the rest of its file are
    in its tail, not in the stream any more; the follower prints them once, and stops."""
    store = client.store
    store.append_output("t1", "1", "a\n", 2)
    output = read_output(store, "t1")
    assert output is not None and not output.ended
    store.append_output("t1", "1", "b\n", 4)
    store.end_output("t1", "1", "c\n", 6, 60_000, TAIL_BYTES)
    followed = "".join(follow_output(store, "t1", output, lambda: False, poll=0.01))
    assert (output.text + followed, output.ended) == ("a\nb\nc\n", True)


def test_a_stream_written_before_issue_29_reads_as_it_did(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, blueque_main) -> None:
    """Tasks whose attempts ended under an earlier Blueque keep their stream, each attempt
    closed by an end mark, until it expires: logs, --json, --follow and the dashboard's task
    page read it as they did."""
    task_id = client.get_queue("work").enqueue("{}")
    stream = Keys().task_log(task_id)
    for attempt, line in (("1", "old line\n"), ("2", "second\n")):
        client.redis.xadd(stream, {"attempt": attempt, "data": line, "offset": "9"})
        client.redis.xadd(stream, {"attempt": attempt, "data": "", "offset": "9", "end": "1"})
    done = blueque_main("--json", "logs", task_id, "--url", redis_url)
    assert json.loads(done.stdout) == {"id": task_id, "attempt": 2, "text": "second\n",
                                       "ended": True}
    followed = blueque_main("logs", task_id, "--attempt", "1", "--follow", "--url", redis_url)
    assert (followed.returncode, followed.stdout) == (0, "old line\n")  # ended: it returns
    page = task_page(client.store, task_id, time.time(), "1")
    assert page is not None
    assert (page["output"], page["output_ended"], page["output_attempts"]) == (
        "old line\n", True, ["1", "2"])


def test_a_noisy_task_module_keeps_the_listeners_json_log_json(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging) -> None:
    daemon = start_logging("tests.noisy_jobs:work", "--log-format", "json")
    task_id = client.get_queue("work").enqueue("{}")
    assert client.get_task(task_id).wait(20).status == "complete"
    wait_until(lambda: "complete in" in daemon.log(), what="the ending logged")
    events = [json.loads(line) for line in daemon.log().splitlines() if line.strip()]
    assert any("a library warning at import" in str(e["message"]) for e in events)


def test_a_quiet_running_attempt_keeps_its_file(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging, logs_dir: Path, tmp_path: Path) -> None:
    start_logging("tests.output_jobs:pauses", "--log-keep", "1")
    go, release = tmp_path / "go", tmp_path / "release"
    task_id = client.get_queue("work").enqueue(json.dumps({"go": str(go),
                                                           "release": str(release)}))
    path = logs_dir / "work" / f"{task_id}.1.log"
    wait_until(lambda: path.exists() and "before" in path.read_text(), what="first line")
    old = time.time() - 5
    os.utime(path, (old, old))  # quiet for 5 s, past --log-keep
    deadline = time.monotonic() + 3  # a few of the listener's sweeps (every 0.5 s)
    wait_until(lambda: not path.exists() or time.monotonic() > deadline, what="sweeps")
    go.touch()

    def shipped() -> bool:
        output = read_output(client.store, task_id)
        return output is not None and "after the quiet spell" in output.text

    deadline = time.monotonic() + 3
    wait_until(lambda: shipped() or time.monotonic() > deadline, what="the later output")
    release.touch()
    client.get_task(task_id).wait(20)
    assert path.exists() or path.with_name(path.name + ".1").exists()
    assert shipped()


def test_the_output_tail_expires_with_the_task(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_client, start_logging, tmp_path: Path) -> None:
    """While the attempt runs, the stream lives --log-keep; once it ends, its tail lives as
    long as the task (its result TTL), and the stream is gone: the tail never outlives its
    task, nor vanishes before it."""
    start_logging("tests.output_jobs:chatty_waits", "--log-keep", "1h")
    release = tmp_path / "release"
    task_id = client.get_queue("work").enqueue(json.dumps({"release": str(release)}),
                                               result_ttl=600)
    stream = Keys().task_log(task_id)
    wait_until(lambda: redis_client.exists(stream), what="the first shipment")
    assert 3000 * 1000 < redis_client.pttl(stream) <= 3600 * 1000
    release.touch()
    assert client.get_task(task_id).wait(20).status == "complete"
    output = read_output(client.store, task_id)
    assert output is not None and output.ended and "waiting" in output.text
    tails = Keys().task_output(task_id)
    assert not redis_client.exists(stream)
    assert 500 * 1000 < redis_client.pttl(tails) <= 600 * 1000
    assert abs(redis_client.pttl(tails) - redis_client.pttl(Keys().task(task_id))) < 5000


def test_a_task_id_too_long_for_a_file_name_neither_stops_the_listener_nor_loses_output(  # type: ignore[no-untyped-def]
        client: blueque.Client, redis_url: str, start_logging, logs_dir: Path) -> None:
    """A caller's task id may be longer than a file name may be (255 bytes on most file
    systems): the attempt's file gets a shortened name that is still the task's own, and the
    listener goes on (it died of ENAMETOOLONG shipping the rest after the first such task)."""
    daemon = start_logging("tests.output_jobs:chatty")
    queue = client.get_queue("work")
    long_ids = ["x" * 300, "é" * 200, "x" * 299 + "y"]  # the last two: 400 bytes; a twin
    for task_id in long_ids:
        queue.enqueue("{}", task_id=task_id, max_attempts=2, retry_backoff=0.01)
    for task_id in long_ids:
        task = client.get_task(task_id).wait(30)
        assert (task.status, task.attempts) == ("complete", 2), daemon.log()
        shown = blueque_cli(redis_url, "logs", task_id, "--attempt", "1")
        assert shown.returncode == 0 and "hello from attempt 1" in shown.stdout, shown.stderr
    assert daemon.alive(), daemon.log()
    names = sorted(path.name for path in (logs_dir / "work").iterdir())
    assert len(names) == 6 and all(len(name.encode()) <= 255 for name in names), names
    assert client.get_task(queue.enqueue("{}")).wait(30).status == "failed"  # still serving


@pytest.mark.parametrize("queue", [".", ".."])
def test_task_log_paths_stay_inside_the_log_directory(tmp_path: Path, queue: str) -> None:
    settings = TaskLogSettings(tmp_path / "logs")
    for task_id in (".", "..", "a/../../b", "x" * 1000):
        path = settings.path(queue, task_id, 1)
        assert path.parent.parent == settings.directory, path
        assert len(path.name.encode()) <= 255 and path.parent.name not in (".", "..")


def test_a_log_file_that_cannot_be_read_or_capped_is_not_an_error(client: blueque.Client,
                                                                   tmp_path: Path) -> None:
    """The listener ships a reported attempt's rest; a file it cannot stat, read or cap (here
    its directory is a file; a full disk or a removed mount alike) costs that output only,
    never the listener (every OSError from there ended the daemon)."""
    settings = TaskLogSettings(tmp_path / "logs", max_bytes=10)
    settings.directory.parent.mkdir(parents=True, exist_ok=True)
    settings.directory.write_text("not a directory")
    path = settings.path("work", "t1", 1)
    Shipper(client.store, settings, "t1", 1, path, None).ship(end=True)
    assert read_output(client.store, "t1") is None


def test_a_listener_keeps_no_descriptor_of_its_ended_runs(  # type: ignore[no-untyped-def]
        client: blueque.Client, start_logging) -> None:
    """Each run's output pipe is the listener's to read until the run ends, then closed: a
    read end kept per run made a listener die at its 1,020th task (select() refuses higher
    descriptor numbers) in a 10,000-task fan-in."""
    daemon = start_logging("tests.jobs:text")
    queue = client.get_queue("work")
    first = queue.enqueue("warm up")  # what the listener opens once (connections, log file)
    assert client.get_task(first).wait(30).status == "complete"
    before = len(os.listdir(f"/proc/{daemon.pid}/fd"))
    ids = [queue.enqueue(f"task {n}") for n in range(60)]
    for task_id in ids:
        assert client.get_task(task_id).wait(60).status == "complete"
    wait_until(lambda: len(os.listdir(f"/proc/{daemon.pid}/fd")) <= before + 3, timeout=10,
               what=f"the listener back to about {before} descriptors after 60 runs")
