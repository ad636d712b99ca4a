"""Redis ACL users (issue 30 item 4), on a real Redis 7 with real users: each role's ACL line
(blueque.acl, listed in docs/how-to/acl.md and PROTOCOL.md) is enough to run the role, and a
user that lacks one permission is refused up front (exit 2, the permission named) with
nothing written.
On the code before, a user without PUBLISH got `blueque enqueue` exit 1 "refused" while the
task existed (and later ran): a caller retrying without a task id made a duplicate; and
`blueque listen` started, took a task and exited a second later, leaving the run orphaned."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

import blueque
from blueque import acl
from blueque.errors import PermissionRefused
from blueque.keys import Keys
from blueque.testing import RedisServer
from tests.daemons import FAST, ROOT, Daemon, daemons, listen_command, wait_until

pytestmark = pytest.mark.slow

KEYS = Keys()
ACL_PAGE = (ROOT / "docs" / "how-to" / "acl.md").read_text()
PROTOCOL = (ROOT / "PROTOCOL.md").read_text()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A Redis of the test's own: its users are the test's."""
    with RedisServer() as started:
        yield started


Users = Callable[..., str]


@pytest.fixture
def users(server: RedisServer) -> Users:
    """``users(role, drop=(), line=None)``: a real ACL user made from ``role``'s line (less the
    words in ``drop``, or ``line`` itself); its URL."""
    admin = redis.Redis(port=server.port, decode_responses=True)
    made = iter(range(1000))

    def make(role: acl.Role, drop: tuple[str, ...] = (), line: str | None = None) -> str:
        name = f"{role}-{next(made)}"
        words = shlex.split((line or acl.acl_line(role, name)).replace(">PASSWORD", ">pw"))
        admin.execute_command(*[w for w in words if w not in drop])
        return f"redis://{name}:pw@127.0.0.1:{server.port}/0"

    return make


def cli(url: str, *arguments: str, stdin: str | None = None, timeout: float = 60
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "blueque.cli", *arguments, "--url", url],
                          input=stdin, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def listener(started: list[Daemon], tmp_path: Path, url: str, function: str = "tests.jobs:echo"
             ) -> Daemon:
    daemon = Daemon(listen_command(url, "work", function, *FAST),
                    tmp_path / f"listener{len(started)}.log")
    started.append(daemon)
    return daemon


def test_the_docs_list_each_role_s_acl_line() -> None:
    for role in acl.ROLES:
        line = acl.acl_line(role)
        assert line in ACL_PAGE, f"docs/how-to/acl.md lacks the {role} line: {line}"
        assert line in PROTOCOL, f"PROTOCOL.md lacks the {role} line: {line}"


def test_the_client_line_enqueues_and_waits(server: RedisServer, users: Users,
                                            tmp_path: Path) -> None:
    url = users("client")
    admin = blueque.Client(server.url)
    done = cli(url, "enqueue", "work", '{"value": 1}')
    assert done.returncode == 0, done.stderr
    client = blueque.Client(url)
    queue = client.get_queue("work")
    first = queue.enqueue(json.dumps({"value": 2}))
    queue.enqueue_many([json.dumps({"value": n}) for n in (3, 4)])
    queue.schedule(json.dumps({"value": 5}), delay=0.5)
    after = queue.enqueue(json.dumps({"value": 6}), after=first)
    with daemons(tmp_path) as started:
        listener(started, tmp_path, server.url)  # the admin's: this test is the client's
        assert client.get_task(after).wait(30).result == "6"
        assert client.get_task(first).wait(30).status == "complete"
        waited = cli(url, "enqueue", "work", '{"value": 7}', "--wait", "--timeout", "30s")
        assert waited.returncode == 0 and waited.stdout.strip() == "7", waited.stderr
    assert admin.get_queue("work").stats().complete == 7


