"""What the `blueque` command prints, as a script or a pipeline reads it (issue 21 §4, §5,
§8, §9): every printing command ends quietly when its reader goes away (`| head`); --json
values are typed (numbers, booleans, null, times as Unix seconds); `logs` of a task that
printed nothing and `enqueue --wait` say what a user expects; `status` shows each listener's
busy slots and `--watch` redraws it until Ctrl-C.

The fleet: a real `blueque listen` daemon on the private redis-server, running tests.jobs:acts
over tasks that complete, complete after a retry, fail, print nothing, save a checkpoint, and
one that holds a slot until the test ends."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

import blueque
from blueque.cli import EXIT_CLOSED_PIPE
from blueque.cli.status import CLEAR_SCREEN, _renewal_text
from blueque.fields import CORRUPT, LISTENER_FIELDS, TASK_FIELDS
from blueque.keys import Keys
from blueque.testing import RedisServer
from tests.conftest import Done, Run
from tests.daemons import Daemon, between, daemons, listen_command, wait_until
from tests.test_cli import ROOT, cli, command, environment

KEYS = Keys()
QUEUE = "documents"  # the operating page's, so that its jq lines run as written
OPERATING = ROOT / "docs" / "how-to" / "operating.md"


@dataclass(frozen=True)
class Fleet:
    done: str  # complete: printed "hello", saved a checkpoint, returned {"words": 1234}
    retried: str  # complete at attempt 2 (attempt 1 failed)
    failed: str  # failed for good, with a traceback
    quiet: str  # complete, printed nothing
    running: str  # started, progress 0.5, holding one of the listener's 2 slots
    scheduled: str  # in an hour
    pending: str  # in the queue "later", which no listener serves
    cancelled: str  # of "later", cancelled before it ran
    listener: Daemon


@pytest.fixture
def fleet(redis_url: str, redis_client: redis.Redis, client: blueque.Client,
          tmp_path: Path) -> Iterator[Fleet]:
    release = tmp_path / "release"
    with daemons(tmp_path) as started:
        listener = Daemon(listen_command(redis_url, QUEUE, "tests.jobs:acts", "--concurrency",
                                         "2", "--interval", "0.5", "--poll", "0.1"),
                          tmp_path / "listen.log")
        started.append(listener)
        queue = client.get_queue(QUEUE)
        done = queue.enqueue(json.dumps({"print": "hello", "checkpoint": '{"next": 3}',
                                         "value": {"words": 1234}}))
        retried = queue.enqueue(json.dumps({"print": "trying", "fail": "flaky",
                                            "fail_until": 2}), max_attempts=2,
                                retry_backoff=0.1)
        failed = queue.enqueue(json.dumps({"fail": "bad input"}))
        quiet = queue.enqueue(json.dumps({"value": "quiet"}))
        for task_id in (done, retried, failed, quiet):
            client.get_task(task_id).wait(30)
        running = queue.enqueue(json.dumps({"release": str(release),
                                            "progress": [0.5, "half way"]}))
        scheduled = queue.schedule("{}", time.time() + 3600, task_id="in-an-hour")
        later = client.get_queue("later")
        pending = later.enqueue("{}")
        cancelled = later.enqueue("{}")
        assert client.cancel_task(cancelled, "not wanted") == "cancelled"

        def holding() -> bool:
            infos = [item.info for item in client.listeners([QUEUE])]
            return (client.get_task(running).progress == 0.5
                    and [info.get("busy") for info in infos] == ["1"])

        wait_until(holding, what="the running task to hold a slot")
        yield Fleet(done, retried, failed, quiet, running, scheduled, pending, cancelled,
                    listener)
        release.touch()


def strict_json(text: str) -> Any:
    """JSON as the spec has it: NaN and Infinity are not JSON (jq refuses them)."""
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def assert_typed(record: dict[str, Any], kinds: dict[str, str] = TASK_FIELDS) -> None:
    """Text fields are strings; numbers and times are numbers (or null), never strings."""
    for name, value in record.items():
        if name in ("id", CORRUPT, "checkpoint", "info"):
            continue
        if kinds.get(name, "text") == "text":
            assert isinstance(value, str), (name, value)
        elif kinds[name] == "int":
            assert value is None or type(value) is int, (name, value)
        elif kinds[name] == "json" and name == "task_memory":  # bytes by pid
            assert all(type(size) is int for size in value.values()), (name, value)
        elif kinds[name] == "json":  # the history: a list of objects with typed values
            assert value is None or isinstance(value, list), (name, value)
            for entry in value or []:
                assert all(type(entry[key]) in (int, float) for key in ("attempt", "at")
                           if key in entry), (name, entry)
        else:
            assert value is None or type(value) in (int, float), (name, value)


# --- --json: typed values (§5) ----------------------------------------------------------------
@pytest.mark.slow
def test_every_json_output_has_typed_values(fleet: Fleet, run: Run, redis_url: str,
                                            run_json: Callable[..., Any],
                                            redis_client: redis.Redis) -> None:
    """`"attempts": "1"`, `"result_ttl": "604800.0"`: jq compared strings with numbers (a
    string is greater than any number) and `select(.attempts > 1)` kept every task."""
    now = time.time()
    tasks = {t["id"]: t for t in run_json("tasks", QUEUE, "--limit", "100")}
    assert set(tasks) == {fleet.done, fleet.retried, fleet.failed, fleet.quiet, fleet.running,
                          fleet.scheduled}
    for record in tasks.values():
        assert_typed(record)
    retried = tasks[fleet.retried]
    assert (retried["attempts"], retried["max_attempts"], retried["retry_backoff"]) == (2, 2, 0.1)
    assert type(retried["pid"]) is int and now - 120 < retried["created"] <= now
    assert retried["created"] <= retried["started_at"] <= retried["finished_at"] <= now
    assert tasks[fleet.done]["result"] == '{"words": 1234}'  # text as it is: jq's fromjson
    assert tasks[fleet.running]["progress"] == 0.5
    assert type(tasks[fleet.running]["pid_created"]) is float
    assert tasks[fleet.scheduled]["eta"] > now + 3000
    assert tasks[fleet.failed]["status"] == "failed" and "bad input" in tasks[
        fleet.failed]["traceback"]

    shown = run_json("show", fleet.done)
    assert_typed(shown)
    assert (shown["attempts"], shown["status"]) == (1, "complete")
    checkpoint = shown["checkpoint"]
    assert (checkpoint["size"], checkpoint["attempt"]) == (len('{"next": 3}'), 1)
    assert between(now - 120, checkpoint["saved_at"], time.time())
    state = run_json("show", fleet.done, "--checkpoint")
    assert (state["state"], state["size"]) == ('{"next": 3}', 11)

    for record in run_json("wait", fleet.done, fleet.retried)["tasks"]:
        assert_typed(record)
        assert type(record["attempts"]) is int and type(record["finished_at"]) is float

    status = run_json("status")
    assert type(status["time"]) is float
    counts = {queue["name"]: queue for queue in status["queues"]}
    assert (counts[QUEUE]["complete"], counts[QUEUE]["started"]) == (3, 1)
    (listener,) = status["listeners"]
    assert_typed(listener["info"], LISTENER_FIELDS)
    info = listener["info"]
    assert (info["busy"], info["concurrency"], info["interval"]) == (1, 2, 0.5)
    assert info["pid"] == fleet.listener.pid and type(info["renewed"]) is float
    assert type(listener["lease_remaining"]) is float

    config = run_json("configure", QUEUE, "--max-attempts", "3", "--time-limit", "2h",
                      "--result-ttl", "7d")["config"]
    assert config == {"max_attempts": 3, "time_limit": 7200.0, "result_ttl": 604800.0}
    logs = run_json("logs", fleet.retried, "--attempt", "1")
    assert (logs["attempt"], logs["ended"]) == (1, True)
    assert logs["text"].startswith("trying\n") and "RuntimeError: flaky" in logs["text"]
    assert run_json("purge", QUEUE, "--older-than", "7d")["deleted"] == {
        "complete": 0, "failed": 0, "cancelled": 0}
    assert type(run_json("preempt", "--node", "nowhere", "--grace", "1h")["deadline"]) is float
    assert run_json("preempt", "--node", "nowhere", "--withdraw")["withdrawn"] is True
    enqueued = run_json("enqueue", "later", "{}", "--task-id", "mine")
    assert enqueued == {"task_id": "mine", "queue": "later", "created": True}
    waited_for = run_json("enqueue", QUEUE, '{"value": 7}', "--wait", "--timeout", "30")
    (record,) = waited_for["tasks"]
    assert_typed(record)
    assert (record["result"], record["attempts"], waited_for["created"]) == ("7", 1, True)
    scheduler = cli(redis_url, "scheduler", "--once", "--json")
    assert scheduler.returncode == 0, scheduler.stderr
    assert strict_json(scheduler.stdout)["errors"] == []

    # a value that is not of its field's type: null, and its text under "corrupt"
    redis_client.hset(KEYS.task(fleet.quiet), mapping={"attempts": "many", "eta": "inf",
                                                       "max_attempts": "2.5"})
    corrupt = strict_json(run("show", fleet.quiet, "--json").stdout)
    assert (corrupt["attempts"], corrupt["eta"], corrupt["max_attempts"]) == (None, None, None)
    assert corrupt[CORRUPT] == {"attempts": "many", "eta": "inf", "max_attempts": "2.5"}


def readme_jq_lines() -> list[str]:
    """The operating page's `blueque ... --json ... | jq ...` command lines, as written."""
    return [line.split("   #")[0].strip() for line in OPERATING.read_text("utf-8").splitlines()
            if line.startswith("blueque ") and "| jq " in line]


