"""A Redis that refuses writes (out of memory, cannot persist) is an outage, not a death
(issue 19 item 1, PROTOCOL.md 6.5): real `blueque listen` daemons, real task processes and a
real redis-server made to refuse writes. Listeners keep their runs, take no task, hold each
ending (in memory and in the node's spool) until Redis takes it; callers get an error that
names the cause."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

import blueque
import blueque.aio
from blueque.errors import WritesRefused
from blueque.spool import Held, Spool, server_of
from blueque.testing import RedisServer
from tests.aio_facade import AioClient, LoopThread
from tests.daemons import FAST, ROOT, Daemon, daemons, lines, listen_command, wait_until
from tests.refusals import SERVER_ARGS, Kind, Refusal, fill, tmpfs

pytestmark = pytest.mark.slow

CAUSES: dict[Kind, str] = {
    "out of memory": "Redis is out of memory (maxmemory reached, maxmemory-policy noeviction)",
    "cannot persist": "Redis cannot persist (disk full, or an AOF/RDB write error)",
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    with RedisServer(directory=str(tmp_path / "redis"), extra_args=SERVER_ARGS) as started:
        yield started


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4-MiB tmpfs of the test's own, to put an append-only file on and fill (root only)."""
    with tmpfs(tmp_path / "disk", "4m") as where:
        yield where


def listener(started: list[Daemon], tmp_path: Path, url: str, *options: str) -> Daemon:
    daemon = Daemon(listen_command(url, "work", "tests.jobs:hold", *FAST, "--spool-dir",
                                   str(tmp_path / "spool"), *options),
                    tmp_path / f"daemon{len(started)}.log")
    started.append(daemon)
    return daemon


def spooled(tmp_path: Path) -> list[str]:
    spool = tmp_path / "spool"
    return sorted(p.name for p in spool.iterdir()) if spool.exists() else []


def starts(marker: Path) -> list[str]:
    return [line for line in lines(marker) if line.startswith("start")]


@pytest.mark.parametrize("kind", ["cannot persist", "out of memory"])
def test_a_listener_keeps_its_run_through_refused_writes_and_records_it_once(
        server: RedisServer, tmp_path: Path, kind: Kind) -> None:
    """On main the listener exited at the first refusal ("Redis refused a Blueque command:
    MISCONF ...", exit 1) and the run's outcome was lost: a max_attempts=1 task ended failed,
    or ran again. Now it waits, holds the ending, and records it once writes are taken."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    client = blueque.Client(server.url)
    refusal = Refusal(server)
    with daemons(tmp_path) as started:
        daemon = listener(started, tmp_path, server.url)
        task_id = client.get_queue("work").enqueue(
            json.dumps({"marker": str(marker), "release": str(release)}), max_attempts=1)
        wait_until(lambda: len(starts(marker)) == 1, what="the task started")
        refusal.refuse(kind)
        wait_until(lambda: CAUSES[kind] in daemon.log(), what="the outage logged")
        release.touch()  # the task ends while Redis refuses writes
        if kind == "cannot persist":  # every write refused: its outcome is held
            wait_until(lambda: spooled(tmp_path) == [f"1-{task_id}.json"],
                       what="ending spooled")
            assert client.get_task(task_id).status == "started"  # reads still work
        # (out of memory: finish.lua's first write frees memory, so Redis lets it record)
        wait_until(lambda: len(lines(marker)) == 2, what="the task ended")
        assert daemon.alive(), daemon.log()
        refusal.free()
        wait_until(lambda: client.get_task(task_id).status == "complete",
                   what="the held outcome recorded")
        wait_until(lambda: spooled(tmp_path) == [], what="the spool emptied")
        wait_until(lambda: "Redis is back" in daemon.log(), what="the resumption logged")
        task = client.get_task(task_id)
        assert (task.result, task.attempts) == ("held", 1)
        assert len(starts(marker)) == 1 and daemon.alive()
        log = daemon.log()
        assert log.count(f"listener {daemon_id(log)}: {CAUSES[kind]}") == 1, log
        assert "Redis refused a Blueque command" not in log


def test_a_full_disk_under_the_append_only_file_is_waited_out(
        small_disk: Path, tmp_path: Path) -> None:
    """The issue's own scenario: the AOF on a disk that fills up (MISCONF Errors writing to
    the AOF file: No space left on device). The listener keeps its run, holds its ending, and
    records it once space is freed: the max_attempts=1 task ends complete, run once."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    server = RedisServer(directory=str(small_disk), extra_args=(
        "--appendonly", "yes", "--appendfsync", "everysec")).start()
    try:
        client = blueque.Client(server.url)
        admin = redis.Redis(port=server.port, decode_responses=True)
        with daemons(tmp_path) as started:
            daemon = listener(started, tmp_path, server.url)
            task_id = client.get_queue("work").enqueue(
                json.dumps({"marker": str(marker), "release": str(release)}), max_attempts=1)
            wait_until(lambda: len(starts(marker)) == 1, what="the task started")
            filler = fill(small_disk)

            def refused() -> bool:
                try:
                    admin.set("blueque_test_probe", "x" * 4096)
                except redis.exceptions.ResponseError as error:
                    return str(error).startswith("MISCONF")
                return False

            wait_until(refused, what="Redis refusing writes: its AOF cannot be written")
            release.touch()
            wait_until(lambda: spooled(tmp_path) == [f"1-{task_id}.json"], what="spooled")
            wait_until(lambda: CAUSES["cannot persist"] in daemon.log(), what="outage logged")
            assert daemon.alive() and client.get_task(task_id).status == "started"
            filler.unlink()
            wait_until(lambda: client.get_task(task_id).status == "complete", timeout=30,
                       what="the held outcome recorded once the disk has room")
            task = client.get_task(task_id)
            assert (task.result, task.attempts) == ("held", 1) and len(starts(marker)) == 1
            wait_until(lambda: spooled(tmp_path) == [], what="the spool emptied")
            assert daemon.alive() and daemon.log().count(CAUSES["cannot persist"]) == 1
    finally:
        server.stop()


