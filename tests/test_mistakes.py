"""Operator and programmer mistakes get a clear error and an exit code, never silent damage or
a traceback (issue 9 §4), against real servers. The daemons (listen, scheduler, dashboard) run
as real processes; the other commands run in-process through blueque.cli.main(argv), where a
traceback would fail the test as an exception."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import blueque
from blueque.keys import Keys
from blueque.store import load_script
from blueque.testing import RedisServer, free_port
from tests.conftest import Done, Run
from tests.daemons import FAST, Daemon, kill_session_children, listen_command, wait_until
from tests.fake_servers import FakeServer, old_redis
from tests.test_cli import ROOT, cli, environment

KEYS = Keys()


def refused(done: Done | subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """The command exited with ``code`` and one `blueque: error:` line, no traceback."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("blueque: error: "), done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


# --- intervals --------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["0", "-1", "nan"])
@pytest.mark.parametrize("daemon", ["listen", "scheduler"])
def test_zero_or_negative_interval_is_a_usage_error(blueque_main: Run, redis_url: str,
                                                      redis_client: redis.Redis,
                                                      daemon: str, value: str) -> None:
    """Refused by the parser, before the daemon starts: run in-process."""
    arguments = ["listen", "work", "tests.jobs:echo"] if daemon == "listen" else ["scheduler"]
    done = blueque_main(*arguments, f"--interval={value}", "--url", redis_url)
    assert done.returncode == 2, done.stderr
    assert "must be a number of seconds above 0" in done.stderr
    assert redis_client.zcard(KEYS.queues()) == 0  # it never registered


def test_interval_is_checked_by_the_library_too(client: blueque.Client) -> None:
    from blueque.daemon.options import ListenerOptions
    from blueque.scheduler import Scheduler

    with pytest.raises(blueque.ConfigurationError, match="more than 0"):
        ListenerOptions({"work": 1}, "tests.jobs:echo", interval=0)
    with pytest.raises(blueque.ConfigurationError, match="more than 0"):
        Scheduler(client, interval=-1)


@pytest.mark.parametrize(("options", "message"), [
    ({"queues": {}}, "at least one queue"),
    ({"concurrency": 0}, "concurrency must be at least 1"),
    ({"on_stop": "linger"}, "--on-stop must be one of"),
    ({"poll": 0.0}, "more than 0"),
    ({"preempt_grace": -1.0}, "grace must be 0 seconds or more"),
])
def test_listener_options_are_checked_once_made(options: dict[str, object],
                                                message: str) -> None:
    """ListenerOptions, the daemon's one front door, refuses what the CLI's parser refuses."""
    from blueque.daemon.options import ListenerOptions

    given: dict[str, Any] = {"queues": {"work": 1}, "function": "tests.jobs:echo", **options}
    with pytest.raises(blueque.ConfigurationError, match=message):
        ListenerOptions(**given)


# --- the task function ------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["tests.no_such_module:run", "tests.jobs:no_such_function",
                                  "no_colon_here"])
def test_listener_with_unimportable_function_exits_at_start(
        redis_url: str, redis_client: redis.Redis, spec: str) -> None:
    redis_client.lpush(KEYS.pending("work"), "waiting")  # would be taken and failed before
    done = cli(redis_url, "listen", "work", spec, *FAST)
    refused(done, 2, spec, "PYTHONPATH", "package.module:function")
    assert redis_client.exists(KEYS.listeners("work")) == 0
    assert redis_client.lrange(KEYS.pending("work"), 0, -1) == ["waiting"]


