"""Times come from one clock: Redis' (issue 19 item 6, PROTOCOL.md §1 "Time").

A host whose clock is minutes off must neither run a delayed task early nor late, nor make a
listener look long dead in `blueque status`. The end-to-end tests run real daemons and CLI
commands under libfaketime (Debian's faketime package): their processes see a clock five
minutes fast, Redis and this test process the true one."""

from __future__ import annotations

import glob
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import blueque
from blueque.clock import RESYNC, RETRY, ServerClock
from tests.daemons import ROOT, Daemon, listen_command, wait_until
from tests.test_cli import environment

SKEW = 300.0  # seconds the skewed processes' clock is ahead


class FakeTime:
    def __init__(self) -> None:
        self.wall = 1_000_000.0
        self.mono = 50.0

    def local(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


def test_the_offset_is_taken_at_the_midpoint_of_the_round_trip() -> None:
    fake = FakeTime()
    clock = ServerClock(fake.local, fake.monotonic)
    assert clock.due() and not clock.synced and clock.now() == fake.wall  # the host's, at first
    clock.measured(before=1_000_000.0, server=1_000_300.5, after=1_000_001.0)
    assert clock.offset == pytest.approx(300.0)
    assert clock.now() == pytest.approx(1_000_300.0)
    assert clock.to_local(1_000_360.0) == pytest.approx(1_000_060.0)
    assert not clock.due()
    fake.mono += RESYNC
    assert clock.due()


def test_a_failed_measurement_keeps_the_last_offset_and_is_tried_again_soon() -> None:
    fake = FakeTime()
    clock = ServerClock(fake.local, fake.monotonic)
    clock.measured(1_000_000.0, 999_990.0, 1_000_000.0)
    fake.mono += RESYNC
    clock.failed()
    assert clock.offset == -10.0 and not clock.due()
    fake.mono += RETRY
    assert clock.due()


def test_store_now_is_redis_clock_whatever_the_host_says(client: blueque.Client) -> None:
    """A store whose host clock is five minutes fast still stamps tasks on Redis' clock."""
    store = client.store
    store.clock = ServerClock(local=lambda: time.time() + SKEW)
    server = store.server_time()
    assert abs(store.now() - server) < 1.0
    assert store.bounded(1.0).clock is store.clock  # one offset for the loop's copies too
    queue = client.get_queue("clock")
    in_a_minute = client.get_task(queue.schedule("{}", delay=60)).data
    at_an_instant = client.get_task(queue.schedule("{}", eta=server + 120)).data
    assert in_a_minute["status"] == "scheduled"
    assert abs(float(in_a_minute["created"]) - server) < 5.0
    assert abs(float(in_a_minute["eta"]) - (server + 60)) < 5.0
    assert float(at_an_instant["eta"]) == server + 120  # an instant is taken as given


def test_the_asyncio_store_reads_the_same_clock(aio_client: object, client: blueque.Client
                                               ) -> None:
    store = aio_client.aio.store  # type: ignore[attr-defined]
    store.clock = ServerClock(local=lambda: time.time() - SKEW)
    queue = aio_client.get_queue("clock-aio")  # type: ignore[attr-defined]
    task_id = queue.schedule("{}", delay=60)
    data = client.get_task(task_id).data
    server = client.store.server_time()
    assert abs(float(data["created"]) - server) < 5.0
    assert abs(float(data["eta"]) - (server + 60)) < 5.0


@pytest.mark.parametrize(("eta", "delay", "error"), [
    (None, None, "an eta (Unix time) or a delay"), (1.0, 2.0, "one of the two"),
    (None, -1.0, "0 seconds or more"), (None, float("nan"), "finite"),
    ("soon", None, "finite"), (None, True, "finite")])
def test_schedule_takes_an_eta_or_a_delay(client: blueque.Client, eta: object, delay: object,
                                          error: str) -> None:
    with pytest.raises(blueque.ConfigurationError, match=re.escape(error)):
        client.get_queue("clock").schedule("{}", eta, delay=delay)  # type: ignore[arg-type]
    assert client.get_queue("clock").stats().scheduled == 0


# --- end to end, with processes whose clock is five minutes fast ----------------------------
# (the three that wait out an eta or a backoff are slow: CI runs them; the fast run holds the
# rule itself in test_store_now_is_redis_clock_whatever_the_host_says)
def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found:
        pytest.skip("libfaketime is not installed (Debian: apt-get install faketime; ./dev "
                    "setup installs it)")
    return found[0]


def skewed() -> dict[str, str]:
    """The environment of a process whose wall clock is SKEW seconds fast (its monotonic clock
    is left alone, as NTP leaves it)."""
    return {"LD_PRELOAD": libfaketime(), "FAKETIME": f"+{int(SKEW)}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_NO_CACHE": "1"}


def test_the_skewed_environment_really_skews_a_process() -> None:
    """The tests below prove something only if their processes' clocks are off."""
    done = subprocess.run([sys.executable, "-c", "import time; print(time.time())"],
                          capture_output=True, text=True, check=True,
                          env={**environment(), **skewed()})
    assert float(done.stdout) - time.time() > SKEW - 10


def started_after(client: blueque.Client, task_id: str, timeout: float) -> float:
    """Seconds from now until the task started (waits up to ``timeout``)."""
    began = time.monotonic()
    wait_until(lambda: client.get_task(task_id).status in ("started", "complete"), timeout,
               f"task {task_id} to start")
    return time.monotonic() - began


@pytest.mark.slow
def test_a_fast_listener_does_not_run_a_scheduled_task_early(
        redis_url: str, client: blueque.Client, started: list[Daemon], tmp_path: Path) -> None:
    """Before: the listener moved due tasks by its own clock, five minutes early."""
    started.append(Daemon(listen_command(redis_url, "early", "tests.jobs:text",
                                       "--interval", "0.5"),
                        tmp_path / "fast.log", env=skewed()))
    wait_until(lambda: client.get_queue("early").stats().listeners == 1, 20,
               "the fast listener to register")
    due = time.time() + 4  # this process's clock is Redis' (both the machine's)
    task_id = client.get_queue("early").schedule("{}", eta=due)
    assert started_after(client, task_id, 60) >= 3.0
    wait_until(lambda: client.get_task(task_id).status == "complete", 20)
    data = client.get_task(task_id).data
    # every stamp on one clock: it started after it was due, by Redis' clock
    assert float(data["started_at"]) >= due - 0.1


@pytest.mark.slow
def test_a_delay_given_on_a_fast_host_is_kept(
        redis_url: str, client: blueque.Client, started: list[Daemon], tmp_path: Path) -> None:
    """Before: `blueque enqueue --delay 2` on a host five minutes fast ran five minutes late."""
    started.append(Daemon(listen_command(redis_url, "late", "tests.jobs:text",
                                       "--interval", "0.5"),
                        tmp_path / "true.log"))
    wait_until(lambda: client.get_queue("late").stats().listeners == 1, 20)
    done = subprocess.run(
        [sys.executable, "-m", "blueque.cli", "enqueue", "late", "{}", "--delay", "2",
         "--url", redis_url], capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**environment(), **skewed()})
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.strip()
    data = client.get_task(task_id).data
    assert float(data["eta"]) - float(data["created"]) == pytest.approx(2.0, abs=1.0)
    wait_until(lambda: client.get_task(task_id).status == "complete", 30,
               "the delayed task to run (it waited five minutes before)")