def daemon_id(log: str) -> str:
    """The listener id its log names first ("listener [id]: ...")."""
    return log.split("listener ", 1)[1].split(":", 1)[0].split()[0]


def test_the_next_listener_records_an_ending_its_dead_predecessor_spooled(
        server: RedisServer, tmp_path: Path) -> None:
    """The listener is SIGKILLed while Redis is out of memory, the task ends meanwhile and its
    process (holding its outcome) is killed too: only the node's spool still has the ending.
    The next listener, started while writes are still refused, waits instead of exiting, and
    once they are taken records the spooled ending before any recovery could count the run's
    death against its only attempt."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    client = blueque.Client(server.url)
    refusal = Refusal(server)
    with daemons(tmp_path) as started:
        first = listener(started, tmp_path, server.url)
        task_id = client.get_queue("work").enqueue(
            json.dumps({"marker": str(marker), "release": str(release)}), max_attempts=1)
        wait_until(lambda: len(starts(marker)) == 1, what="the task started")
        child = client.get_task(task_id).pid
        assert child is not None
        refusal.refuse("cannot persist")
        first.kill()
        release.touch()  # ends with no listener: the task process records (and spools) itself
        wait_until(lambda: spooled(tmp_path) == [f"1-{task_id}.json"], what="ending spooled")
        os.killpg(child, signal.SIGKILL)
        second = listener(started, tmp_path, server.url)
        wait_until(lambda: "not started yet" in second.log(), what="the wait logged")
        assert second.alive(), second.log()
        refusal.free()
        wait_until(lambda: client.get_task(task_id).status == "complete",
                   what="the spooled ending recorded")
        task = client.get_task(task_id)
        assert (task.result, task.attempts) == ("held", 1)
        assert len(starts(marker)) == 1
        assert spooled(tmp_path) == []
        assert "spooled ending of attempt 1 recorded" in second.log()
        # and the new listener works
        other = client.get_queue("work").enqueue(
            json.dumps({"marker": str(marker), "release": str(release)}))
        assert client.get_task(other).wait(30).status == "complete"
        assert second.alive() and second.log().count("not started yet") == 1


@pytest.mark.parametrize("kind", ["cannot persist", "out of memory"])
def test_enqueue_raises_an_error_that_names_the_cause(
        server: RedisServer, kind: Kind, aio_loop: LoopThread) -> None:
    """On main: a generic BluequeError ("Redis refused a Blueque command: OOM ...")."""
    url = server.url + "?retry_deadline=0.3"
    refusal = Refusal(server)
    refusal.refuse(kind)
    try:
        with pytest.raises(WritesRefused, match=CAUSES[kind].replace("(", r"\(")
                           .replace(")", r"\)")):
            blueque.Client(url).get_queue("work").enqueue("{}")
        aio = AioClient(blueque.aio.Client(url), aio_loop)
        try:
            with pytest.raises(WritesRefused) as raised:
                aio.get_queue("work").enqueue("{}")
            assert raised.value.cause == CAUSES[kind]
        finally:
            aio.close()
        done = subprocess.run(
            [sys.executable, "-m", "blueque.cli", "enqueue", "work", "{}", "--url", url],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 3, done.stderr
        assert CAUSES[kind] in done.stderr
    finally:
        refusal.free()
    assert blueque.Client(url).get_queue("work").enqueue("{}")  # taken again


def test_the_spool_replays_its_own_servers_endings_and_keeps_what_it_cannot_read(
        client: blueque.Client, tmp_path: Path) -> None:
    """PROTOCOL.md 6.5: a replay records each ending through finish (a repeat changes
    nothing), removes its file, leaves another server's files alone and renames a file that
    is no spooled ending to .bad (never deleted)."""
    queue = client.get_queue("work")
    task_id = queue.enqueue("{}", max_attempts=1)
    listener = client.get_listener("work")
    task = listener.reserve()
    assert task is not None and task.id == task_id
    processor = client.get_processor(task)
    processor.start(os.getpid())
    spool = Spool(tmp_path / "spool")
    end = processor.run_end("complete", "from the spool", result_ttl_ms=None)
    assert spool.hold(Held(end, None, server_of(client.store)))
    elsewhere = replace(end, task_id="another", attempt=1)
    assert spool.hold(Held(elsewhere, None, "10.0.0.9:6379/0"))
    (tmp_path / "spool" / "9-junk.json").write_text("{not json")
    assert spool.replay(client.store) == 1
    assert client.get_task(task_id).status == "complete"
    assert client.get_task(task_id).result == "from the spool"
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == [
        "1-another.json", "9-junk.json.bad"]
    assert spool.hold(Held(end, None, server_of(client.store)))
    assert spool.replay(client.store) == 1  # a repeat: the same status, nothing changed
    assert client.get_task(task_id).attempts == 1
    assert not spool.path(task_id, 1).exists()