@pytest.mark.parametrize(("body", "said"), [
    ("import sys\nsys.exit('set JOBS_CONFIG first')\n", "set JOBS_CONFIG first"),
    ("import sys\nsys.exit(0)\n", "sys.exit(0)"),  # silently 0 before: systemd saw success
    ("import argparse\nargparse.ArgumentParser().parse_args(['--no-such'])\n", "sys.exit(2)"),
])
def test_a_task_module_exiting_at_import_is_a_usage_error(
        redis_url: str, redis_client: redis.Redis, tmp_path: Path, body: str,
        said: str) -> None:
    """A module that calls sys.exit() while it is imported (a missing setting, argparse at
    module level) cannot serve tasks: exit 2 and the import's own words, as for any module
    that fails to import, not the module's exit code (0 passed for a clean stop)."""
    (tmp_path / "exiting_jobs.py").write_text(body + "def run(task):\n    return 'ran'\n")
    done = subprocess.run(
        [sys.executable, "-m", "blueque.cli", "listen", "work", "exiting_jobs:run",
         "--url", redis_url, *FAST],
        capture_output=True, text=True, env=environment(), cwd=tmp_path, timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    # what the module printed first (argparse's usage) is logged; the error is the last line
    last = done.stderr.splitlines()[-1]
    assert last.startswith("blueque: error: cannot import module 'exiting_jobs'"), last
    assert said in last, last
    assert redis_client.exists(KEYS.listeners("work")) == 0


def test_listen_imports_task_functions_from_the_current_directory(
        redis_url: str, client: blueque.Client, tmp_path: Path, started: list[Daemon]) -> None:
    """As `python -m`, RQ and Celery do: run from the project directory, no PYTHONPATH."""
    project = tmp_path / "project"
    (project / "mypackage").mkdir(parents=True)
    (project / "mypackage" / "__init__.py").write_text("")
    (project / "mypackage" / "jobs.py").write_text(
        "def shout(task):\n    return task.parameters.upper()\n")
    # bin/blueque is a script, so Python puts bin/ (not the current directory) on the path,
    # as it does for the installed console script
    command = [sys.executable, str(ROOT / "bin" / "blueque"), "listen", "work",
               "mypackage.jobs:shout", "--url", redis_url, *FAST]
    daemon = Daemon(command, tmp_path / "listen.log", cwd=project)
    started.append(daemon)
    task = client.get_task(client.get_queue("work").enqueue("hello")).wait(20)
    assert (task.status, task.result) == ("complete", "HELLO"), daemon.log()


# --- URLs -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def password_server() -> Iterator[RedisServer]:
    with RedisServer() as server:  # its start-up check PINGs without a password
        redis.Redis(port=server.port).config_set("requirepass", "sekret")
        yield server


@pytest.fixture(scope="module")
def plain_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def bad_urls(password_server: RedisServer, plain_server: RedisServer,
             http: FakeServer) -> dict[str, tuple[str, str]]:
    """Each mistake -> (URL, words the error must contain)."""
    port = plain_server.port
    return {
        "database out of range": (f"redis://127.0.0.1:{port}/99", "database"),
        "unknown option": (f"redis://127.0.0.1:{port}/0?sockettimeout=3", "sockettimeout"),
        "not a Redis": (f"redis://127.0.0.1:{http.port}/0", "does not speak the Redis protocol"),
        "Sentinel URL at a plain Redis": (f"redis+sentinel://127.0.0.1:{port}/mymaster",
                                          "not a Redis Sentinel"),
        "Cluster URL at a plain Redis": (f"redis+cluster://127.0.0.1:{port}",
                                         "not a Redis Cluster node"),
        "empty": ("", "empty Redis URL"),
        "wrong password": (f"redis://:wrong@127.0.0.1:{password_server.port}/0",
                           "authentication failed"),
        "no password": (f"redis://127.0.0.1:{password_server.port}/0", "authentication failed"),
    }


def never_the_machines_redis() -> dict[str, str]:
    """The CLI's environment with $BLUEQUE_URL at a closed port: a command that wrongly falls
    back to the default URL fails there instead of touching the machine's Redis on 6379 (the
    in-process commands' blueque_main fixture does the same)."""
    return {**environment(), "BLUEQUE_URL": f"redis://127.0.0.1:{free_port()}/0"}


MISTAKES = ["database out of range", "unknown option", "not a Redis",
            "Sentinel URL at a plain Redis", "Cluster URL at a plain Redis", "empty",
            "wrong password", "no password"]


@pytest.mark.parametrize("mistake", MISTAKES)
def test_bad_url_is_a_clear_usage_error(blueque_main: Run, password_server: RedisServer,
                                        plain_server: RedisServer, mistake: str) -> None:
    with FakeServer() as http:
        url, words = bad_urls(password_server, plain_server, http)[mistake]
        done = blueque_main("status", "--url", url)
    refused(done, 2, words)
    assert "unreachable" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("daemon", ["listen", "scheduler"])
@pytest.mark.parametrize("mistake", MISTAKES)
def test_daemon_given_a_bad_url_exits_with_it(password_server: RedisServer,
                                              plain_server: RedisServer, daemon: str,
                                              mistake: str) -> None:
    """Not retried for ever: waiting cannot fix a wrong password or a wrong port."""
    with FakeServer() as http:
        url, words = bad_urls(password_server, plain_server, http)[mistake]
        arguments = ["listen", "work", "tests.jobs:echo"] if daemon == "listen" else [
            "scheduler"]
        done = subprocess.run(
            [sys.executable, "-m", "blueque.cli", *arguments, "--url", url, *FAST[:2]],
            capture_output=True, text=True, env=never_the_machines_redis(), cwd=ROOT,
            timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    assert "blueque: error: " in done.stderr and words in done.stderr, done.stderr


def usage_error(done: Done | subprocess.CompletedProcess[str], *words: str) -> None:
    """argparse's refusal: exit 2, the usage and one `blueque [command]: error:` line."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("usage: blueque"), done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("blueque") and ": error: " in last, last
    for word in words:
        assert word in last, last


LISTEN = ["listen", "work", "tests.jobs:echo"]


@pytest.mark.parametrize(("arguments", "words"), [
    ([*LISTEN, "--concurrency", "0"], ["--concurrency", "at least 1"]),
    ([*LISTEN, "--concurrency", "-2"], ["--concurrency", "at least 1"]),
    ([*LISTEN, "--metrics-port", "99999"], ["--metrics-port", "0 to 65535"]),
    ([*LISTEN, "--log-level", "VERBOSE"], ["--log-level", "DEBUG, INFO"]),
    (["scheduler", "--log-level", "nope"], ["--log-level", "DEBUG, INFO"]),
    (["dashboard", "--port", "99999"], ["--port", "0 to 65535"]),
    (["tasks", "work", "--limit", "0"], ["--limit", "at least 1"]),
    (["retry", "--failed", "work", "--limit", "-1"], ["--limit", "at least 1"]),
    (["logs", "some-task", "--attempt", "0"], ["--attempt", "at least 1"]),
])
def test_out_of_range_options_are_usage_errors(blueque_main: Run, redis_url: str,
                                               redis_client: redis.Redis,
                                               arguments: list[str], words: list[str]) -> None:
    """Caught by the parser, before anything runs (so in-process, daemons too): never a
    traceback (a port of 99999, an unknown log level) nor a silent surprise (a negative
    --limit slicing from the end)."""
    usage_error(blueque_main(*arguments, "--url", redis_url), *words)
    assert redis_client.dbsize() == 0  # nothing registered, enqueued or retried


@pytest.mark.parametrize(("queues", "words"), [
    ("work:0", "weight must be at least 1"), ("work:x", "bad queue weight"),
    (",", "no queue given"),
])
def test_bad_queue_weights_are_usage_errors(redis_url: str, redis_client: redis.Redis,
                                            queues: str, words: str) -> None:
    refused(cli(redis_url, "listen", queues, "tests.jobs:echo", *FAST), 2, words)
    assert redis_client.dbsize() == 0


def test_busy_ports_are_usage_errors(redis_server: RedisServer, redis_url: str) -> None:
    """Not uvicorn's own exit 3, which `blueque --help` says means "Redis unreachable"."""
    busy = str(redis_server.port)
    refused(cli(redis_url, "dashboard", "--port", busy), 2, "cannot serve the dashboard",
            "Address already in use")
    refused(cli(redis_url, "listen", "work", "tests.jobs:echo", *FAST, "--metrics-port", busy),
            2, "cannot serve metrics", "Address already in use")


def test_retrying_the_failed_tasks_of_an_unknown_queue_says_so(blueque_main: Run,
                                                               redis_url: str,
                                                               client: blueque.Client) -> None:
    client.get_queue("work").enqueue("x")
    refused(blueque_main("retry", "--failed", "wrok", "--url", redis_url), 4,
            "queue 'wrok' is not known")


@pytest.mark.parametrize("arguments", [("tasks", "documnt"), ("retry", "--failed", "documnt"),
                                       ("cancel", "--all", "documnt"),
                                       ("forget-queue", "documnt")])
def test_a_misspelt_queue_gets_a_suggestion(blueque_main: Run, redis_url: str,
                                            client: blueque.Client,
                                            arguments: tuple[str, ...]) -> None:
    client.get_queue("documents").enqueue("{}")
    client.get_queue("images").enqueue("{}")
    refused(blueque_main(*arguments, "--url", redis_url), 4,
            "queue 'documnt' is not known (not in blueque_queues); did you mean 'documents'?")
    far = blueque_main("tasks", "zzz", "--url", redis_url)
    refused(far, 4, "queue 'zzz' is not known")
    assert "did you mean" not in far.stderr


def test_parameters_that_are_not_json_are_enqueued_with_a_warning(
        blueque_main: Run, redis_url: str, client: blueque.Client) -> None:
    """`blueque enqueue q "{page: 1}"` (the shell's quotes lost) took text no JSON task can
    read without a word: it is still enqueued (parameters are text), with a warning."""
    done = blueque_main("enqueue", "q", "{page: 1}", "--task-id", "t1", "--url", redis_url)
    assert done.returncode == 0 and done.stdout == "t1\n"
    assert done.stderr.startswith("blueque: warning: the parameters are not JSON (Expecting "
                                  "property name enclosed in double quotes")
    assert "--text if plain text is meant" in done.stderr
    assert client.get_task("t1").parameters == "{page: 1}"
    for quiet in (("enqueue", "q", '{"page": 1}'), ("enqueue", "q", "7"),
                  ("enqueue", "q", "plain words", "--text")):
        done = blueque_main(*quiet, "--url", redis_url)
        assert done.returncode == 0 and done.stderr == "", quiet


def test_a_port_that_accepts_and_never_answers_is_said_at_once(blueque_main: Run,
                                                              redis_url: str) -> None:
    """`blueque status` against a port that is not Redis and never answers waited the 5 s of
    its connect timeout, then said "unreachable": it says what it found after 2 s."""
    with FakeServer(lambda command: b"") as silent:  # reads commands, answers none
        done = blueque_main("status", "--url", silent.url)
    refused(done, 3, f"the server at 127.0.0.1:{silent.port} accepted the connection but did "
            "not answer within 2 s: it is not a Redis", "check the URL's host and port")
    # a Redis that does answer is not held to it: its own connections wait as they should
    assert blueque_main("status", "--url", redis_url).returncode == 0


def test_demo_refuses_an_empty_url(blueque_main: Run) -> None:
    """Before it starts anything (no redis-server, no daemon): in-process."""
    refused(blueque_main("demo", "--url", ""), 2, "empty Redis URL")


def test_demo_refuses_a_bad_queue_name_before_it_starts_anything(blueque_main: Run) -> None:
    """It started a redis-server and a listener, which refused the name (exit 2), and then
    said 'the listener exited with code 2' and exited 1: in-process, nothing may start."""
    usage_error(blueque_main("demo", "--queue", "bad queue"), "--queue", "contains ' '")


def test_demo_help_says_where_it_runs_without_a_url(blueque_main: Run) -> None:
    """Its --url is not the other commands' (default redis://localhost:6379/0)."""
    text = " ".join(blueque_main("demo", "--help").stdout.split())
    assert "--url URL a Redis to run the demo on (default: $BLUEQUE_URL, else a private " \
           "redis-server the demo starts and stops)" in text
    assert "localhost:6379" not in text


@pytest.mark.parametrize("argv", [["--json", "demo"], ["--json", *LISTEN],
                                  ["--json", "dashboard"], ["--json", "metrics"]])
def test_json_where_nothing_prints_json_is_refused(blueque_main: Run, redis_url: str,
                                                   redis_client: redis.Redis,
                                                   argv: list[str]) -> None:
    """Not ignored (a daemon's log stays text; the demo prints its tables): refused before
    anything starts; the commands' own --help does not offer it."""
    refused(blueque_main(*argv, "--url", redis_url), 2, "--json", "--log-format json")
    assert redis_client.dbsize() == 0
    assert "--json" not in blueque_main(argv[1], "--help").stdout
    usage_error(blueque_main(*argv[1:], "--json", "--url", redis_url), "--json")


def test_a_missing_password_is_named_as_such(blueque_main: Run, password_server: RedisServer
                                             ) -> None:
    """redis-py's RESP3 words ('HELLO must be called with the client already authenticated,
    otherwise the HELLO AUTH <user> <pass> option can be used...') said nothing useful."""
    url = f"redis://127.0.0.1:{password_server.port}/0"
    done = blueque_main("status", "--url", url)
    refused(done, 2, "requires a password and none was given", "redis://:password@")
    assert "HELLO" not in done.stderr
    # redis-py's own retries (ten, backing off: 5 s) would only repeat the refusal
    ready = redis.Redis(port=password_server.port, protocol=2, decode_responses=True,
                        retry=Retry(NoBackoff(), 0))
    with pytest.raises(blueque.AuthenticationFailed, match="requires a password"):
        blueque.Client(ready).get_queue("work").enqueue("{}")  # a long command: refused as
    ready.close()  # "Protocol error: unauthenticated multibulk length" by the server


def test_library_reports_a_wrong_password_as_authentication(password_server: RedisServer
                                                            ) -> None:
    client = blueque.Client(f"redis://:wrong@127.0.0.1:{password_server.port}/0")
    with pytest.raises(blueque.AuthenticationFailed, match="authentication failed"):
        client.get_queue("work").enqueue("{}")
    assert not issubclass(blueque.AuthenticationFailed, blueque.RedisUnavailable)


@pytest.mark.parametrize("version", ["5.0.14", "6.0.16"])
def test_redis_older_than_6_2_is_refused_at_connect(blueque_main: Run, version: str,
                                                    tmp_path: Path) -> None:
    with FakeServer(old_redis(version)) as old:
        status = blueque_main("status", "--url", old.url)
        listen = subprocess.run(
            listen_command(old.url, "work", "tests.jobs:echo", *FAST), capture_output=True,
            text=True, env=environment(), cwd=ROOT, timeout=60)
    for done in (status, listen):
        refused(done, 2, "Blueque needs Redis 6.2 or later")
    if version.startswith("6."):
        assert f"it runs Redis {version}" in status.stderr


def test_unreachable_redis_is_still_exit_3(blueque_main: Run) -> None:
    refused(blueque_main("status", "--url", f"redis://127.0.0.1:{free_port()}/0"), 3,
            "unreachable")


# --- how a task ends --------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("parameters", "error", "raised"), [
    ({"code": 3}, "exit code 3: the task function called sys.exit(3)", "SystemExit: 3"),
    ({"code": None}, "exit code 0: the task function called sys.exit(0)", "SystemExit"),
    ({"message": "no input file"}, "no input file", "SystemExit: no input file"),
    ({"interrupt": True}, "KeyboardInterrupt: the task function was interrupted",
     "KeyboardInterrupt"),
])
def test_sys_exit_and_keyboard_interrupt_are_recorded_as_what_they_are(
        client: blueque.Client, start, parameters: dict[str, object], error: str,  # type: ignore[no-untyped-def]
        raised: str) -> None:
    daemon = start("work", "tests.jobs:exits")
    task = client.get_task(client.get_queue("work").enqueue(json.dumps(parameters))).wait(20)
    assert (task.status, task.error) == ("failed", error)
    assert raised in task.data["traceback"] and "tests/jobs.py" in task.data["traceback"]
    assert daemon.alive()


