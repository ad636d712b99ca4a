"""Redis restarts and transient server states, end to end: real `blueque listen` daemons, real
task processes and a real redis-server that is SIGKILLed and restarted from its AOF, or made
a replica. Running tasks must survive them (PROTOCOL.md 6 "Outages", 9 "Retry policy")."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import redis

import blueque
from blueque.errors import BluequeError, RedisUnavailable
from blueque.keys import Keys
from blueque.testing import RedisServer
from tests.daemons import (
    FAST,
    ROOT,
    Daemon,
    daemons,
    kill_session_children,
    listen_command,
    wait_until,
)

pytestmark = pytest.mark.slow

KEYS = Keys()


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


def cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "blueque.cli", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def listener(started: list[Daemon], tmp_path: Path, url: str, *options: str,
             function: str = "tests.jobs:keeps_reporting") -> Daemon:
    daemon = Daemon(listen_command(url, "work", function, *FAST, *options),
                    tmp_path / f"daemon{len(started)}.log")
    started.append(daemon)
    return daemon


def test_a_task_reporting_progress_survives_a_redis_restart(  # type: ignore[no-untyped-def]
        aof_server, tmp_path):
    """report_progress() never fails the task: while Redis is away it keeps the latest value
    (and returns at once), and sends it when Redis is back; start and finish ride it out."""
    marker, release, phase = tmp_path / "marker", tmp_path / "release", tmp_path / "phase"
    client = blueque.Client(aof_server.url)
    with daemons(tmp_path) as started:
        daemon = listener(started, tmp_path, aof_server.url)
        task_id = client.get_queue("work").enqueue(
            json.dumps({"marker": str(marker), "release": str(release), "phase": str(phase)}),
            max_attempts=3, retry_backoff=0.01)
        wait_until(lambda: client.get_task(task_id).progress_message == "phase none",
                   what="progress reported")
        child = client.get_task(task_id).pid
        aof_server.kill()
        phase.write_text("outage")
        # it reported during the outage and went on: nothing raised, nothing blocked it
        wait_until(lambda: "reported outage" in " ".join(lines(marker)), what="reported")
        aof_server.start()
        # the kept value reaches Redis while the task still runs
        wait_until(lambda: client.get_task(task_id).progress_message == "phase outage",
                   what="kept progress sent once Redis was back")
        assert client.get_task(task_id).status == "started"
        release.touch()
        task = client.get_task(task_id).wait(30)
        assert (task.status, task.result, task.attempts) == ("complete", "done", 1)
        assert [line.split()[:2] for line in lines(marker) if line.startswith("start")] == [
            ["start", "1"]]
        assert task.pid == child and daemon.alive()


def test_client_calls_ride_through_a_short_restart(aof_server, tmp_path):  # type: ignore[no-untyped-def]
    """enqueue, Task.wait, `blueque wait` and `blueque enqueue --wait` do not notice a
    restart shorter than retry_deadline (30 s by default)."""
    marker, release, phase = tmp_path / "marker", tmp_path / "release", tmp_path / "phase"
    params = json.dumps({"marker": str(marker), "release": str(release), "phase": str(phase)})
    client = blueque.Client(aof_server.url)
    queue = client.get_queue("work")
    watcher = redis.Redis(port=aof_server.port, decode_responses=True)
    with daemons(tmp_path) as started:
        listener(started, tmp_path, aof_server.url, "--concurrency", "3")
        first = queue.enqueue(params)
        waited: dict[str, object] = {}

        def wait_in_thread() -> None:
            try:
                waited["task"] = client.get_task(first).wait(60)
            except BaseException as error:  # the test reports it
                waited["error"] = error

        thread = threading.Thread(target=wait_in_thread)
        thread.start()
        waiting_cli = cli("wait", first, "--url", aof_server.url, "--timeout", "60")
        enqueue_cli = cli("enqueue", "work", params, "--url", aof_server.url, "--wait",
                          "--timeout", "60", "--json")
        channel = KEYS.done_channel("work")
        wait_until(lambda: dict(watcher.pubsub_numsub(channel))[channel] >= 3, timeout=30,
                   what="three waiters subscribed")
        wait_until(lambda: len(lines(marker)) == 2, what="both tasks running")
        aof_server.kill()
        enqueued: dict[str, object] = {}
        during = threading.Thread(target=lambda: enqueued.update(id=queue.enqueue(params)))
        during.start()  # retried until Redis is back
        time.sleep(2.0)  # the outage: Redis stays down for 2 s
        aof_server.start()
        during.join(30)
        release.touch()
        thread.join(60)
        assert "error" not in waited, waited.get("error")
        assert waited["task"].status == "complete"  # type: ignore[attr-defined]
        out, err = waiting_cli.communicate(timeout=60)
        assert waiting_cli.returncode == 0, err
        out, err = enqueue_cli.communicate(timeout=60)
        assert enqueue_cli.returncode == 0, err
        assert json.loads(out)["tasks"][0]["status"] == "complete"
        later = client.get_task(str(enqueued["id"])).wait(30)
        assert later.status == "complete"
    assert watcher.llen(KEYS.complete("work")) == 3  # one task per enqueue, none twice
    assert len([line for line in lines(marker) if line.startswith("start")]) == 3


def test_calls_raise_redis_unavailable_after_the_bound(aof_server, tmp_path):  # type: ignore[no-untyped-def]
    """Past retry_deadline every public call raises RedisUnavailable (a BluequeError), never a
    redis-py error: Task.wait, enqueue, the CLI's wait (exit 3)."""
    url = aof_server.url + "?retry_deadline=0.5"
    client = blueque.Client(url)
    task_id = client.get_queue("work").enqueue("{}")
    outcome: dict[str, BaseException] = {}

    def wait_in_thread() -> None:
        try:
            client.get_task(task_id).wait(60)
        except BaseException as error:  # the test inspects it
            outcome["error"] = error

    thread = threading.Thread(target=wait_in_thread)
    thread.start()
    waiting_cli = cli("wait", task_id, "--url", url, "--timeout", "60")
    watcher = redis.Redis(port=aof_server.port, decode_responses=True)
    channel = KEYS.done_channel("work")
    wait_until(lambda: dict(watcher.pubsub_numsub(channel))[channel] >= 2, timeout=30,
               what="two waiters subscribed")
    aof_server.kill()
    thread.join(30)
    assert isinstance(outcome.get("error"), RedisUnavailable), repr(outcome.get("error"))
    with pytest.raises(RedisUnavailable, match="unreachable"):
        client.get_queue("work").enqueue("{}")
    with pytest.raises(RedisUnavailable):
        client.get_task(task_id)
    _, err = waiting_cli.communicate(timeout=30)
    assert waiting_cli.returncode == 3 and "blueque: error:" in err and "Traceback" not in err