def test_the_listener_line_runs_tasks_retries_and_cancels(server: RedisServer, users: Users,
                                                          tmp_path: Path) -> None:
    admin = blueque.Client(server.url)
    queue = admin.get_queue("work")
    marker = tmp_path / "marker"
    with daemons(tmp_path) as started:
        daemon = listener(started, tmp_path, users("listener"), "tests.jobs:flaky")
        flaky = queue.enqueue(json.dumps({"succeed_on": 2, "marker": str(marker)}),
                              max_attempts=2, retry_backoff=0.01)
        task = admin.get_task(flaky).wait(30)
        assert (task.status, task.attempts) == ("complete", 2), task.data
        assert daemon.alive(), daemon.log()
        assert "NOPERM" not in daemon.log() and "ACL" not in daemon.log(), daemon.log()


def test_the_listener_line_stops_a_cancelled_run(server: RedisServer, users: Users,
                                                 tmp_path: Path) -> None:
    admin = blueque.Client(server.url)
    marker, release = tmp_path / "marker", tmp_path / "release"
    with daemons(tmp_path) as started:
        daemon = listener(started, tmp_path, users("listener"), "tests.jobs:hold")
        task_id = admin.get_queue("work").enqueue(
            json.dumps({"marker": str(marker), "release": str(release)}))
        wait_until(lambda: marker.exists(), what="the run started")
        assert cli(users("operator"), "cancel", task_id).returncode == 0
        task = admin.get_task(task_id).wait(30)
        assert task.status == "failed" and task.cancelled
        assert daemon.alive() and "NOPERM" not in daemon.log(), daemon.log()


def test_the_scheduler_line_moves_due_tasks_and_recovers_a_dead_listener(
        server: RedisServer, users: Users, tmp_path: Path) -> None:
    admin = blueque.Client(server.url)
    queue = admin.get_queue("work")
    marker, release = tmp_path / "marker", tmp_path / "release"
    with daemons(tmp_path) as started:
        dead = listener(started, tmp_path, server.url, "tests.jobs:hold")
        held = queue.enqueue(json.dumps({"marker": str(marker), "release": str(release)}),
                             max_attempts=2)
        wait_until(lambda: marker.exists(), what="the run started")
        child = admin.get_task(held).pid
        assert child is not None
        dead.kill()
        os.killpg(child, signal.SIGKILL)  # its run dies with it: nothing left to adopt
        due = queue.schedule("{}", delay=0.5)
        scheduler = Daemon([sys.executable, "-m", "blueque.cli", "scheduler", "--url",
                            users("scheduler"), "--interval", "0.2", "--recovery-interval",
                            "0.5"], tmp_path / "scheduler.log")
        started.append(scheduler)
        wait_until(lambda: admin.get_task(due).status == "pending", what="the due task moved")
        wait_until(lambda: admin.get_task(held).status in ("pending", "scheduled"),
                   timeout=30, what="the dead listener's task recovered")
        assert scheduler.alive() and "NOPERM" not in scheduler.log(), scheduler.log()


def test_the_inspector_line_reads_everything_and_writes_nothing(
        server: RedisServer, users: Users, tmp_path: Path) -> None:
    admin = blueque.Client(server.url)
    task_id = admin.get_queue("work").enqueue('{"value": 1}')
    with daemons(tmp_path) as started:
        listener(started, tmp_path, server.url)
        admin.get_task(task_id).wait(30)
    url = users("inspector")
    for arguments in (("status",), ("status", "--json"), ("tasks", "work"), ("show", task_id),
                      ("logs", task_id), ("wait", task_id, "--timeout", "10s")):
        done = cli(url, *arguments)
        assert done.returncode == 0, (arguments, done.stderr)
    refused = cli(url, "enqueue", "work", "{}")
    assert refused.returncode == 2 and "may not run what the client role needs" in \
        refused.stderr, refused.stderr
    assert admin.get_queue("work").stats().pending == 0