@pytest.mark.slow
def test_cancel_reason_is_kept_for_a_running_task(redis_url: str, client: blueque.Client,
                                                  start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    start("work", "tests.jobs:sleep")
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker),
                                                            "seconds": 120}))
    wait_until(lambda: marker.exists(), what="task running")
    done = cli(redis_url, "cancel", task_id, "--reason", "wrong input")
    assert done.returncode == 0, done.stderr
    task = client.get_task(task_id).wait(20)
    assert task.status == "failed" and task.cancelled
    assert task.error.startswith("cancelled: wrong input ("), task.error


@pytest.mark.slow
def test_cancel_reason_is_kept_for_an_adopted_task(redis_url: str, client: blueque.Client,
                                                   start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    first = start("work", "tests.jobs:sleep")
    task_id = client.get_queue("work").enqueue(json.dumps({"marker": str(marker),
                                                            "seconds": 120}))
    wait_until(lambda: marker.exists(), what="task running")
    child = client.get_task(task_id).pid
    assert first.stop() == 0  # --on-stop=keep: the child runs on, to be adopted
    try:
        assert cli(redis_url, "cancel", task_id, "--reason", "wrong input").returncode == 0
        start("work", "tests.jobs:sleep")  # adopts it, hears of the cancel, stops it
        task = client.get_task(task_id).wait(30)
    finally:
        kill_session_children([child] if child else [])
    assert task.status == "failed" and task.cancelled
    assert task.error.startswith("cancelled: wrong input ("), task.error


# --- task ids and queue names -----------------------------------------------------------------
def test_task_id_of_another_queue_is_refused(blueque_main: Run, client: blueque.Client,
                                             redis_url: str, redis_client: redis.Redis) -> None:
    client.get_queue("a").enqueue("first", task_id="job-1")
    with pytest.raises(blueque.InvalidTaskState, match="already exists in queue a, not b"):
        client.get_queue("b").enqueue("second", task_id="job-1")
    with pytest.raises(blueque.InvalidTaskState, match="already exists in queue a"):
        client.get_queue("b").schedule("second", eta=2e9, task_id="job-1")
    with pytest.raises(blueque.InvalidTaskState, match="already exists in queue a"):
        client.get_queue("b").enqueue_many(["x", "y"], task_ids=["new-1", "job-1"])
    assert not redis_client.exists(KEYS.task("new-1"))  # the whole call wrote nothing
    assert redis_client.llen(KEYS.pending("b")) == 0
    assert redis_client.hget(KEYS.task("job-1"), "parameters") == "first"
    refused(blueque_main("enqueue", "b", "second", "--task-id", "job-1", "--url", redis_url),
            1, "already exists in queue a")


def test_a_task_id_whose_key_is_no_task_is_left_alone_by_every_submit(
        any_client: blueque.Client) -> None:
    """submit, submit_after and submit_many share one rule for a taken id (lua/lib/taken.lua):
    a key that is no task hash is an existing id, not ours; submit_many read it as a hash and
    failed with WRONGTYPE halfway through its writes."""
    redis_client = any_client.redis
    redis_client.set(KEYS.task("taken"), "someone else's")
    queue = any_client.get_queue("a")
    parent = queue.enqueue("parent")
    assert not queue.enqueue("x", task_id="taken").created
    assert not queue.enqueue("x", task_id="taken", after=parent).created
    bulk = queue.enqueue_many(["x", "y"], task_ids=["fresh", "taken"])
    assert bulk.created_flags == [True, False]
    assert redis_client.get(KEYS.task("taken")) == "someone else's"
    assert redis_client.lrange(KEYS.pending("a"), 0, -1) == ["fresh", parent]


def test_every_submit_takes_the_taken_id_rule_from_its_one_library() -> None:
    """What a submit does with a taken id (another queue's task, our own earlier try, any
    other) is written once, in lua/lib/taken.lua: it was copied verbatim in submit.lua and
    submit_after.lua, and submit_many.lua had drifted (no type check)."""
    lua = ROOT / "blueque" / "lua"
    library = (lua / "lib" / "taken.lua").read_text()
    users = []
    for path in sorted(lua.glob("*.lua")):
        body = path.read_text()
        assert "already exists in queue" not in body, path.name
        assert not re.search(r"'HGET', KEYS\[\w+\], 'created'\)", body), path.name
        if "taken(" in body or "task_owner(" in body:
            users.append(path.name)
            assert re.search(r"^-- uses: .*\btaken\b", body, re.MULTILINE), path.name
            assert library in load_script(path.stem), path.name
    assert users == ["submit.lua", "submit_after.lua", "submit_many.lua"]


def test_idempotent_re_enqueue_says_the_task_already_existed(
        blueque_main: Run, client: blueque.Client, redis_url: str) -> None:
    def cli(url: str, *arguments: str) -> Done:
        return blueque_main(*arguments, "--url", url)

    queue = client.get_queue("work")
    first = queue.enqueue("x", task_id="doc-1")
    again = queue.enqueue("x", task_id="doc-1")
    assert (first, first.created) == ("doc-1", True)
    assert (again, again.created) == ("doc-1", False)
    assert isinstance(again, str)  # 1.0.1's programs get the id, as before
    assert queue.schedule("x", eta=2e9, task_id="doc-1").created is False

    done = cli(redis_url, "enqueue", "work", "x", "--task-id", "doc-1")
    assert done.returncode == 0 and done.stdout.strip() == "doc-1"
    assert "task doc-1 already existed (pending): nothing was enqueued" in done.stderr
    data = json.loads(cli(redis_url, "enqueue", "work", "x", "--task-id", "doc-1",
                          "--json").stdout)
    assert (data["task_id"], data["created"]) == ("doc-1", False)
    fresh = json.loads(cli(redis_url, "enqueue", "work", "x", "--task-id", "doc-2",
                           "--json").stdout)
    assert fresh["created"] is True


def test_enqueue_wait_on_an_existing_task_says_so(blueque_main: Run, client: blueque.Client,
                                                  redis_url: str) -> None:
    queue = client.get_queue("work")
    queue.enqueue("x", task_id="done-1")
    task = client.get_listener("work").reserve()
    assert task is not None
    processor = client.get_processor(task)
    processor.start(12345)
    processor.complete("the old result")
    done = blueque_main("enqueue", "work", "new input", "--task-id", "done-1", "--wait",
                        "--json", "--url", redis_url)
    assert done.returncode == 0, done.stderr
    assert "already existed (complete): nothing was enqueued; waiting for the existing task" \
        in done.stderr
    report = json.loads(done.stdout)
    assert report["created"] is False and report["tasks"][0]["result"] == "the old result"


BAD_NAMES = ["a:b", "a,b", "a b", " ", "", "tab\there", "nul\x00", "new\nline"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_queue_names_listen_cannot_serve_are_refused(client: blueque.Client, name: str,
                                                     redis_client: redis.Redis) -> None:
    queue = blueque.Queue.__new__(blueque.Queue)  # as get_queue would, even for ""
    queue._name, queue._store = name, client.store
    for attempt in (lambda: queue.enqueue("x"), lambda: queue.enqueue_many(["x"]),
                    lambda: queue.schedule("x", eta=2e9), lambda: queue.configure(max_attempts=2)):
        with pytest.raises(blueque.ConfigurationError, match="queue name"):
            attempt()
    assert redis_client.dbsize() == 0


@pytest.mark.parametrize("name", ["a b", "tab\there", "x\x07"])
def test_cli_refuses_bad_queue_names_everywhere(blueque_main: Run, redis_url: str,
                                                redis_client: redis.Redis, tmp_path: Path,
                                                name: str) -> None:
    refused(blueque_main("enqueue", name, "x", "--url", redis_url), 2, "queue name")
    refused(blueque_main("configure", name, "--max-attempts", "2", "--url", redis_url), 2,
            "queue name")
    refused(cli(redis_url, "listen", name, "tests.jobs:echo", *FAST), 2, "queue name")
    cron = tmp_path / "cron.json"
    cron.write_text(json.dumps({"cron": [{"name": "n", "cron": "* * * * *", "queue": name}]}))
    refused(cli(redis_url, "scheduler", "--once", "--cron-file", str(cron)), 2, "queue name")
    assert redis_client.dbsize() == 0


def test_good_queue_names_still_work(client: blueque.Client) -> None:
    for name in ("documents", "reports.daily", "gpu-jobs_2", "dé-jà"):
        task_id = client.get_queue(name).enqueue("x")
        assert client.get_task(task_id).queue == name


def test_forget_queue_removes_an_empty_queue_only(blueque_main: Run, client: blueque.Client,
                                                  redis_url: str, redis_client: redis.Redis
                                                  ) -> None:
    def cli(url: str, *arguments: str) -> Done:
        return blueque_main(*arguments, "--url", url)

    busy, idle = client.get_queue("busy"), client.get_queue("idle")
    busy.enqueue("x")
    idle.configure(max_attempts=3)
    redis_client.zadd(KEYS.queues(), {"bad name": 0})  # left by an older writer
    listened = client.get_listener("listened")  # registers, as 1.0.1 does
    refused(cli(redis_url, "forget-queue", "busy"), 1, "not empty (1 pending)")
    refused(cli(redis_url, "forget-queue", "listened"), 1, "listeners")
    for name in ("idle", "bad name"):
        done = cli(redis_url, "forget-queue", name)
        assert done.returncode == 0, done.stderr
    assert set(client.queue_names()) == {"busy", "listened"}
    assert not redis_client.exists(KEYS.queue_config("idle"))
    refused(cli(redis_url, "forget-queue", "idle"), 4, "not known")
    listened.close()
    assert json.loads(cli(redis_url, "forget-queue", "listened", "--json").stdout) == {
        "queue": "listened", "forgotten": True}
    status = json.loads(cli(redis_url, "status", "--json").stdout)
    assert [q["name"] for q in status["queues"]] == ["busy"]