def test_listener_waits_out_a_server_made_replica(tmp_path):  # type: ignore[no-untyped-def]
    """A failover turns the listener's server into a replica (READONLY): the listener keeps
    running and resumes once the server is a master again; a client gets RedisUnavailable
    after its bound, on the CLI exit 3."""
    with RedisServer() as primary, RedisServer() as other, daemons(tmp_path) as started:
        admin = redis.Redis(port=primary.port, decode_responses=True)
        other_admin = redis.Redis(port=other.port, decode_responses=True)
        other_admin.replicaof("127.0.0.1", primary.port)
        client = blueque.Client(primary.url)
        queue = client.get_queue("work")
        daemon = listener(started, tmp_path, primary.url, function="tests.jobs:echo")
        scheduler = Daemon([sys.executable, "-m", "blueque.cli", "scheduler", "--url",
                            primary.url, "--interval", "0.2", "--cron", "beat=* * * * * *:beats"],
                           tmp_path / "scheduler.log")
        started.append(scheduler)
        assert client.get_task(queue.enqueue('{"value": 1}')).wait(30).status == "complete"
        wait_until(lambda: admin.hget(KEYS.cron(), "beat"), what="the scheduler firing")
        wait_until(lambda: other_admin.info("replication")["master_link_status"] == "up",
                   what="replica in sync")
        # the failover: the replica is promoted, the old master follows it (keeping the data)
        other_admin.replicaof("NO", "ONE")
        admin.replicaof("127.0.0.1", other.port)
        wait_until(lambda: "cannot serve Blueque right now (ReadOnlyError" in daemon.log(),
                   what="listener meets READONLY")
        wait_until(lambda: "cannot serve Blueque right now (ReadOnlyError" in scheduler.log(),
                   what="scheduler meets READONLY")
        short = blueque.Client(primary.url + "?retry_deadline=0.5")
        with pytest.raises(RedisUnavailable, match="read only replica"):
            short.get_queue("work").enqueue("{}")
        done = cli("enqueue", "work", "{}", "--url", primary.url + "?retry_deadline=0.5")
        _, err = done.communicate(timeout=30)
        assert done.returncode == 3 and "read only replica" in err, err
        assert daemon.alive(), daemon.log()
        assert scheduler.alive(), scheduler.log()
        admin.replicaof("NO", "ONE")  # back to a master
        task = client.get_task(queue.enqueue('{"value": 2}')).wait(30)
        assert task.status == "complete" and task.result == "2"
        beat = int(admin.hget(KEYS.cron(), "beat") or 0)
        wait_until(lambda: int(admin.hget(KEYS.cron(), "beat") or 0) > beat,
                   what="the scheduler firing again")
        assert daemon.alive() and scheduler.alive()
        assert "Traceback" not in daemon.log() + scheduler.log()