@pytest.mark.slow
def test_the_readmes_jq_examples_count_right(fleet: Fleet, redis_url: str) -> None:
    """The issue's count: `jq 'select(.attempts > 1)'` kept every task (strings are greater
    than numbers in jq). Of the three complete tasks, one needed a second attempt."""
    assert shutil.which("jq"), "jq is missing: ./dev installs it"
    lines = readme_jq_lines()
    assert len(lines) == 2, lines
    env = {**environment(), "BLUEQUE_URL": redis_url,
           "PATH": f"{ROOT / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    retried = subprocess.run(["bash", "-o", "pipefail", "-c", lines[0]], capture_output=True,
                             text=True, env=env, cwd=ROOT, timeout=60)
    assert (retried.returncode, retried.stderr, retried.stdout) == (0, "", "1\n")
    failures = subprocess.run(["bash", "-o", "pipefail", "-c", lines[1]], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=60)
    assert failures.returncode == 0, failures.stderr
    (line,) = failures.stdout.splitlines()
    assert re.fullmatch(rf"{fleet.failed} \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ", line), line


# --- a closed pipe (§4) -----------------------------------------------------------------------
def closed_pipe_run(redis_url: str, *arguments: str, timeout: float = 60
                    ) -> subprocess.CompletedProcess[str]:
    """The command as a process whose stdout is a pipe nobody reads any more (its reader,
    `head`, has exited): every write to it fails with EPIPE."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(command(redis_url, *arguments), stdout=writer,
                              stderr=subprocess.PIPE, text=True, env=environment(), cwd=ROOT,
                              timeout=timeout)
    finally:
        os.close(writer)


@pytest.mark.slow
def test_a_closed_pipe_ends_every_printing_command_quietly(fleet: Fleet, redis_url: str,
                                                            client: blueque.Client) -> None:
    """`blueque tasks ... | head` printed a BrokenPipeError traceback and exited 1. Every
    command that prints ends quietly instead, with 141 (128 + SIGPIPE), what a shell reports
    for `seq 1 100000 | head`; so do --help and --version, and `status --watch`, which would
    otherwise print for ever."""
    client.get_queue("later").enqueue_many(["{}"] * 3000)  # more than a pipe's buffer
    client.get_queue("spare").configure(max_attempts=1)  # an empty queue to forget
    commands = [
        ("status",), ("status", "--json"), ("status", "--watch", "0.1"),
        ("status", "--watch", "0.1", "--json"),
        ("tasks", "later", "--limit", "5000"), ("tasks", QUEUE, "--json"),
        ("show", fleet.done), ("show", fleet.done, "--json"),
        ("show", fleet.done, "--checkpoint"), ("logs", fleet.done), ("logs", fleet.done, "--json"),
        ("logs", fleet.done, "--follow"), ("logs", fleet.quiet, "--json"),
        ("wait", fleet.done), ("wait", fleet.done, "--json"),
        ("enqueue", "later", "{}"), ("enqueue", "later", "{}", "--json"),
        ("enqueue", QUEUE, '{"value": "waited"}', "--wait", "--timeout", "60"),
        ("cancel", fleet.pending), ("retry", fleet.cancelled, "--json"),
        ("purge", QUEUE, "--older-than", "7d"), ("configure", QUEUE),
        ("configure", QUEUE, "--max-attempts", "2", "--json"), ("forget-queue", "spare"),
        ("preempt", "--node", "nowhere", "--grace", "1h"), ("preempt", "--node", "nowhere",
                                                            "--withdraw", "--json"),
        ("scheduler", "--once"), ("scheduler", "--once", "--json"),
        ("--help",), ("tasks", "--help"), ("--version",),
    ]
    loud = {}
    for arguments in commands:
        done = closed_pipe_run(redis_url, *arguments)
        if (done.returncode, done.stderr) != (EXIT_CLOSED_PIPE, ""):
            loud[" ".join(arguments)] = (done.returncode, done.stderr[-300:])
    assert loud == {}, json.dumps(loud, indent=1)
    # what the commands did, they did: the last enqueue waited for its task
    assert client.get_task(fleet.pending).status == "failed"  # cancelled
    assert "spare" not in client.queue_names()

    # and through a shell, as the issue has it (pipefail: the command's own status)
    env = {**environment(), "BLUEQUE_URL": redis_url}
    for line in (f"{sys.executable} -m blueque.cli tasks later --limit 5000 | head -1",
                 f"{sys.executable} -m blueque.cli --json tasks later --limit 5000 | head -1",
                 f"{sys.executable} -m blueque.cli status --watch 0.1 | head -3"):
        done = subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=60)
        assert (done.returncode, done.stderr) == (EXIT_CLOSED_PIPE, ""), line
        assert done.stdout


# --- logs, enqueue --wait (§8) ----------------------------------------------------------------
@pytest.mark.slow
def test_logs_of_a_task_without_output_is_no_failure(fleet: Fleet, run: Run,
                                                     run_json: Callable[..., Any]) -> None:
    """`blueque logs` exited 1 for a task that printed nothing: it says so, and exits 0."""
    quiet = run("logs", fleet.quiet)
    assert (quiet.returncode, quiet.stdout) == (0, "")
    assert "attempt 1 of task" in quiet.stderr and "printed nothing" in quiet.stderr
    assert run_json("logs", fleet.quiet) == {"id": fleet.quiet, "attempt": 1, "text": "",
                                             "ended": True}
    pending = run("logs", fleet.pending)
    assert pending.returncode == 0 and "has not run yet" in pending.stderr
    assert run_json("logs", fleet.pending)["ended"] is False
    cancelled = run("logs", fleet.cancelled)
    assert cancelled.returncode == 0 and "cancelled before it ran" in cancelled.stderr
    beyond = run("logs", fleet.quiet, "--attempt", "2")
    assert beyond.returncode == 1 and "there is no attempt 2" in beyond.stderr
    assert run("logs", "no-such-task").returncode == 4
    assert run("logs", fleet.done).stdout == "hello\n"


@pytest.mark.slow
def test_enqueue_wait_prints_the_result(fleet: Fleet, run: Run) -> None:
    """It printed the table of `blueque wait`; a user expects the result (the table stays
    `blueque wait ID`'s, the record `--json`'s)."""
    done = run("enqueue", QUEUE, json.dumps({"value": {"words": 99}}), "--wait",
               "--timeout", "60")
    assert (done.returncode, done.stdout) == (0, '{"words": 99}\n'), done.stderr
    failed = run("enqueue", QUEUE, json.dumps({"fail": "no such page"}), "--wait",
                 "--timeout", "60")
    assert (failed.returncode, failed.stdout) == (1, "")
    assert "failed: no such page" in failed.stderr
    timed_out = run("enqueue", "later", "{}", "--wait", "--timeout", "0.2")
    assert timed_out.returncode == 1 and "is still pending" in timed_out.stderr
    table = run("wait", fleet.done)
    assert "complete" in table.stdout and '{"words": 1234}' in table.stdout


# --- status: slots, --watch (§9) --------------------------------------------------------------
@pytest.mark.slow
def test_status_shows_each_listeners_busy_slots(fleet: Fleet, run: Run) -> None:
    shown = run("status").stdout
    header = next(line for line in shown.splitlines() if line.startswith("LISTENER"))
    assert header.split() == ["LISTENER", "QUEUE", "HOST", "PID", "SLOTS", "LEASE", "RENEWED",
                              "RENEWAL", "MEMORY", "STATE"]
    row = next(line for line in shown.splitlines() if f" {fleet.listener.pid} " in line)
    assert row.split()[4] == "1/2"
    # how long its latest renewal took (one round trip, PROTOCOL.md 6 step 2), once measured
    assert re.search(r" (-|\d+ms|[\d.]+s)( SLOW \(--interval [\d.]+ would hold\))? ", row)


def test_status_says_when_renewals_are_slow_for_the_interval() -> None:
    """A renewal whose round trip took more than a tenth of the interval is on a SLOW link,
    and the column names an --interval that would hold (issue 19 item 4, issue 30 item 3)."""
    assert _renewal_text({"renewal_seconds": "0.004", "interval": "2"}) == "4ms"
    assert _renewal_text({"renewal_seconds": "0.2", "interval": "2"}) == "200ms"
    assert _renewal_text({"renewal_seconds": "0.31", "interval": "2"}) == (
        "310ms SLOW (--interval 3.5 would hold)")
    assert _renewal_text({"interval": "2"}) == "-"  # a listener older than the field


def read_until(stream: Any, wanted: Callable[[str], bool], timeout: float = 30) -> str:
    """Lines of a process's text stdout until ``wanted(seen)``, with a deadline."""
    seen = ""
    deadline = time.monotonic() + timeout
    while not wanted(seen):
        assert time.monotonic() < deadline, f"not shown in time; got {seen!r}"
        ready, _, _ = select.select([stream], [], [], 0.5)
        if ready:
            line = stream.readline()
            assert line, f"the command ended; it printed {seen!r}"
            seen += line
    return seen


