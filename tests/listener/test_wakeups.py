"""How a listener is woken: an idle one picks up through pub/sub (also after a Redis restart,
and after a load balancer silently dropped its subscriber's connection), its subscriber never
writes into a closed wake pipe, and run() gives back the signal handlers it took."""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time

import pytest

import blueque
from blueque.daemon import ListenerDaemon
from blueque.daemon.options import ListenerOptions
from blueque.daemon.wakeup import Inbox
from blueque.keys import Keys
from blueque.preemption import NodePreemption
from blueque.testing import RedisServer
from tests import jobs
from tests.daemons import Daemon, daemons, listen_command, subscribed, wait_until
from tests.fake_servers import FreezingProxy

pytestmark = pytest.mark.slow

KEYS = Keys()


def test_idle_two_queue_listener_picks_up_through_pubsub(client, start, redis_client):  # type: ignore[no-untyped-def]
    # poll and interval of a minute: only the enqueue's PUBLISH can wake it within the wait
    daemon = start("first,second", "tests.jobs:text", "--poll", "60", "--interval", "60")
    wait_until(lambda: subscribed(redis_client, "first") and subscribed(redis_client, "second"),
               what="subscribed to both channels")
    warm = client.get_queue("first").enqueue("warm-up")
    client.get_task(warm).wait(15)  # its first timers have run; now it idles in select()
    idle_from = time.monotonic()
    wait_until(lambda: time.monotonic() - idle_from > 1.0, what="a second of idling")
    latencies = {}
    for name in ("second", "first"):
        begun = time.monotonic()
        task_id = client.get_queue(name).enqueue(f"to {name}")
        task = client.get_task(task_id).wait(15)  # far below the 60 s poll
        latencies[name] = time.monotonic() - begun
        assert task.status == "complete" and task.result == f"processed to {name}"
    print("\nidle 2-queue pickup to complete: " + ", ".join(
        f"{name} {seconds * 1000:.1f} ms" for name, seconds in latencies.items()))
    assert daemon.alive()


def test_pubsub_pickup_resumes_after_a_redis_restart(tmp_path):  # type: ignore[no-untyped-def]
    server = RedisServer(directory=str(tmp_path),
                         extra_args=("--appendonly", "yes", "--appendfsync", "always"))
    server.start()
    try:
        with daemons(tmp_path) as running:
            daemon = Daemon(listen_command(server.url, "first,second", "tests.jobs:text",
                                           "--poll", "60", "--interval", "60"),
                            tmp_path / "daemon.log")
            running.append(daemon)
            watcher = blueque.Client(server.url)
            wait_until(lambda: subscribed(watcher.redis, "second"), what="subscribed")
            server.kill()
            server.start()
            wait_until(lambda: subscribed(watcher.redis, "second"), timeout=30,
                       what="subscribed again after the restart")
            begun = time.monotonic()
            task_id = watcher.get_queue("second").enqueue("after the restart")
            assert watcher.get_task(task_id).wait(15).status == "complete"  # not the 60 s poll
            print(f"\npickup after a Redis restart: {(time.monotonic() - begun) * 1000:.1f} ms")
            assert daemon.alive()
    finally:
        server.stop()


def test_subscriber_notices_a_silently_dropped_connection(redis_server, redis_client):  # type: ignore[no-untyped-def]
    """Cloud load balancers and NATs drop idle connections without a word; the subscriber
    must notice (PING after an interval of silence, no reply within another) and subscribe
    again, or wakeups are lost and pickups fall back to --poll for good."""
    proxy = FreezingProxy(redis_server.port)
    client = blueque.Client(f"redis://127.0.0.1:{proxy.port}/0")
    daemon = ListenerDaemon(client, ListenerOptions(
        {"work": 1}, jobs.text, identity="nat.example_1", interval=0.5))
    try:
        daemon.step.start_subscriber()
        wait_until(lambda: subscribed(redis_client, "work"), what="subscribed")
        proxy.freeze()
        wait_until(lambda: dict(redis_client.pubsub_numsub(KEYS.channel("work")))[
            KEYS.channel("work")] == 2, timeout=10, what="subscribed again on a new connection")
        while True:  # empty the wake pipe, then show a publish reaches it again
            try:
                os.read(daemon.step.wakeup._wake_r, 512)
            except BlockingIOError:
                break
        redis_client.publish(KEYS.channel("work"), "work")
        wait_until(lambda: select.select([daemon.step.wakeup._wake_r], [], [], 0)[0], what="woken")
    finally:
        daemon._finish()
        proxy.close()
        client.close()