def test_a_restart_longer_than_a_lease_kills_no_listener(  # type: ignore[no-untyped-def]
        aof_server, tmp_path):
    """Four listeners on four nodes (interval 0.5 s: 1-s leases) each run a task; Redis is
    SIGKILLed for 4 s, and one node dies meanwhile. After the restart no live listener is
    taken for dead: their tasks run once, their processes are never stopped; the dead
    node's task is taken back (by a listener started after the restart) and runs again."""
    marker, release, phase = tmp_path / "marker", tmp_path / "release", tmp_path / "phase"
    client = blueque.Client(aof_server.url)
    queue = client.get_queue("work")
    watcher = redis.Redis(port=aof_server.port, decode_responses=True)
    with daemons(tmp_path) as started:
        nodes = [listener(started, tmp_path, aof_server.url, "--identity", f"node{n}.example_{n}")
                 for n in range(4)]
        wait_until(lambda: len(watcher.smembers(KEYS.listeners("work"))) == 4,
                   what="four listeners")
        ids = [queue.enqueue(json.dumps({"marker": str(marker), "release": str(release),
                                         "phase": str(phase), "n": n}),
                             max_attempts=2, retry_backoff=0.01) for n in range(4)]
        wait_until(lambda: all(client.get_task(i).status == "started" for i in ids),
                   what="four tasks running")
        # "started" is recorded before the task function runs: killed before it wrote its
        # start mark, the doomed run would be missing from the count below (seen under load)
        wait_until(lambda: sum(line.startswith("start") for line in lines(marker)) == 4,
                   what="four start marks")
        tasks = {i: client.get_task(i) for i in ids}
        assert len({t.node for t in tasks.values()}) == 4  # one per node
        doomed = next(i for i, t in tasks.items() if t.node == "node3.example_3")
        survivors = {i: t.pid for i, t in tasks.items() if i != doomed}
        aof_server.kill()
        outage_started = time.monotonic()
        nodes[3].kill()  # a node dies during the outage, with its task process
        kill_session_children([tasks[doomed].pid or 0])
        wait_until(lambda: all("unreachable" in d.log() for d in nodes[:3]),
                   what="every listener noticed the outage")
        time.sleep(max(0.0, 4.0 - (time.monotonic() - outage_started)))  # 4 s: 4 leases
        aof_server.start()
        # each live listener ran a whole step (renewal, heal, sweep) after the restart
        wait_until(lambda: all("Redis is back" in d.log() for d in nodes[:3]),
                   what="every listener back")
        late = listener(started, tmp_path, aof_server.url, "--identity", "late.example_9")
        wait_until(lambda: client.get_task(doomed).attempts == 2, timeout=40,
                   what="the dead node's task taken back after the restart")
        release.touch()
        for task_id in ids:
            assert client.get_task(task_id).wait(30).status == "complete"
        for task_id, pid in survivors.items():
            task = client.get_task(task_id)
            assert task.attempts == 1 and task.pid == pid and task.error is None
        starts = [line.split()[1] for line in lines(marker) if line.startswith("start")]
        assert sorted(starts) == ["1", "1", "1", "1", "2"]  # only the dead node's ran again
        assert len([line for line in lines(marker) if line.startswith("end")]) == 4
        for daemon in nodes[:3]:
            assert daemon.alive()
            assert "superseded" not in daemon.log() and "lost its lease" not in daemon.log()
            assert "recovered listener" not in daemon.log()
        # its first attempt's ending (the dead listener's) is in its history
        assert "node3.example_3" in client.get_task(doomed).history[0]["error"]
        assert late.alive()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in survivors.values())