def watch(redis_url: str, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(command(redis_url, "status", "--watch", "0.2", *options),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environment(), cwd=ROOT)


def interrupted(process: subprocess.Popen[str]) -> Done:
    """Ctrl-C, and what the process did then."""
    process.send_signal(signal.SIGINT)
    try:
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return Done(process.returncode, out, err)


def test_status_watch_prints_snapshots_until_ctrl_c(redis_url: str,
                                                    client: blueque.Client) -> None:
    """Not a terminal: one snapshot after the other, each under its time; Ctrl-C ends it with
    0 and nothing on stderr (no "interrupted", no traceback)."""
    client.get_queue("jobs").enqueue("{}")
    process = watch(redis_url)
    heading = re.compile(r"^blueque status every 200ms: \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$",
                         re.MULTILINE)
    seen = read_until(process.stdout, lambda text: len(heading.findall(text)) >= 3)
    client.get_queue("jobs").enqueue("{}")
    seen += read_until(process.stdout, lambda text: re.search(r"^jobs +2 ", text, re.M)
                       is not None)
    done = interrupted(process)
    assert (done.returncode, done.stderr) == (0, "")
    assert CLEAR_SCREEN not in seen
    assert re.search(r"^jobs +1 ", seen, re.MULTILINE)  # the first snapshots, then the new one

    process = watch(redis_url, "--json")
    seen = read_until(process.stdout, lambda text: text.count("\n") >= 3)
    done = interrupted(process)
    assert (done.returncode, done.stderr) == (0, "")
    snapshots = [strict_json(line) for line in (seen + done.stdout).splitlines()]
    assert len(snapshots) >= 3 and all(s["queues"][0]["pending"] == 2 for s in snapshots)
    times = [s["time"] for s in snapshots]
    assert times == sorted(times) and times[-1] - times[0] >= 0.2


def test_status_watch_redraws_a_terminal(redis_url: str, client: blueque.Client) -> None:
    client.get_queue("jobs").enqueue("{}")
    master, slave = pty.openpty()
    process = subprocess.Popen(command(redis_url, "status", "--watch", "0.2"), stdout=slave,
                               stderr=subprocess.PIPE, text=True, env=environment(), cwd=ROOT)
    os.close(slave)
    seen = ""
    try:
        deadline = time.monotonic() + 30
        while seen.count(CLEAR_SCREEN) < 2:
            assert time.monotonic() < deadline, seen
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                seen += os.read(master, 65536).decode(errors="replace")
        done = interrupted(process)
    finally:
        os.close(master)
    assert (done.returncode, done.stderr) == (0, "")
    first = seen.split(CLEAR_SCREEN)[1]
    assert first.startswith("blueque status every 200ms: ") and "jobs" in first


def test_status_watch_rides_out_a_redis_outage(tmp_path: Path) -> None:
    """A watch is for watching an incident: Redis going away is shown in the snapshots, and
    the watch shows the queues again once it is back."""
    with RedisServer(directory=str(tmp_path)) as server:
        blueque.Client(server.url).get_queue("jobs").enqueue("{}")
        process = watch(server.url)
        try:
            read_until(process.stdout, lambda text: "jobs" in text)
            server.kill()
            read_until(process.stdout, lambda text: "blueque: error: " in text)
            server.start()
            read_until(process.stdout, lambda text: "no queues" in text)  # empty: no --save
            assert process.poll() is None
        finally:
            done = interrupted(process)
    assert (done.returncode, done.stderr) == (0, "")
