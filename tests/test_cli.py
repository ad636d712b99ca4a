"""The `blueque` command against the private redis-server.

Commands run in-process through blueque.cli.main(argv) (stdout and stderr captured; the
return code is the exit code); real processes prove `python -m blueque.cli`, the console
script's entry point and the $BLUEQUE_URL environment, and run the scheduler daemon. Every
command is run with table and --json output, and the exit codes are checked: 0 ok,
1 failure or refusal, 2 usage (bad arguments or URL), 3 Redis unreachable, 4 not found."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

import blueque
from blueque.cli import build_parser
from blueque.keys import Keys
from blueque.testing import free_port, wait_for
from tests.conftest import Done, Run
from tests.daemons import between
from tests.job_registry import jobs

ROOT = Path(__file__).resolve().parent.parent
KEYS = Keys()


def command(url: str | None, *arguments: str) -> list[str]:
    url_args = ["--url", url] if url else []
    return [sys.executable, "-m", "blueque.cli", *arguments, *url_args]


def environment() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("BLUEQUE_URL", None)
    return env


def cli(url: str | None, *arguments: str, stdin: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    """The command as a real process (`python -m blueque.cli`)."""
    return subprocess.run(command(url, *arguments), capture_output=True, text=True,
                          input=stdin, env=environment(), cwd=ROOT, timeout=60)


@pytest.fixture
def in_background(run: Run) -> Iterator[Callable[..., Callable[[], Done]]]:
    """``finished = in_background(*arguments)``: the command run in a thread (as one waiting
    for tasks the test then finishes); ``finished()`` joins it and returns what it did."""
    threads: list[threading.Thread] = []

    def start(*arguments: str) -> Callable[[], Done]:
        result: list[Done] = []
        thread = threading.Thread(target=lambda: result.append(run(*arguments)), daemon=True)
        thread.start()
        threads.append(thread)

        def finished() -> Done:
            thread.join(60)
            assert not thread.is_alive() and result, "the command did not return"
            return result[0]

        return finished

    yield start
    for thread in threads:
        thread.join(60)


def finish(client: blueque.Client, queue: str, outcome: str, text: str = "x") -> str:
    """A task of ``queue`` run to complete or failed through the library."""
    task_id = client.get_queue(queue).enqueue("{}")
    listener = client.get_listener(queue)
    task = listener.reserve()
    assert task is not None and task.id == task_id
    processor = client.get_processor(task)
    processor.start(os.getpid())
    processor.complete(text) if outcome == "complete" else processor.fail(text)
    listener.close()
    return task_id


# --- the command as a process ----------------------------------------------------------------
def test_python_m_blueque_cli_documents_commands_and_exit_codes() -> None:
    done = cli(None, "--help")
    assert done.returncode == 0
    for word in ("status", "tasks", "show", "enqueue", "cancel", "retry", "purge", "wait",
                 "listen", "scheduler", "configure", "demo", "--url"):
        assert word in done.stdout
    assert "3  Redis unreachable" in done.stdout
    assert "4  task or queue not found" in done.stdout


def test_console_script_entry_point_runs_the_command(redis_url: str,
                                                     redis_client: redis.Redis) -> None:
    """What the installed `blueque` script runs: the entry point the package declares,
    called as pip's generated script calls it (sys.exit of the function, argv from sys.argv)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = declared["blueque"].split(":")
    script = f"import sys\nfrom {module} import {function}\nsys.exit({function}())"
    done = subprocess.run([sys.executable, "-c", script, "enqueue", "entry", "{}", "--url",
                           redis_url], capture_output=True, text=True, env=environment(),
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert redis_client.hget(KEYS.task(done.stdout.strip()), "queue") == "entry"
    missing = subprocess.run([sys.executable, "-c", script, "show", "nope", "--url",
                              redis_url], capture_output=True, text=True, env=environment(),
                             cwd=ROOT, timeout=60)
    assert missing.returncode == 4 and "nope" in missing.stderr


def test_url_comes_from_the_environment(blueque_main: Run, redis_url: str,
                                        redis_client: redis.Redis,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLUEQUE_URL", redis_url)
    done = blueque_main("enqueue", "envq", "{}")
    assert done.returncode == 0, done.stderr
    assert redis_client.hget(KEYS.task(done.stdout.strip()), "queue") == "envq"
    monkeypatch.setenv("BLUEQUE_URL", f"redis://127.0.0.1:{free_port()}/0")
    done = blueque_main("status")
    assert done.returncode == 3  # the variable was used, not the default URL


# --- exit codes -------------------------------------------------------------------------------
def test_help_documents_commands_and_exit_codes(blueque_main: Run) -> None:
    done = blueque_main("--help")
    assert done.returncode == 0
    for word in ("status", "tasks", "show", "enqueue", "cancel", "retry", "purge", "wait",
                 "listen", "scheduler", "configure", "demo", "--url"):
        assert word in done.stdout
    assert "3  Redis unreachable" in done.stdout
    assert "4  task or queue not found" in done.stdout
    assert "exit codes" in blueque_main("retry", "--help").stdout


@pytest.mark.parametrize("url", ["foo://host", "redis://host:port/0", "redis://host:6379/db"])
def test_bad_url_exits_2_with_a_clear_message(blueque_main: Run, url: str) -> None:
    done = blueque_main("status", "--url", url)
    assert done.returncode == 2
    assert done.stderr.startswith("blueque: error: ") and "Redis URL" in done.stderr


def test_bad_arguments_exit_2(blueque_main: Run) -> None:
    assert blueque_main("frobnicate").returncode == 2
    done = blueque_main("purge", "q", "--older-than", "soon")
    assert done.returncode == 2 and "bad duration" in done.stderr


@pytest.mark.parametrize(("argv", "meant"), [
    (["lisen", "work", "tests.jobs:echo"], "listen"),
    (["enqeue", "work", "{}"], "enqueue"),
    (["tasks", "work", "--status", "complet"], "complete"),
])
def test_a_misspelt_command_or_choice_gets_a_suggestion(blueque_main: Run, argv: list[str],
                                                        meant: str) -> None:
    done = blueque_main(*argv)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(f"did you mean {meant!r}?"), done.stderr


def test_no_suggestion_for_a_word_like_no_command(blueque_main: Run) -> None:
    done = blueque_main("frobnicate")
    assert done.returncode == 2 and "invalid choice: 'frobnicate'" in done.stderr
    assert "did you mean" not in done.stderr


@pytest.mark.parametrize(("argv", "unknown"), [
    (["status", "--bogus"], "--bogus"), (["enqueue", "work", "{}", "extra"], "extra"),
    (["tasks", "work", "--limt", "3"], "--limt 3")])
def test_an_unknown_argument_is_refused_with_its_commands_usage(blueque_main: Run,
                                                                argv: list[str],
                                                                unknown: str) -> None:
    """Not the top-level usage (`blueque [-h] [--url URL] [--json] COMMAND ...`), which does
    not show the options the command has."""
    done = blueque_main(*argv)
    assert done.returncode == 2
    assert done.stderr.startswith(f"usage: blueque {argv[0]} "), done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"blueque {argv[0]}: error: unrecognized arguments: {unknown}"


def test_version_says_the_packages_version(blueque_main: Run) -> None:
    """Not 'the following arguments are required: COMMAND'."""
    done = blueque_main("--version")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["version"]
    assert (done.returncode, done.stdout.strip()) == (0, f"blueque {version}")


def test_every_option_of_every_command_says_what_it_is_for(blueque_main: Run) -> None:
    """`blueque COMMAND --help`: no bare `--log-level LOG_LEVEL` or `--older-than DURATION`
    without a word on what it takes."""
    parser = build_parser()
    commands = next(action for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction))
    silent = [f"{name} {action.option_strings[0]}"
              for name, sub in commands.choices.items() for action in sub._actions
              if action.option_strings and not action.help]
    assert silent == []
    assert len(commands.choices) == 20  # issue 31: limit, pause and resume
    # the usual five fields work: the help said "(6 fields: seconds last)"
    scheduler = " ".join(blueque_main("scheduler", "--help").stdout.split())
    assert "(5 fields, or 6 with seconds last)" in scheduler


def test_unreachable_redis_exits_3(blueque_main: Run) -> None:
    done = blueque_main("status", "--url", f"redis://127.0.0.1:{free_port()}/0")
    assert done.returncode == 3
    assert "unreachable" in done.stderr and "redis-server is running" in done.stderr


@pytest.mark.parametrize("arguments", [("show", "nope"), ("cancel", "nope"),
                                       ("retry", "nope"), ("tasks", "no-such-queue")])
def test_unknown_task_or_queue_exits_4(run: Run, arguments: tuple[str, ...]) -> None:
    done = run(*arguments)
    assert done.returncode == 4
    assert "nope" in done.stderr or "no-such-queue" in done.stderr


# --- enqueue, show, tasks ---------------------------------------------------------------------
def test_enqueue_then_show_and_tasks(run: Run, run_json: Callable[..., Any],
                                     redis_client: redis.Redis) -> None:
    done = run("enqueue", "mail", '{"to": "ops"}', "--max-attempts", "3", "--time-limit", "2h")
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.strip()
    data = redis_client.hgetall(KEYS.task(task_id))
    assert (data["status"], data["parameters"]) == ("pending", '{"to": "ops"}')
    assert (data["max_attempts"], data["time_limit"]) == ("3", "7200.0")
    assert redis_client.lrange(KEYS.pending("mail"), 0, -1) == [task_id]

    shown = run("show", task_id)
    assert shown.returncode == 0
    assert task_id in shown.stdout and "pending" in shown.stdout
    created = datetime.fromtimestamp(float(data["created"]), UTC)
    assert created.strftime("%Y-%m-%d %H:%M") in shown.stdout  # times are readable
    assert run_json("show", task_id) == {  # typed (tests/test_cli_output.py has them all)
        "id": task_id, "status": "pending", "queue": "mail", "parameters": '{"to": "ops"}',
        "created": float(data["created"]), "updated": float(data["updated"]),
        "max_attempts": 3, "time_limit": 7200.0, "state": "pending", "history": [],
        "checkpoint": None}

    listed = run("tasks", "mail")
    assert listed.returncode == 0
    assert task_id in listed.stdout and "pending" in listed.stdout
    assert [t["id"] for t in run_json("tasks", "mail")] == [task_id]
    assert run_json("tasks", "mail", "--status", "complete") == []


def test_tasks_lists_every_state_with_a_limit(run: Run, run_json: Callable[..., Any],
                                              client: blueque.Client) -> None:
    failed = finish(client, "jobs", "failed", "Traceback: boom")
    complete = finish(client, "jobs", "complete", "42")
    pending = [client.get_queue("jobs").enqueue(str(n)) for n in range(5)]
    tasks = run_json("tasks", "jobs")
    assert {t["id"]: t["status"] for t in tasks} == {
        failed: "failed", complete: "complete", **dict.fromkeys(pending, "pending")}
    assert len(run_json("tasks", "jobs", "--status", "pending", "--limit", "2")) == 2
    table = run("tasks", "jobs", "--status", "failed").stdout
    assert "Traceback: boom" in table and failed in table


def test_show_and_tasks_name_a_jobs_task_and_tasks_shows_progress(
        run: Run, run_json: Callable[..., Any], client: blueque.Client) -> None:
    """A blueque.Jobs task's job is read from its parameters: `show` names it in its heading
    and --json; `tasks` gets a JOB column when it lists one. A running task's progress is a
    column of `tasks` (it was only in --json)."""
    queue = client.get_queue("images")
    job = jobs.enqueue(queue, "resize", width=10, task_id="resize-1")
    plain = queue.enqueue('{"job": 7}', task_id="plain")  # not a job: no name made up
    running = client.get_listener("images")
    task = running.reserve()
    assert task is not None and task.id == job
    processor = client.get_processor(task)
    processor.start(os.getpid())
    processor.progress(0.456, "resizing")
    shown = run("show", job).stdout
    assert shown.splitlines()[0] == "task resize-1: job resize"
    assert run_json("show", job)["job"] == "resize"
    assert run("show", plain).stdout.splitlines()[0] == "task plain"
    assert "job" not in run_json("show", plain)
    listed = run("tasks", "images").stdout.splitlines()
    assert listed[0].split()[:9] == ["ID", "STATUS", "ATTEMPTS", "PROGRESS", "UPDATED", "ETA",
                                     "NODE", "JOB", "RESULT/ERROR/PARAMETERS"]
    row = next(line.split() for line in listed if line.startswith("resize-1"))
    assert row[1:4] == ["started", "1", "46%"] and "resize" in row
    other = next(line.split() for line in listed if line.startswith("plain"))
    assert other[1:4] == ["pending", "-", "-"]
    assert {t["id"]: t.get("job") for t in run_json("tasks", "images")} == {
        "resize-1": "resize", "plain": None}
    processor.complete("done")
    client.get_queue("mail").enqueue("{}")
    mail = run("tasks", "mail").stdout  # no registry's task: no such column
    assert "PROGRESS" in mail and "JOB" not in mail
    running.close()


def test_tables_never_pass_terminal_escapes_through(run: Run, run_json: Callable[..., Any],
                                                    client: blueque.Client) -> None:
    """Whoever can enqueue writes the parameters (and a task its error): printed raw, an OSC
    sequence set the operator's terminal title and a CSI one cleared the screen. Tables show
    control characters escaped; --json keeps the value as it is."""
    hostile = '{"x": "\x1b]0;owned\x07\x1b[2J\r\x9b1m"}'
    failed = finish(client, "jobs", "failed", "Traceback:\nValueError: \x1b[41mred\x1b[0m")
    task_id = client.get_queue("jobs").enqueue(hostile, task_id="t\x1b[31m")
    for arguments in (("tasks", "jobs"), ("show", task_id), ("show", failed),
                      ("tasks", "jobs", "--status", "failed")):
        shown = run(*arguments)
        assert shown.returncode == 0, shown.stderr
        assert not set(shown.stdout) & {"\x1b", "\x07", "\r", "\x9b"}, arguments
    assert "\\x1b]0;owned\\x07\\x1b[2J" in run("tasks", "jobs").stdout
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x9b1m" in run("show", task_id).stdout
    assert "task t\\x1b[31m" in run("show", task_id).stdout
    assert "\\x1b[41mred\\x1b[0m" in run("show", failed).stdout
    assert "ValueError" in run("show", failed).stdout.split("\n", 3)[3]  # lines stay lines
    assert [t["parameters"] for t in run_json("tasks", "jobs") if t["id"] == task_id] == [
        hostile]


def test_enqueue_reads_stdin_and_is_idempotent_with_a_task_id(run: Run,
                                                              redis_client: redis.Redis
                                                              ) -> None:
    for _ in range(2):
        done = run("enqueue", "q", "-", "--task-id", "report-2026-11", stdin='{"big": true}')
        assert done.returncode == 0 and done.stdout.strip() == "report-2026-11"
    assert redis_client.lrange(KEYS.pending("q"), 0, -1) == ["report-2026-11"]
    assert redis_client.hget(KEYS.task("report-2026-11"), "parameters") == '{"big": true}'


def test_enqueue_with_delay_or_eta_schedules(run: Run, redis_client: redis.Redis) -> None:
    before = time.time()
    delayed = run("enqueue", "q", "{}", "--delay", "1h").stdout.strip()
    eta = redis_client.zscore(KEYS.scheduled("q"), delayed)
    assert eta is not None and between(before + 3600, eta, time.time() + 3600)
    at = run("enqueue", "q", "{}", "--eta", "2030-01-02T03:04:05Z").stdout.strip()
    expected = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()
    assert redis_client.zscore(KEYS.scheduled("q"), at) == expected
    unix = run("enqueue", "q", "{}", "--eta", "1900000000", "--json").stdout
    assert json.loads(unix)["queue"] == "q"
    assert redis_client.zscore(KEYS.scheduled("q"), json.loads(unix)["task_id"]) == 1900000000
    assert "warning" not in run("enqueue", "q", "{}", "--eta", "2030-01-02T03:04:05Z").stderr
    # in the past (a date copied from an example): taken, due at once, and said so
    past = run("enqueue", "q", "{}", "--eta", "2026-01-02T03:04:05Z")
    assert past.returncode == 0
    assert redis_client.hget(KEYS.task(past.stdout.strip()), "status") == "pending"
    assert past.stderr.startswith("blueque: warning: --eta 2026-01-02 03:04:05Z was ")
    assert past.stderr.rstrip().endswith("ago: the task is due at once")
    assert run("enqueue", "q", "{}", "--eta", "tomorrow").returncode == 2
    assert run("enqueue", "q", "{}", "--delay", "1h", "--eta", "1900000000").returncode == 2


def test_enqueue_wait_prints_the_result(in_background: Callable[..., Callable[[], Done]],
                                        client: blueque.Client) -> None:
    finished = in_background("enqueue", "w", "{}", "--task-id", "waited", "--wait", "--json",
                             "--timeout", "60")
    wait_for(lambda: client.get_task("waited", missing_ok=True).exists, timeout=30)
    task = client.get_listener("w").reserve()
    assert task is not None
    processor = client.get_processor(task)
    processor.start(os.getpid())
    processor.complete('{"answer": 42}')
    done = finished()
    assert done.returncode == 0, done.stderr
    (waited,) = json.loads(done.stdout)["tasks"]
    assert (waited["id"], waited["status"], waited["result"]) == ("waited", "complete",
                                                                  '{"answer": 42}')


# --- status -----------------------------------------------------------------------------------
def test_status_shows_counts_and_listener_leases(run: Run, run_json: Callable[..., Any],
                                                 client: blueque.Client) -> None:
    finish(client, "jobs", "complete")
    finish(client, "jobs", "failed")
    client.get_queue("jobs").enqueue("{}")
    client.get_queue("jobs").schedule("{}", time.time() + 600)
    store = client.store
    store.add_listener("jobs", "alive.example_11")
    store.lease("jobs", "alive.example_11", 60_000, "register")
    store.write_listener_info("alive.example_11", {"host": "alive.example", "pid": "11",
                                                   "renewed": repr(time.time())}, 60)
    store.add_listener("jobs", "dead.example_22")
    store.lease("jobs", "dead.example_22", 1, "register")
    wait_for(lambda: "dead.example_22" in store.expired_listeners("jobs"), timeout=5)

    status = run_json("status")
    (queue,) = status["queues"]
    assert {k: queue[k] for k in ("name", "pending", "scheduled", "complete", "failed",
                                  "listeners")} == {
        "name": "jobs", "pending": 1, "scheduled": 1, "complete": 1, "failed": 1,
        "listeners": 2}
    leases = {item["listener"]: item for item in status["listeners"]}
    assert 55 < leases["alive.example_11"]["lease_remaining"] <= 60
    assert leases["alive.example_11"]["info"]["host"] == "alive.example"
    assert leases["dead.example_22"]["lease_remaining"] < 0

    text = run("status").stdout
    assert "jobs" in text and "alive.example_11" in text
    assert "left" in text and "EXPIRED" in text


def test_status_with_no_queues(run: Run, run_json: Callable[..., Any]) -> None:
    assert "no queues" in run("status").stdout
    status = run_json("status")
    assert (status["queues"], status["listeners"]) == ([], [])
    assert (status["redis"]["maxmemory_policy"], status["redis"]["evicts"]) == ("noeviction",
                                                                                False)
    assert abs(status["time"] - time.time()) < 60


# --- cancel, retry, purge, configure ----------------------------------------------------------
def test_cancel_a_pending_task_then_refuse_a_second_cancel(run: Run,
                                                           run_json: Callable[..., Any],
                                                           client: blueque.Client,
                                                           redis_client: redis.Redis) -> None:
    task_id = client.get_queue("c").enqueue("{}")
    done = run("cancel", task_id, "--reason", "wrong input")
    assert done.returncode == 0 and "cancelled" in done.stdout
    data = redis_client.hgetall(KEYS.task(task_id))
    assert data["status"] == "failed" and "wrong input" in data["error"] and data["cancelled"]
    assert redis_client.llen(KEYS.pending("c")) == 0
    again = run("cancel", task_id)
    assert again.returncode == 1 and "cannot be cancelled" in again.stderr
    other = client.get_queue("c").schedule("{}", time.time() + 600)
    assert run_json("cancel", other) == {"task_id": other, "outcome": "cancelled"}
    assert redis_client.zcard(KEYS.scheduled("c")) == 0


def test_retry_one_failed_task(run: Run, client: blueque.Client, redis_client: redis.Redis
                               ) -> None:
    task_id = finish(client, "r", "failed", "boom")
    done = run("retry", task_id)
    assert done.returncode == 0 and "pending again" in done.stdout
    data = redis_client.hgetall(KEYS.task(task_id))
    assert (data["status"], data["attempts"], data["last_error"]) == ("pending", "1", "boom")
    assert "error" not in data and "finished_at" not in data
    assert redis_client.lrange(KEYS.pending("r"), 0, -1) == [task_id]
    assert redis_client.llen(KEYS.failed("r")) == 0
    refused = run("retry", task_id)  # pending now: not failed
    assert refused.returncode == 1 and "only a failed task" in refused.stderr
    assert run("retry").returncode == 2


def test_retry_every_failed_task_of_a_queue(run_json: Callable[..., Any],
                                            client: blueque.Client,
                                            redis_client: redis.Redis) -> None:
    failed = [finish(client, "r", "failed") for _ in range(4)]
    kept = finish(client, "r", "complete")
    assert run_json("retry", "--failed", "r", "--limit", "1")["retried"] == failed[:1]
    retried = run_json("retry", "--failed", "r")["retried"]
    assert retried == failed[1:]  # oldest first
    assert sorted(redis_client.lrange(KEYS.pending("r"), 0, -1)) == sorted(failed)
    assert redis_client.llen(KEYS.failed("r")) == 0
    assert redis_client.hget(KEYS.task(kept), "status") == "complete"


def test_purge_deletes_only_old_finished_tasks(run: Run, run_json: Callable[..., Any],
                                               client: blueque.Client,
                                               redis_client: redis.Redis) -> None:
    old_complete = finish(client, "p", "complete")
    old_failed = finish(client, "p", "failed")
    new_complete = finish(client, "p", "complete")
    for task_id in (old_complete, old_failed):
        redis_client.hset(KEYS.task(task_id), "finished_at", str(time.time() - 7200))
    result = run_json("purge", "p", "--older-than", "1h", "--status", "failed")
    assert result == {"queue": "p", "deleted": {"failed": 1}}
    assert not redis_client.exists(KEYS.task(old_failed))
    done = run("purge", "p", "--older-than", "60m")
    assert done.returncode == 0 and "1 complete, 0 failed" in done.stdout
    assert redis_client.lrange(KEYS.complete("p"), 0, -1) == [new_complete]
    assert redis_client.exists(KEYS.task(new_complete))
    assert not redis_client.exists(KEYS.task(old_complete))
    assert run("purge", "p", "--older-than", "1h", "--status", "pending").returncode == 2


def test_configure_sets_shows_and_removes_queue_defaults(run: Run,
                                                         run_json: Callable[..., Any],
                                                         client: blueque.Client) -> None:
    result = run_json("configure", "cq", "--max-attempts", "3", "--time-limit", "2h",
                      "--result-ttl", "7d")
    assert result["config"] == {"max_attempts": 3, "time_limit": 7200.0,
                                "result_ttl": 604800.0}
    assert client.get_queue("cq").config() == {"max_attempts": "3", "time_limit": "7200.0",
                                               "result_ttl": "604800.0"}
    assert "cq" in client.queue_names()
    shown = run("configure", "cq")
    assert "time_limit" in shown.stdout and "7200.0" in shown.stdout
    run_json("configure", "cq", "--time-limit", "none")
    assert "time_limit" not in client.get_queue("cq").config()
    assert run("configure", "cq", "--max-attempts", "0").returncode == 2


# --- wait ------------------------------------------------------------------------------------
def test_wait_for_finished_tasks_exit_codes(run: Run, client: blueque.Client) -> None:
    good = [finish(client, "w", "complete", f"r{n}") for n in range(2)]
    bad = finish(client, "w", "failed", "broken")
    done = run("wait", *good, "--progress", "always")
    assert done.returncode == 0
    assert "2/2 finished, 0 failed" in done.stderr
    assert "r0" in done.stdout and "r1" in done.stdout
    failed = run("wait", *good, bad, "--json")
    assert failed.returncode == 1 and "1 task(s) failed" in failed.stderr
    assert {t["id"]: t["status"] for t in json.loads(failed.stdout)["tasks"]} == {
        good[0]: "complete", good[1]: "complete", bad: "failed"}
    assert run("wait", good[0], "missing-task").returncode == 4


def test_wait_times_out_on_unfinished_tasks(run: Run, client: blueque.Client) -> None:
    task_id = client.get_queue("w").enqueue("{}")
    done = run("wait", task_id, "--timeout", "0.5")
    assert done.returncode == 1 and "timed out" in done.stderr


def test_wait_follows_tasks_finishing_while_it_waits(
        in_background: Callable[..., Callable[[], Done]], client: blueque.Client) -> None:
    queue = client.get_queue("live")
    ids = [queue.enqueue(str(n)) for n in range(20)]
    finished = in_background("wait", *ids, "--progress", "always", "--timeout", "60")
    listener = client.get_listener("live")
    for n in range(20):
        task = listener.reserve()
        assert task is not None
        processor = client.get_processor(task)
        processor.start(os.getpid())
        processor.complete(f"done {n}")
    done = finished()
    assert done.returncode == 0, done.stderr
    assert "20/20 finished, 0 failed" in done.stderr
    assert done.stdout.count("complete") == 20


# --- scheduler (a daemon: a real process) -----------------------------------------------------
def test_scheduler_once_moves_due_tasks_and_registers_cron(redis_url: str,
                                                           client: blueque.Client,
                                                           redis_client: redis.Redis) -> None:
    past = time.time() - 1
    client.store.submit("s", "due-1", "{}", past, eta=past)
    done = cli(redis_url, "scheduler", "--once", "--cron", "beat=* * * * * *:s", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["due"] == {"s": 1} and report["errors"] == []
    assert redis_client.lrange(KEYS.pending("s"), 0, -1) == ["due-1"]
    assert redis_client.hexists(KEYS.cron(), "beat")


def test_scheduler_refuses_bad_cron_entries(redis_url: str, redis_client: redis.Redis,
                                            tmp_path: Path) -> None:
    # a real process: the scheduler sets up the process's logging (a daemon's), which
    # in-process would stay for the tests after this one
    done = cli(redis_url, "scheduler", "--once", "--cron", "beat=every minute:s")
    assert done.returncode == 2 and "not a cron expression" in done.stderr
    (tmp_path / "cron.json").write_text('[{"name": "x"}]')
    done = cli(redis_url, "scheduler", "--once", "--cron-file", str(tmp_path / "cron.json"))
    assert done.returncode == 2 and "missing cron, queue" in done.stderr