def test_every_public_error_is_a_blueque_error() -> None:
    """The classes a caller catches: RedisUnavailable and the wait timeout are BluequeErrors
    and keep the builtin classes they were before."""
    assert issubclass(RedisUnavailable, BluequeError) and issubclass(RedisUnavailable,
                                                                    ConnectionError)
    assert issubclass(blueque.WaitTimeout, BluequeError)
    assert issubclass(blueque.WaitTimeout, TimeoutError)


class LosingProxy:
    """A TCP proxy in front of a redis-server that can lose one reply: once armed, the first
    command whose bytes contain ``token`` is passed on (so Redis runs it) but its reply is
    swallowed and the client's connection closed, as a failover or a cut cable does."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.token: bytes | None = None
        self.lost = 0
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """The network between the proxy's clients and Redis goes: every connection drops and
        new ones are refused, until restore()."""
        self.listener.close()
        for connection in self.connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, token: str) -> None:
        self.token = token.encode()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.connections += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False),
                             daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, requests: bool) -> None:
        seen = b""  # the end of the bytes before: a command may arrive in several pieces
        try:
            while data := source.recv(65536):
                target.sendall(data)
                seen = seen[-256:] + data
                if requests and self.token is not None and self.token in seen:
                    self.token = None
                    self.lost += 1
                    time.sleep(0.2)  # Redis runs it; its reply is then thrown away with us
                    source.close()
                    target.close()
                    return
        except OSError:
            pass
        finally:
            for end in (source, target):
                with contextlib.suppress(OSError):
                    end.close()

    def close(self) -> None:
        self.listener.close()


def test_writes_repeated_after_a_lost_reply_say_what_they_did(redis_server, redis_client):  # type: ignore[no-untyped-def]
    """Each write whose reply is lost is repeated by the retry policy; the repeat reports what
    the first try did: the enqueue created the task (once), the cancel cancelled it, the
    operator's retry made the failed task pending (once)."""
    proxy = LosingProxy(redis_server.port)
    try:
        client = blueque.Client(f"redis://127.0.0.1:{proxy.port}/0", retry_deadline=10)
        queue = client.get_queue("lossy")
        queue.enqueue("warm up the script cache")
        proxy.arm("lose-this-enqueue")
        task_id = queue.enqueue("lose-this-enqueue")
        assert proxy.lost == 1 and task_id.created  # generated id: it was ours
        assert redis_client.lrange(KEYS.pending("lossy"), 0, -1).count(task_id) == 1
        proxy.arm("lose-this-named-one")
        named = queue.enqueue("lose-this-named-one", task_id="named-1")
        assert proxy.lost == 2 and named.created
        again = queue.enqueue("lose-this-named-one", task_id="named-1")
        assert not again.created  # a later enqueue of the id is still told apart
        proxy.arm(f"{task_id}\r\n$")  # the id as an argument of cancel's script call
        assert client.cancel_task(task_id, "lost reply") == "cancelled"
        assert proxy.lost == 3
        assert client.get_task(task_id).status == "failed"
        listener = client.get_listener("lossy")
        reserved = listener.reserve()
        assert reserved is not None and reserved.id != task_id
        processor = client.get_processor(reserved)
        processor.start(os.getpid())
        processor.fail("broken")
        proxy.arm(str(reserved.id) + "\r\n$")  # the id as an argument of the script call
        client.store.retry_failed("lossy", reserved.id, time.time())
        assert proxy.lost == 4
        assert redis_client.lrange(KEYS.pending("lossy"), 0, -1).count(reserved.id) == 1
        assert client.get_task(reserved.id).status == "pending"
    finally:
        proxy.close()