@pytest.mark.slow
def test_a_retry_backoff_from_a_fast_listener_is_timed_by_redis(
        redis_url: str, client: blueque.Client, started: list[Daemon], tmp_path: Path) -> None:
    """A failed attempt's retry eta is on Redis' clock: a listener with the true clock (the
    other one is stopped) runs the retry after the backoff, not five minutes later."""
    fast = Daemon(listen_command(redis_url, "retries", "tests.jobs:boom", "--interval", "0.5"),
                  tmp_path / "fast.log", env=skewed())
    started.append(fast)
    task_id = client.get_queue("retries").enqueue("{}", max_attempts=2, retry_backoff=2)
    wait_until(lambda: client.get_task(task_id).status == "scheduled", 30,
               "the first attempt to fail")
    fast.stop()
    data = client.get_task(task_id).data
    server = client.store.server_time()
    assert float(data["eta"]) - server < 10.0  # not 300 s ahead
    started.append(Daemon(listen_command(redis_url, "retries", "tests.jobs:boom",
                                       "--interval", "0.5"), tmp_path / "true.log"))
    wait_until(lambda: client.get_task(task_id).status == "failed", 30,
               "the retry to run on the other listener")
    assert client.get_task(task_id).attempts == 2


def test_status_on_a_fast_host_shows_a_live_listener_as_live(
        redis_url: str, client: blueque.Client, started: list[Daemon], tmp_path: Path) -> None:
    """Before: `blueque status` on a host five minutes fast showed every listener renewed
    five minutes ago."""
    started.append(Daemon(listen_command(redis_url, "shown", "tests.jobs:text",
                                       "--interval", "0.5"), tmp_path / "true.log"))
    wait_until(lambda: client.get_queue("shown").stats().listeners == 1, 20)
    done = subprocess.run(
        [sys.executable, "-m", "blueque.cli", "status", "--json", "--url", redis_url],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**environment(), **skewed()})
    assert done.returncode == 0, done.stderr
    [listener] = json.loads(done.stdout)["listeners"]
    assert listener["renewed_age"] is not None and abs(listener["renewed_age"]) < 10.0
