"""A Redis that may evict Blueque's keys (issue 19 item 2): with ``maxmemory-policy
allkeys-lru`` 199 of 200 acknowledged tasks, the pending list and a listener's lease were
deleted and nothing warned. Real `blueque listen`, `scheduler` and `dashboard` processes refuse
to start on such a server unless told to accept it (and then warn); `blueque status` and the
dashboard say so; a server whose CONFIG is renamed is read through INFO memory."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis

import blueque
from blueque.cli.base import EXIT_OK, EXIT_USAGE
from blueque.errors import EvictingServer
from blueque.eviction import MemoryPolicy, check
from blueque.forking_runner import ForkingRunner
from blueque.testing import RedisServer
from blueque.web.app import POLICY_KEPT
from tests.daemons import FAST, ROOT, Daemon, listen_command, wait_until
from tests.dashboard import DashboardProcess, free_port

pytestmark = pytest.mark.slow

REFUSED = ("maxmemory-policy allkeys-lru", "CONFIG SET maxmemory-policy noeviction",
           "--allow-eviction", "BLUEQUE_ALLOW_EVICTION=1")
WARNED = "although its maxmemory-policy is allkeys-lru"


def command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "blueque.cli", *arguments]


def start(started: list[Daemon], tmp_path: Path, arguments: list[str],
          env: dict[str, str] | None = None) -> Daemon:
    daemon = Daemon(arguments, tmp_path / f"process{len(started)}.log",
                    env={"BLUEQUE_ALLOW_EVICTION": "", **(env or {})})
    started.append(daemon)
    return daemon


def refused(daemon: Daemon) -> str:
    """The daemon exited with the usage code; its log (the message it printed)."""
    assert daemon.process.wait(30) == EXIT_USAGE, daemon.log()
    return daemon.log()


@pytest.mark.parametrize("role", ["listen", "scheduler", "dashboard"])
def test_daemons_refuse_an_evicting_redis_and_start_when_told(
        role: str, evicting_server: RedisServer, tmp_path: Path, started: list[Daemon]) -> None:
    url, port = evicting_server.url, free_port()
    arguments = {
        "listen": listen_command(url, "work", "tests.jobs:echo", *FAST),
        "scheduler": command("scheduler", "--url", url, "--interval", "0.2"),
        "dashboard": command("dashboard", "--url", url, "--port", str(port)),
    }[role]
    log = refused(start(started, tmp_path, arguments))
    for words in REFUSED:
        assert words in log, log
    assert "Traceback" not in log

    def ready(daemon: Daemon) -> bool:
        if role != "dashboard" or WARNED not in daemon.log():
            return WARNED in daemon.log()
        try:  # it takes SIGTERM as a stop once it serves
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2):
                return True
        except OSError:
            return False

    for how, env in (("flag", {}), ("environment", {"BLUEQUE_ALLOW_EVICTION": "1"})):
        daemon = start(started, tmp_path, arguments + (["--allow-eviction"] if how == "flag"
                                                        else []), env)
        wait_until(lambda d=daemon: ready(d) or not d.alive(), timeout=30,  # type: ignore[misc]
                   what=f"the {role} started ({how})")
        assert daemon.alive(), daemon.log()
        # uvicorn raises a SIGTERM again once it has shut the dashboard down
        assert daemon.stop() in ((EXIT_OK, -signal.SIGTERM) if role == "dashboard"
                                 else (EXIT_OK,))


def test_the_listener_started_with_the_flag_runs_tasks(evicting_server: RedisServer,
                                                       tmp_path: Path,
                                                       started: list[Daemon]) -> None:
    start(started, tmp_path, listen_command(evicting_server.url, "work", "tests.jobs:echo",
                                            *FAST, "--allow-eviction"))
    client = blueque.Client(evicting_server.url)
    task_id = client.get_queue("work").enqueue(json.dumps({"value": 7}))
    assert client.get_task(task_id).wait(30).result == "7"
    client.close()


def test_status_says_the_redis_may_evict(evicting_server: RedisServer,
                                         redis_url: str) -> None:
    def status(url: str, *options: str) -> str:
        done = subprocess.run(command("status", "--url", url, *options), cwd=ROOT,
                              capture_output=True, text=True, timeout=60,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert done.returncode == EXIT_OK, done.stderr
        return done.stdout

    text = status(evicting_server.url)
    assert "maxmemory-policy allkeys-lru (maxmemory 64.0 MiB)" in text, text
    assert "WARNING" in text and "CONFIG SET maxmemory-policy noeviction" in text
    data = json.loads(status(evicting_server.url, "--json"))["redis"]
    assert (data["maxmemory_policy"], data["maxmemory"], data["evicts"], data["source"]) == (
        "allkeys-lru", 64 * 1024 * 1024, True, "CONFIG GET")
    assert "acknowledged tasks" in data["warning"]

    safe = status(redis_url)
    assert "maxmemory-policy noeviction (maxmemory 0: no limit)" in safe, safe
    assert "WARNING" not in safe and "makes it evict" not in safe
    assert json.loads(status(redis_url, "--json"))["redis"]["evicts"] is False


@pytest.mark.parametrize(("policy", "maxmemory", "said"), [
    # a noeviction server never evicts, whatever CONFIG SET maxmemory: it refuses writes
    ("noeviction", 0, "maxmemory-policy noeviction (maxmemory 0: no limit)"),
    ("noeviction", 1 << 28,
     "maxmemory-policy noeviction (maxmemory 256.0 MiB: when full it refuses writes)"),
    ("allkeys-lru", 0, "(maxmemory 0: no limit yet, but one CONFIG SET maxmemory makes it "
                       "evict). WARNING"),
])
def test_what_status_says_of_each_policy_and_limit(policy: str, maxmemory: int,
                                                     said: str) -> None:
    """`blueque status` said a noeviction server "makes it evict" after one CONFIG SET:
    only a policy that evicts does."""
    summary = MemoryPolicy("r:6379", policy, maxmemory, "CONFIG GET").summary()
    assert said in summary
    assert ("makes it evict" in summary) == (policy != "noeviction" and maxmemory == 0)


def test_the_dashboard_shows_the_warning_on_every_page(evicting_server: RedisServer,
                                                       tmp_path: Path) -> None:
    dashboard = DashboardProcess(evicting_server.url, tmp_path / "dashboard.log",
                                 options=("--allow-eviction",))
    try:
        for path in ("/", "/nodes", "/schedule", "/task?id=nothing"):
            try:
                with urllib.request.urlopen(dashboard.url + path, timeout=10) as response:
                    page = response.read().decode()
            except urllib.error.HTTPError as error:  # a missing task is a 404 page
                page = error.read().decode()
            assert "Redis may delete Blueque's tasks." in page, path
            assert "<code>allkeys-lru</code>" in page
        redis.Redis.from_url(evicting_server.url).config_set("maxmemory-policy", "noeviction")

        def warned() -> bool:
            with urllib.request.urlopen(dashboard.url + "/", timeout=10) as response:
                return "Redis may delete" in response.read().decode()

        wait_until(lambda: not warned(), timeout=POLICY_KEPT + 10,
                   what="the warning gone once the policy is noeviction")
    finally:
        dashboard.close()


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-ttl", "allkeys-lfu"])
def test_every_policy_but_noeviction_is_refused(policy: str, evicting_server: RedisServer,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """ForkingRunner.run (blueque 1.0.1's API) is a listener daemon: it refuses too."""
    monkeypatch.delenv("BLUEQUE_ALLOW_EVICTION", raising=False)
    redis.Redis.from_url(evicting_server.url).config_set("maxmemory-policy", policy)
    client = blueque.Client(evicting_server.url)
    daemon = ForkingRunner(client, "work", lambda task: "")
    with pytest.raises(EvictingServer, match=f"maxmemory-policy {policy}"):
        daemon.run()
    client.close()


def test_a_renamed_config_command_is_read_through_info(tmp_path: Path,
                                                        started: list[Daemon]) -> None:
    with RedisServer(extra_args=("--rename-command", "CONFIG", "",
                                 "--maxmemory-policy", "allkeys-lru")) as server:
        client = blueque.Client(server.url)
        policy = client.store.memory_policy()
        assert (policy.policy, policy.source, policy.evicts) == ("allkeys-lru", "INFO memory",
                                                                 True)
        log = refused(start(started, tmp_path,
                            listen_command(server.url, "work", "tests.jobs:echo", *FAST)))
        assert "maxmemory-policy allkeys-lru" in log
        client.close()


def test_config_refused_by_an_acl_is_read_through_info(tmp_path: Path,
                                                       started: list[Daemon]) -> None:
    """Managed Redis services refuse CONFIG to their users (an ACL): INFO memory says it."""
    with RedisServer(extra_args=("--maxmemory-policy", "volatile-lru")) as server:
        admin = redis.Redis.from_url(server.url, decode_responses=True)
        admin.execute_command("ACL", "SETUSER", "worker", "on", ">secret", "~*", "&*", "+@all",
                              "-config")
        url = f"redis://worker:secret@127.0.0.1:{server.port}/0"
        with pytest.raises(redis.exceptions.NoPermissionError):
            redis.Redis.from_url(url).config_get("maxmemory-policy")
        log = refused(start(started, tmp_path, listen_command(url, "work", "tests.jobs:echo",
                                                              *FAST)))
        assert "maxmemory-policy volatile-lru" in log and "keys with a TTL" in log, log
        admin.close()


def test_a_policy_nobody_tells_is_said_once_and_the_daemon_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    """Neither CONFIG GET nor INFO memory said (a Redis-compatible server): a warning, no
    refusal. (A real Redis always answers INFO memory where it answers INFO server, which
    every Blueque daemon needs: this reading comes from other servers.)"""
    unknown = MemoryPolicy("proxy:6379", None, why="CONFIG GET: unknown command; INFO memory "
                                                   "did not say")
    with caplog.at_level(logging.WARNING, "tests"):
        check(unknown, "listener", None, logging.getLogger("tests"))
    assert [r.getMessage() for r in caplog.records] == [
        "listener: cannot tell whether Redis proxy:6379 may evict Blueque's keys (CONFIG GET: "
        "unknown command; INFO memory did not say); make sure its maxmemory-policy is "
        "noeviction"]
    assert not unknown.evicts and "unknown" in unknown.summary()