def test_a_listener_cut_off_alone_is_recovered_after_its_lease(  # type: ignore[no-untyped-def]
        redis_server, redis_client, tmp_path):
    """Redis stays up and only one listener loses it (its network is cut): that one IS taken
    for dead after its lease by a listener that still reaches Redis, and its task runs again
    there; back on the network, it finds its lease lost and stops its superseded run."""
    marker, release, phase = tmp_path / "marker", tmp_path / "release", tmp_path / "phase"
    proxy = LosingProxy(redis_server.port)
    db = redis_client.connection_pool.connection_kwargs.get("db", 0)
    direct = f"redis://127.0.0.1:{redis_server.port}/{db}"
    client = blueque.Client(direct)
    try:
        with daemons(tmp_path) as started:
            cut_off = listener(started, tmp_path, f"redis://127.0.0.1:{proxy.port}/{db}",
                               "--identity", "islanded.example_5")
            wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 1, what="listener")
            task_id = client.get_queue("work").enqueue(json.dumps(
                {"marker": str(marker), "release": str(release), "phase": str(phase)}),
                max_attempts=2, retry_backoff=0.01)
            wait_until(lambda: lines(marker), what="running on the listener to be cut off")
            first_pid = client.get_task(task_id).pid
            survivor = listener(started, tmp_path, direct, "--identity", "mainland.example_6")
            wait_until(lambda: redis_client.scard(KEYS.listeners("work")) == 2, what="two")
            proxy.cut()
            # lease 1 s, sweeps every 0.5 s: taken back within 3 intervals (plus start-up)
            wait_until(lambda: client.get_task(task_id).attempts == 2, timeout=10,
                       what="the cut-off listener's task taken back")
            wait_until(lambda: client.get_task(task_id).node == "mainland.example_6",
                       what="running on the survivor")
            proxy.restore()
            wait_until(lambda: "lost its lease" in cut_off.log(), timeout=20,
                       what="the cut-off listener back, its lease lost")
            wait_until(lambda: not psutil.pid_exists(first_pid)
                       or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE,
                       what="its superseded run stopped")
            release.touch()
            task = client.get_task(task_id).wait(30)
            assert task.status == "complete" and task.attempts == 2
            assert "islanded.example_5 stopped renewing its lease" in task.history[0]["error"]
            assert "recovered listener islanded.example_5" in survivor.log()
            assert cut_off.alive() and survivor.alive()
    finally:
        proxy.close()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0",
                                 "unix:///run/no-redis.sock?db=2"])
def test_every_plain_url_form_gets_the_retry_policy(url: str) -> None:
    """Issue 9: plain URLs ride out a restart as the Sentinel and Cluster forms do."""
    from blueque.retry import RetryPolicy

    client = blueque.Client(url)
    assert isinstance(client.store.retry, RetryPolicy)
    assert client.store.retry.deadline_s == 30.0
    shorter = blueque.Client(url + ("&" if "?" in url else "?") + "retry_deadline=2.5")
    assert isinstance(shorter.store.retry, RetryPolicy) and shorter.store.retry.deadline_s == 2.5
    assert not isinstance(blueque.Client(url, retry_deadline=0).store.retry, RetryPolicy)