def test_subscriber_never_writes_to_a_closed_wake_pipe(client, redis_client):  # type: ignore[no-untyped-def]
    """The subscriber thread outlives the loop by up to a second; a message in that second
    must not be written into whatever file reuses the wake pipe's descriptor numbers."""
    daemon = ListenerDaemon(client, ListenerOptions(
        {"work": 1}, jobs.text, identity="closer.example_1"))
    daemon.step.start_subscriber()
    thread = daemon.step.wakeup.subscriber
    assert thread is not None
    wait_until(lambda: subscribed(redis_client, "work"), what="subscribed")
    wake_w = daemon.step.wakeup._wake_w
    daemon._finish()
    reused_r, reused_w = os.pipe()  # the lowest free numbers: those just closed
    os.set_blocking(reused_r, False)
    try:
        if reused_w != wake_w:
            pytest.skip("the wake pipe's write descriptor was not reused")
        client.get_queue("work").enqueue("wakes the lingering subscriber")
        thread.join(10)
        assert not thread.is_alive()
        with pytest.raises(BlockingIOError):
            os.read(reused_r, 16)  # nothing was written into the new pipe
    finally:
        os.close(reused_r)
        os.close(reused_w)


def test_run_gives_back_the_signal_handlers_it_took(client):  # type: ignore[no-untyped-def]
    """ForkingRunner.run() is called in-process: once it returns, SIGINT and SIGTERM must act
    as before (not be swallowed by a stopped daemon) and no signal may write a byte into the
    closed signal pipe's descriptor number."""
    before = {signum: signal.getsignal(signum)
              for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
    daemon = ListenerDaemon(client, ListenerOptions(
        {"work": 1}, jobs.text, identity="signals.example_1", interval=0.5, poll=0.05))
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert daemon.run() == 0
    finally:
        timer.cancel()
        for signum, handler in before.items():
            if signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
                pytest.fail(f"{signal.Signals(signum).name} handler left installed")
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd left pointing at a closed pipe


def test_a_refused_subscriber_backs_off_and_the_listener_keeps_working(  # type: ignore[no-untyped-def]
        redis_server, redis_client, caplog):
    """An ACL that forbids SUBSCRIBE: the subscriber says so and tries again after a growing
    wait (not in a hot loop flooding the log); the listener still picks up, by polling."""
    user = f"nosub-{os.getpid()}"
    redis_client.acl_setuser(user, enabled=True, passwords=["+secret"], keys=["*"],
                             channels=["*"], commands=["+@all", "-subscribe"])
    client = blueque.Client(f"redis://{user}:secret@127.0.0.1:{redis_server.port}/0")
    daemon = ListenerDaemon(client, ListenerOptions(
        {"work": 1}, jobs.text, identity="refused.example_1", poll=0.2))
    caplog.set_level("WARNING", logger="blueque.daemon")
    try:
        daemon.step.start_subscriber()
        refusals = lambda: [r for r in caplog.records if "subscriber:" in r.getMessage()]  # noqa: E731
        wait_until(lambda: len(refusals()) >= 2, timeout=10, what="two refusals")
        first, second = refusals()[:2]
        assert "subscribe" in first.getMessage()
        assert second.created - first.created >= 0.4  # Backoff(1 s) with jitter: 0.5 s or more
        task_id = client.get_queue("work").enqueue("found by polling")
        deadline = time.monotonic() + 15
        while client.get_task(task_id).status != "complete" and time.monotonic() < deadline:
            daemon.step.run_once()
        assert client.get_task(task_id).result == "processed found by polling"
    finally:
        daemon._finish()
        client.close()
        redis_client.acl_deluser(user)


def test_the_inbox_sorts_what_the_channels_say(client: blueque.Client) -> None:
    """Enqueues only wake the loop; cancels (heard, or found by a renewal) are taken once, in
    order; a message on the node's preemption channel makes the next look read the request."""
    keys = client.store.keys
    preemption = NodePreemption(client.store, "node-a", "node-a_1", time.monotonic)
    preemption.heard = False
    inbox = Inbox(keys, "node-a_1", ["work", "mail"], preemption)
    assert inbox.channels == [keys.channel("work"), keys.channel("mail"),
                              keys.preemption_channel("node-a"), keys.control("node-a_1")]
    inbox.heard(keys.channel("work"), "an enqueue")
    assert inbox.cancels() == [] and not preemption.heard
    inbox.heard(keys.control("node-a_1"), "task-1")
    inbox.cancel(["task-2"])
    inbox.heard(keys.preemption_channel("node-a"), "requested")
    assert preemption.heard
    assert inbox.cancels() == ["task-1", "task-2"] and inbox.cancels() == []


def test_a_child_socket_numbered_past_1023_still_wakes_the_wait(client):  # type: ignore[no-untyped-def]
    """select() refuses descriptors past 1023 (ValueError: the listener died with 'filedescriptor
    out of range in select()'); a listener with many children, or a process that gave it many
    open files, has such numbers. The wait must hear a frame on one."""
    from blueque.reporting import ChildChannel

    daemon = ListenerDaemon(client, ListenerOptions(
        {"work": 1}, jobs.text, identity="many.example_1"))
    ours, theirs = socket.socketpair()
    high = 1500
    os.dup2(ours.fileno(), high)
    channel = ChildChannel(socket.socket(fileno=high))
    try:
        theirs.send(b"x")
        # an hour: only the readable socket can end this wait (pytest-timeout would fail it)
        daemon.step.wakeup.wait(3600.0, {high: channel})
        assert channel.sock.recv(1) == b"x"  # what woke it, left for the loop to read
    finally:
        channel.sock.close()
        ours.close()
        theirs.close()
        daemon._finish()
