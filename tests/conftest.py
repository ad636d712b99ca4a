"""Shared fixtures: one private redis-server per test session, a clean database per test."""

from __future__ import annotations

import io
import json
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

import blueque
import blueque.aio
from blueque.cli import main as cli_main
from blueque.testing import RedisServer, free_port
from tests.aio_facade import AioClient, LoopThread
from tests.daemons import FAST, Daemon, daemons, listen_command
from tests.wheels import build_wheel


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker runs with SIGINT ignored (its controller alone hears Ctrl-C),
    and every process a test starts would inherit that: a listener, ``blueque status
    --watch`` or a ForkingRunner program could not be stopped by the SIGINT the test sends.
    The tests' processes get Python's default SIGINT, as under a plain pytest."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server on a free loopback port, stopped by pid at the end of the session."""
    with RedisServer(extra_args=("--databases", "64")) as server:
        yield server


@pytest.fixture
def aof_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server of the test's own that keeps every write in its append-only
    file (appendfsync always): SIGKILLed and started again, it has lost nothing. For the
    scenarios that take Redis away under real daemons."""
    (tmp_path / "redis").mkdir()
    server = RedisServer(extra_args=("--appendonly", "yes", "--appendfsync", "always"),
                         directory=str(tmp_path / "redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Daemon]]:
    """The daemons a test starts (tests.daemons.Daemon): append each one; every one still
    running at the end, and the task processes they left, are stopped by pid."""
    with daemons(tmp_path) as running:
        yield running


@pytest.fixture
def start(redis_url: str, tmp_path: Path, started: list[Daemon]) -> Callable[..., Daemon]:
    """``start(queues, function, *options)``: a `blueque listen` with the FAST options on the
    private database, stopped at the end as every daemon in ``started`` (tests/listener has
    its own, which adds no options and takes another ``url=``)."""

    def start_daemon(queues: str, function: str, *options: str) -> Daemon:
        log = tmp_path / f"daemon{len(started)}.log"
        daemon = Daemon(listen_command(redis_url, queues, function, *FAST, *options), log)
        started.append(daemon)
        return daemon

    return start_daemon


@pytest.fixture
def logs_dir(tmp_path: Path) -> Path:
    """Where the task-log tests' listeners write their task logs (--log-dir)."""
    return tmp_path / "task-logs"


@pytest.fixture
def start_logging(redis_url: str, started: list[Daemon], tmp_path: Path, logs_dir: Path
                  ) -> Callable[..., Daemon]:
    """``start_logging(function, *options)``: a `blueque listen` of queue "work" that writes
    its task logs under ``logs_dir`` (stopped at the end, as every daemon in ``started``)."""

    def start_daemon(function: str, *options: str) -> Daemon:
        command = listen_command(redis_url, "work", function, *FAST, "--log-dir", str(logs_dir),
                                 *options)
        daemon = Daemon(command, tmp_path / f"daemon{len(started)}.log")
        started.append(daemon)
        return daemon

    return start_daemon


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's wheel as pip builds it (tests.wheels.build_wheel: what an install
    gets), built once a session for the tests that read it."""
    with build_wheel(tmp_path_factory.mktemp("wheel")) as built:
        return Path(str(built.filename))


@pytest.fixture
def evicting_server() -> Iterator[RedisServer]:
    """A private redis-server of the test's own with ``maxmemory-policy allkeys-lru``: once
    full it deletes any key, which Blueque's daemons refuse to start on (blueque.eviction)."""
    with RedisServer(extra_args=("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
                     ) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the private server, whose database is emptied before each test."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def client(redis_client: redis.Redis) -> blueque.Client:
    """A Blueque client on the emptied private database."""
    return blueque.Client(redis_client)


@pytest.fixture(scope="session")
def aio_loop() -> Iterator[LoopThread]:
    """One event loop, in a thread, for the blocking facade over blueque.aio."""
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture
def aio_client(client: blueque.Client, redis_url: str, aio_loop: LoopThread
               ) -> Iterator[AioClient]:
    """blueque.aio.Client on the emptied private database, behind blueque.Client's surface
    (tests/aio_facade.py); ``client`` answers for the listener side and the Redis state."""
    facade = AioClient(blueque.aio.Client(redis_url), aio_loop, sync=client)
    yield facade
    facade.close()


def _sync_client(request: pytest.FixtureRequest, kind: str) -> Iterator[blueque.Client]:
    if kind == "redis":
        yield request.getfixturevalue("client")
        return
    fakeredis = pytest.importorskip("fakeredis")
    pytest.importorskip("lupa", reason="fakeredis runs Blueque's Lua scripts only with lupa")
    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    yield blueque.Client(fake)
    fake.close()


@pytest.fixture(params=["redis", "fakeredis"])
def any_client(request: pytest.FixtureRequest) -> Iterator[blueque.Client]:
    """The contract tests' client: on the private redis-server, and again on fakeredis (its
    Lua support needs ``lupa``; without it that variant is skipped, never weakened)."""
    yield from _sync_client(request, request.param)


@pytest.fixture(params=["redis", "fakeredis", "aio"])
def contract_client(request: pytest.FixtureRequest) -> Iterator[blueque.Client]:
    """The client of the contract tests of operations both clients offer (enqueue, cancel,
    tasks, delete, purge, stats...): ``any_client``'s two, and blueque.aio on the private
    redis-server through tests/aio_facade.py."""
    if request.param == "aio":
        yield request.getfixturevalue("aio_client")
        return
    yield from _sync_client(request, request.param)


@dataclass(frozen=True)
class Done:
    """What a `blueque` command run in-process did: the fields of
    subprocess.CompletedProcess the tests read (the return code is the exit code)."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def blueque_main(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
                 ) -> Callable[..., Done]:
    """``blueque_main(*argv, stdin=None)``: the `blueque` command as blueque.cli.main(argv)
    in this process, its stdout and stderr captured, with no $BLUEQUE_URL (a command given no
    --url must not reach the machine's Redis: it gets a closed port)."""
    monkeypatch.setenv("BLUEQUE_URL", f"redis://127.0.0.1:{free_port()}/0")

    def call(*argv: str, stdin: str | None = None) -> Done:
        capsys.readouterr()  # what earlier steps of the test printed is not this command's
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin or ""))
        code = cli_main(list(argv))
        out, err = capsys.readouterr()
        return Done(code, out, err)

    return call


#: blueque_main, run: ``(*arguments, stdin=None) -> Done``.
Run = Callable[..., Done]


@pytest.fixture
def run(blueque_main: Run, redis_url: str, redis_client: redis.Redis) -> Run:
    """``run(*arguments, stdin=None)``: the `blueque` command in-process against the emptied
    private database."""
    return lambda *arguments, stdin=None: blueque_main(*arguments, "--url", redis_url,
                                                       stdin=stdin)


@pytest.fixture
def run_json(run: Run) -> Callable[..., Any]:
    """``run_json(*arguments)``: the command's --json output, parsed (it must exit 0)."""

    def call(*arguments: str) -> Any:
        done = run(*arguments, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return call