def test_a_unix_socket_client_rides_through_a_restart(tmp_path: Path) -> None:
    """The same policy on a unix:// URL, end to end: an enqueue made while the server is
    down lands once it is back; with a short deadline the call raises RedisUnavailable."""
    socket_path = tmp_path / "redis.sock"
    (tmp_path / "redis").mkdir()
    server = RedisServer(extra_args=("--unixsocket", str(socket_path), "--appendonly", "yes",
                                     "--appendfsync", "always"),
                         directory=str(tmp_path / "redis"))
    server.start()
    try:
        client = blueque.Client(f"unix://{socket_path}?db=1")
        queue = client.get_queue("work")
        before = queue.enqueue("before")
        server.kill()
        with pytest.raises(RedisUnavailable):
            blueque.Client(f"unix://{socket_path}?db=1&retry_deadline=0.3").get_queue(
                "work").enqueue("never")
        enqueued: dict[str, str] = {}
        during = threading.Thread(target=lambda: enqueued.update(id=queue.enqueue("during")))
        during.start()  # retried until the server is back
        time.sleep(1.0)  # the outage: the server stays down for a second more
        server.start()
        during.join(30)
        assert [client.get_task(t).parameters for t in (before, enqueued["id"])] == [
            "before", "during"]
        direct = redis.Redis(port=server.port, db=1, decode_responses=True)
        assert direct.lrange(KEYS.pending("work"), 0, -1) == [enqueued["id"], before]
    finally:
        server.stop()


def test_every_public_call_raises_only_blueque_errors_when_redis_is_gone() -> None:
    """Issue 9: past retry_deadline each call of the public API raises RedisUnavailable
    (a BluequeError), whatever redis-py raised underneath: commands, scripts, pipelines,
    pub/sub (wait, listen) and a new client's first command."""
    from blueque.waiting import wait_all

    with RedisServer() as server:
        url = server.url + "?retry_deadline=0.2"
        client = blueque.Client(url)
        queue = client.get_queue("q")
        task_id = queue.enqueue("x")
        finished_id = queue.enqueue("done")
        listener = client.get_listener("q")
        task, finished = listener.reserve(), listener.reserve()
        assert task is not None and finished is not None and finished.id == finished_id
        processor = client.get_processor(task)
        client.get_processor(finished).start(os.getpid())
        client.get_processor(finished).complete("r")
        finished.refresh()
        server.kill()
        calls = {
            "enqueue": lambda: queue.enqueue("y"), "enqueue_many": lambda: queue.enqueue_many(
                ["a"]), "schedule": lambda: queue.schedule("a", eta=2e9),
            "stats": queue.stats, "configure": lambda: queue.configure(max_attempts=2),
            "config": queue.config, "purge": lambda: queue.purge("complete", 1),
            "enqueue_due_tasks": queue.enqueue_due_tasks,
            "task_ids": lambda: queue.task_ids("pending"),
            "delete_task": lambda: queue.delete_task(finished),
            "get_task": lambda: client.get_task(task_id).status, "refresh": task.refresh,
            "wait": lambda: client.get_task(task_id).wait(1), "wait_all": lambda: wait_all(
                client, [task_id], 1), "cancel_task": lambda: client.cancel_task(task_id),
            "queue_names": client.queue_names, "ping": client.ping,
            "listen": lambda: client.get_listener("q").listen(timeout=1),
            "reserve": listener.reserve, "claim_orphan": listener.claim_orphan,
            "close": listener.close, "start": lambda: processor.start(os.getpid()),
            "complete": lambda: processor.complete("r"), "fail": lambda: processor.fail("e"),
            "progress": lambda: processor.progress(0.5, "m"),
            "new client": lambda: blueque.Client(url).get_queue("q").stats(),
        }
        for name, call in calls.items():
            with pytest.raises(RedisUnavailable):
                call()
                pytest.fail(f"{name} returned with Redis gone")