def test_the_operator_line_runs_the_operator_s_commands(server: RedisServer, users: Users
                                                        ) -> None:
    admin = blueque.Client(server.url)
    queue = admin.get_queue("work")
    scheduled = queue.schedule("{}", delay=3600)
    url = users("operator")
    for arguments in (("configure", "work", "--max-attempts", "3"), ("cancel", scheduled),
                      ("retry", scheduled), ("purge", "work", "--older-than", "0s"),
                      ("preempt", "--node", "n1", "--grace", "1h"),
                      ("preempt", "--node", "n1", "--withdraw")):
        done = cli(url, *arguments)
        assert done.returncode == 0, (arguments, done.stderr)
    assert admin.get_task(scheduled).status == "pending"  # retried after its cancel


def test_an_enqueue_whose_user_lacks_the_channel_writes_nothing_and_exits_2(
        server: RedisServer, users: Users) -> None:
    """The issue's case: the channel (Redis 7 gives new users none)."""
    url = users("client", drop=("&blueque_*",))
    done = cli(url, "enqueue", "work", "{}")
    assert done.returncode == 2, done
    assert "PUBLISH (This user has no permissions to access the 'blueque_channel_work' " \
           "channel)" in done.stderr, done.stderr
    assert "nothing was written" in done.stderr
    admin = redis.Redis(port=server.port, decode_responses=True)
    assert admin.keys("blueque_task_*") == [] and admin.llen(KEYS.pending("work")) == 0


def test_without_acl_dryrun_a_refused_enqueue_still_writes_nothing(
        server: RedisServer, users: Users) -> None:
    """The fallback: a user that may not ask ACL DRYRUN is not checked up front; the submit
    script publishes before it writes, so the refusal (NOPERM) leaves nothing behind, and is
    said as a permission (exit 2), never as a failure after the fact."""
    url = users("client", drop=("&blueque_*", "+acl|dryrun"))
    done = cli(url, "enqueue", "work", "{}")
    assert done.returncode == 2, done
    assert "refused a command to this user" in done.stderr, done.stderr
    assert "can't publish to the channel" in done.stderr, done.stderr
    admin = redis.Redis(port=server.port, decode_responses=True)
    assert admin.keys("blueque_task_*") == [] and admin.llen(KEYS.pending("work")) == 0
    with pytest.raises(PermissionRefused):
        blueque.Client(url).get_queue("work").enqueue("{}")
    assert admin.keys("blueque_task_*") == []


def test_a_listener_whose_user_lacks_one_command_refuses_at_start_and_takes_nothing(
        server: RedisServer, users: Users, tmp_path: Path) -> None:
    admin = blueque.Client(server.url)
    task_id = admin.get_queue("work").enqueue("{}")
    with daemons(tmp_path) as started:
        daemon = listener(started, tmp_path, users("listener", drop=("+zadd",)))
        code = daemon.process.wait(30)
        assert code == 2, daemon.log()
        assert "ZADD (This user has no permissions to run the 'zadd' command)" in daemon.log()
    assert admin.get_task(task_id).status == "pending"  # not taken, not orphaned
    assert admin.get_queue("work").stats().reserved == 0


def test_a_listener_whose_user_lacks_subscribe_warns_and_runs_tasks_by_polling(
        server: RedisServer, users: Users, tmp_path: Path) -> None:
    """SUBSCRIBE only speeds a listener up (it polls without it, tests/listener/test_wakeups):
    the check warns of it, naming it, and the listener starts and runs the task."""
    admin = blueque.Client(server.url)
    task_id = admin.get_queue("work").enqueue("{}")
    with daemons(tmp_path) as started:
        daemon = listener(started, tmp_path, users("listener", drop=("+subscribe",)))
        wait_until(lambda: admin.get_task(task_id).status == "complete", timeout=30,
                   what="the task run by a listener without SUBSCRIBE")
        assert daemon.process.poll() is None, daemon.log()
        assert "SUBSCRIBE (This user has no permissions to run the 'subscribe' command)" \
            in daemon.log()
        assert "works without, more slowly" in daemon.log()
