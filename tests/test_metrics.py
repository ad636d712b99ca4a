"""Outcome counters written by the scripts that end tasks, and the Prometheus exporters: the
queue collector (dashboard /metrics) and a real listener daemon's --metrics-port."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

import blueque
from blueque import keys as k
from blueque.endings import RunEnd
from blueque.hosts import allowed_hosts
from blueque.metrics import MetricsServer, queue_registry, scrape
from blueque.spool import Spool
from tests.daemons import ROOT, Daemon, daemons, listen_command, wait_until
from tests.readme import section_text

KEYS = k.Keys()


def minute_key(queue: str, at: float) -> str:
    return KEYS.finished_per_minute(queue, str(int(at // 60 * 60)))


def run_to_end(client: blueque.Client, queue: str, outcome: str) -> str:
    """Enqueue, reserve, start and record one outcome through the library's own operations."""
    task_id = client.get_queue(queue).enqueue("{}")
    listener = client.get_listener(queue)
    task = listener.reserve()
    assert task is not None and task.id == task_id
    processor = client.get_processor(task)
    processor.start(4242)
    if outcome == "complete":
        processor.complete("done")
    elif outcome == "retry":
        processor.retry("it broke once", time.time() + 600)
    else:
        processor.fail("it broke")
    return task_id


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_endings_are_counted_per_minute_and_in_total(any_client: blueque.Client) -> None:
    store = any_client.store
    run_to_end(any_client, "q", "complete")
    run_to_end(any_client, "q", "complete")
    run_to_end(any_client, "q", "failed")
    run_to_end(any_client, "q", "retry")
    waiting = any_client.get_queue("q").enqueue("{}")
    any_client.cancel_task(waiting)
    expected = {"complete": 2, "failed": 1, "retry": 1, "cancelled": 1}
    assert store.outcome_counts("q") == expected
    minute = int(time.time() // 60 * 60)
    per_minute = store.outcomes_per_minute("q", [minute - 60, minute])
    assert per_minute[0] == {} or per_minute[1] == {}  # a minute boundary may fall between
    assert {n: per_minute[0].get(n, 0) + per_minute[1].get(n, 0) for n in expected} == expected


def test_minute_counters_expire_and_totals_do_not(redis_client: redis.Redis,
                                                  client: blueque.Client) -> None:
    run_to_end(client, "q", "complete")
    ttl = redis_client.ttl(minute_key("q", time.time()))
    if ttl == -2:  # the minute turned between the finish and this read
        ttl = redis_client.ttl(minute_key("q", time.time() - 60))
    assert 0 < ttl <= k.FINISHED_MINUTE_TTL
    assert redis_client.ttl(KEYS.outcome_counts("q")) == -1


def test_a_repeated_finish_is_not_counted_twice(client: blueque.Client) -> None:
    task_id = client.get_queue("q").enqueue("{}")
    task = client.get_listener("q").reserve()
    assert task is not None
    client.store.start("q", task_id, task.node or "", 7, time.time(), task.attempts)
    for _ in range(2):  # the second is a retried call whose reply was lost
        client.store.finish(RunEnd("q", task_id, task.node or "", 7, task.attempts, "complete",
                                   "r", time.time()))
    assert client.store.outcome_counts("q") == {"complete": 1}


def test_recovery_counts_what_it_decides(client: blueque.Client, redis_client: redis.Redis
                                         ) -> None:
    for retried in (False, True):
        task_id = client.get_queue("q").enqueue("{}", max_attempts=2 if retried else 1)
        listener = client.get_listener("q")
        task = listener.reserve()
        assert task is not None and task.id == task_id
        client.get_processor(task).start(999_999)
        verdict = ("retry", time.time() + 600) if retried else ("failed", None)
        counts = client.store.recover("q", listener.id, [
            (task_id, str(task.attempts), verdict[0], verdict[1], "listener died")],
            time.time(), mode="host")
        assert counts[:3] == ([0, 1, 0] if retried else [0, 0, 1])
    assert client.store.outcome_counts("q") == {"failed": 1, "retry": 1}


def test_queue_collector_reports_states_age_and_outcomes(client: blueque.Client) -> None:
    queue = client.get_queue("jobs")
    run_to_end(client, "jobs", "complete")
    first = queue.enqueue("{}")
    queue.enqueue("{}")
    queue.schedule("{}", time.time() + 3600)
    client.store.redis.hset(KEYS.task(first), mapping={"created": repr(time.time() - 120),
                                                       "updated": repr(time.time() - 120)})
    found = samples(scrape(queue_registry(client.store)))
    assert found[("blueque_redis_up", ())] == 1
    assert found[("blueque_tasks", (("queue", "jobs"), ("state", "pending")))] == 2
    assert found[("blueque_tasks", (("queue", "jobs"), ("state", "scheduled")))] == 1
    assert found[("blueque_tasks", (("queue", "jobs"), ("state", "complete")))] == 1
    age = found[("blueque_queue_oldest_pending_age_seconds", (("queue", "jobs"),))]
    assert 119 < age < 200
    outcome = (("outcome", "complete"), ("queue", "jobs"))
    assert found[("blueque_tasks_finished_total", outcome)] == 1


def test_queue_collector_says_when_redis_is_down(redis_server: object) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dead = blueque.Client(f"redis://127.0.0.1:{port}/0")
    found = samples(scrape(queue_registry(dead.store)))
    assert found == {("blueque_redis_up", ()): 0}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


def ask(port: int, host: str | None) -> tuple[int, str]:
    """GET /metrics with this very Host header (None: none at all), as a browser sent here
    under another name (DNS rebinding) sends it."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest("GET", "/metrics", skip_host=True)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_a_metrics_server_on_loopback_answers_to_its_own_names_only(
        client: blueque.Client) -> None:
    """The dashboard's rule (blueque.hosts): on 127.0.0.1 a web page that points its own
    name here must not read the figures (queue names, listeners, hosts) as its own."""
    client.get_queue("secret-project").enqueue("{}")
    server = MetricsServer(queue_registry(client.store), 0, "127.0.0.1",
                           allowed_hosts("127.0.0.1", ["ops.example"]))
    try:
        for host in (f"127.0.0.1:{server.port}", "localhost", f"[::1]:{server.port}",
                     "LOCALHOST", "ops.example", f"ops.example:{server.port}"):
            status, page = ask(server.port, host)
            assert status == 200 and "secret-project" in page, host
        for host in (f"rebound.evil.example:{server.port}", "127.0.0.1.evil.example", "",
                     "[not-an-address", None):
            status, page = ask(server.port, host)
            assert status == 400 and "secret-project" not in page, host
            assert "--allowed-host" in page, host
    finally:
        server.close()
    opened = MetricsServer(queue_registry(client.store), 0, "127.0.0.1", None)  # 0.0.0.0's
    try:
        assert ask(opened.port, "rebound.evil.example")[0] == 200
    finally:
        opened.close()


@pytest.mark.slow
def test_listener_serves_its_own_metrics(client: blueque.Client, redis_url: str,
                                         redis_client: redis.Redis, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    queue = client.get_queue("work")
    release = tmp_path / "release"
    with daemons(tmp_path) as started:
        daemon = Daemon(listen_command(
            redis_url, "work", "tests.jobs:progress", "--interval", "0.5", "--poll", "0.1",
            "--concurrency", "2", "--metrics-port", str(port)), tmp_path / "daemon.log")
        started.append(daemon)
        running = queue.enqueue(json.dumps({"seconds": 60, "release": str(release)}))
        wait_until(lambda: client.get_task(running).status == "started", what="started")

        def busy() -> bool:
            try:
                found = samples(fetch(url))
            except OSError:
                return False
            labels = (("listener", client.get_task(running).node or ""),)
            return (found.get(("blueque_listener_busy_slots", labels)) == 1
                    and found.get(("blueque_listener_slots", labels)) == 2)

        wait_until(busy, what="busy slots on the listener's /metrics")
        assert ask(port, f"rebound.evil.example:{port}")[0] == 400  # on 127.0.0.1 by default
        child = psutil.Process(client.get_task(running).pid or 0)
        assert not [c for c in child.net_connections() if c.status == psutil.CONN_LISTEN], \
            "the task process inherited the metrics port: it would hold it after its listener"
        info = KEYS.listener_info(client.get_task(running).node or "")
        wait_until(lambda: redis_client.hget(info, "busy") == "1", what="busy in listener info")
        release.touch()
        client.get_task(running).wait(20)
        # progress() raises on it (enqueued so: a parameter changed after the enqueue could
        # come too late, the listener having stamped the task and handed it over)
        failing = queue.enqueue("not json", task_id="will-fail")
        client.get_task(failing).wait(20)

        def counted() -> bool:
            found = samples(fetch(url))
            done = ("blueque_listener_tasks_finished_total",
                    (("outcome", "complete"), ("queue", "work")))
            broke = ("blueque_listener_tasks_finished_total",
                     (("outcome", "failed"), ("queue", "work")))
            runs = ("blueque_task_run_seconds_count", (("outcome", "complete"),
                                                       ("queue", "work")))
            return found.get(done) == 1 and found.get(broke) == 1 and found.get(runs) == 1

        wait_until(counted, what="finished counters and run-time histogram")
        assert daemon.alive()


@pytest.mark.slow
def test_listener_counts_recoveries_adoptions_and_late_renewals(
        client: blueque.Client, redis_url: str, tmp_path: Path) -> None:
    """A listener SIGKILLed with two running tasks: one task process is killed too. The next
    listener on the host recovers the dead one (the task whose process is gone fails) and
    adopts the other; frozen for a while, it counts a late renewal."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    release = tmp_path / "release"
    queue = client.get_queue("work")
    fast = ("--interval", "0.5", "--poll", "0.1")
    with daemons(tmp_path) as started:
        first = Daemon(listen_command(redis_url, "work", "tests.jobs:steps", *fast,
                                      "--concurrency", "2"), tmp_path / "first.log")
        started.append(first)
        ids = [queue.enqueue(json.dumps({"interval": 5, "release": str(release)}))
               for _ in range(2)]
        wait_until(lambda: all(client.get_task(i).status == "started" for i in ids),
                   what="both running")
        first.kill()
        doomed = client.get_task(ids[0]).pid
        assert doomed is not None
        os.killpg(doomed, signal.SIGKILL)
        second = Daemon(listen_command(redis_url, "work", "tests.jobs:steps", *fast,
                                       "--metrics-port", str(port)), tmp_path / "second.log")
        started.append(second)

        def swept() -> bool:
            try:
                found = samples(fetch(url))
            except OSError:
                return False
            return (found.get(("blueque_listener_adopted_tasks", ())) == 1
                    and found.get(("blueque_listener_recoveries_total", ())) == 1
                    and found.get(("blueque_listener_recovered_tasks_total",
                                   (("verdict", "failed"),))) == 1)

        wait_until(swept, what="the recovery and the adoption on the second listener's metrics")
        assert client.get_task(ids[0]).status == "failed"
        assert client.get_task(ids[1]).status == "started"
        second.signal(signal.SIGSTOP)
        time.sleep(1.5)  # the freeze itself is the scenario: longer than one interval
        second.signal(signal.SIGCONT)
        late = ("blueque_listener_lease_renewals_late_total", ())
        wait_until(lambda: samples(fetch(url)).get(late, 0) >= 1, what="a late renewal")
        release.touch()
        client.get_task(ids[1]).wait(20)
        assert client.get_task(ids[1]).status == "complete"


@pytest.mark.slow
def test_listener_counts_a_lost_lease(client: blueque.Client, redis_url: str,
                                      tmp_path: Path) -> None:
    """Frozen past its lease, a listener is declared dead by another; back, it counts the
    lease it lost (and registers again)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    fast = ("--interval", "0.5", "--poll", "0.1")
    with daemons(tmp_path) as started:
        frozen = Daemon(listen_command(redis_url, "work", "tests.jobs:echo", *fast,
                                       "--metrics-port", str(port)), tmp_path / "frozen.log")
        started.append(frozen)
        watcher = Daemon(listen_command(redis_url, "work", "tests.jobs:echo", *fast),
                         tmp_path / "watcher.log")
        started.append(watcher)
        listeners = KEYS.listeners("work")
        store = client.store
        wait_until(lambda: len(store.listener_ids("work")) == 2, what="both registered")
        wait_until(lambda: b"blueque_listener_slots" in fetch(url), what="metrics served")
        frozen.signal(signal.SIGSTOP)
        wait_until(lambda: len(store.listener_ids("work")) == 1, timeout=20,
                   what=f"the frozen listener removed from {listeners}")
        frozen.signal(signal.SIGCONT)
        lost = ("blueque_listener_leases_lost_total", (("queue", "work"),))
        wait_until(lambda: samples(fetch(url)).get(lost) == 1, what="the lost lease counted")
        assert samples(fetch(url))[("blueque_listener_lease_renewals_late_total", ())] >= 1
        wait_until(lambda: len(store.listener_ids("work")) == 2, what="registered again")


def exported_names(text: bytes) -> dict[str, str]:
    """Metric name as scraped (counters with _total) -> type, from the exposition's families
    (families whose labelled children are not used yet still say HELP and TYPE)."""
    names = {}
    for family in text_string_to_metric_families(text.decode()):
        if family.name.endswith("_created"):
            continue  # prometheus_client's companion of each counter (its creation time)
        names[family.name + ("_total" if family.type == "counter" else "")] = family.type
    return names


def test_readme_documents_every_exported_metric_and_their_names_follow_conventions(
        client: blueque.Client, tmp_path: Path) -> None:
    """docs/how-to/observability.md 'Metrics' (and the keys' on how-to/fleet-controls.md)
    lists exactly what the two exporters serve, with their types; the names are
    Prometheus-style (blueque_ prefix, snake case, counters end in _total, times in
    _seconds) and the page's alert rule uses existing names."""
    from blueque.metrics import ListenerMetrics

    client.get_queue("q").enqueue("{}")
    served = exported_names(scrape(queue_registry(client.store)))
    listener = ListenerMetrics(client.store, "node_1", 2, busy=lambda: 0,
                               memory=lambda: {4242: 50 * 1024 * 1024},
                               spool=Spool(tmp_path / "spool"))
    served.update(exported_names(scrape(listener.registry)))

    section = section_text("how-to/observability.md", "Metrics")
    # and the keys' metrics, on the page of the fleet controls (PROTOCOL.md 5.22)
    keys = section_text("how-to/fleet-controls.md", "Concurrency limits per key")
    documented = {}
    for line in (section + keys).splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 3 and cells[1].startswith("`blueque_"):
            for name in re.findall(r"`(blueque_[a-z_]+)`", cells[1]):
                documented[name] = cells[2]
    assert documented == served
    for name, kind in served.items():
        assert re.fullmatch(r"blueque_[a-z][a-z_]*[a-z]", name), name
        assert name.endswith("_total") == (kind == "counter"), name
        assert "seconds" not in name or name.endswith("_seconds"), name
    alert = section[section.index("```yaml"):]
    used = set(re.findall(r"\b(blueque_[a-z_]+)", alert))
    assert used and used <= set(served), used - set(served)


def test_a_metrics_port_out_of_range_is_a_usage_error(redis_url: str) -> None:
    done = subprocess.run(
        [*listen_command(redis_url, "work", "tests.jobs:echo", "--metrics-port", "99999")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=30)
    assert done.returncode == 2 and "port number from 0 to 65535" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_reads_of_many_queues_agree_with_reads_of_one(any_client: blueque.Client) -> None:
    """The pipelined reads of the dashboard and the collector give, queue by queue, what the
    one-queue reads give: counts (reserved included), the next task in line, outcomes."""
    store = any_client.store
    run_to_end(any_client, "a", "complete")
    run_to_end(any_client, "a", "failed")
    any_client.get_queue("a").enqueue("{}")
    any_client.get_queue("b").enqueue("{}")
    reserved = any_client.get_listener("b").reserve()  # reserved, not started
    assert reserved is not None
    any_client.get_queue("b").enqueue("{}", task_id="next-in-b")
    any_client.get_queue("c").schedule("{}", time.time() + 60)
    queues = ["a", "b", "c", "never-used"]
    minute = int(time.time() // 60 * 60)
    minutes = [minute - 60, minute]
    assert store.counts_many(queues) == [store.counts(q) for q in queues]
    assert store.counts("b").reserved == 1 and store.counts("a").failed == 1
    assert store.oldest_pending_many(queues) == [store.oldest_pending(q) for q in queues]
    oldest_b = store.oldest_pending("b")
    assert oldest_b is not None and oldest_b[0] == "next-in-b" and "created" in oldest_b[1]
    assert store.outcome_counts_many(queues) == [store.outcome_counts(q) for q in queues]
    assert store.outcome_counts("a") == {"complete": 1, "failed": 1}
    assert store.outcomes_per_minute_many(queues, minutes) == [
        store.outcomes_per_minute(q, minutes) for q in queues]
    assert store.listener_ids_many(queues) == store.listener_ids("a") | store.listener_ids("b")
    work = store.listeners_at_work(queues)
    assert [w.registered for w in work] == [store.listener_ids(q) for q in queues]
    assert [w.leases for w in work] == [store.leases(q) for q in queues]
    assert [w.started for w in work] == [store.started_entries(q) for q in queues]


@pytest.mark.slow
def test_blueque_metrics_serves_every_queue_without_the_dashboard(
        client: blueque.Client, redis_url: str, tmp_path: Path) -> None:
    """`blueque metrics`: the dashboard's /metrics for deployments without the web UI (a
    real process, scraped over HTTP, stopped by SIGTERM)."""
    run_to_end(client, "jobs", "failed")
    client.get_queue("jobs").enqueue("{}")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "blueque.cli", "metrics", "--url", redis_url, "--port",
         str(port), "--allowed-host", "ops.example"], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def scraped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            try:
                return samples(fetch(url))
            except OSError:
                return {}

        wait_until(lambda: scraped() or process.poll() is not None, what="metrics served")
        found = scraped()
        assert found[("blueque_redis_up", ())] == 1
        assert found[("blueque_tasks", (("queue", "jobs"), ("state", "pending")))] == 1
        assert found[("blueque_tasks_finished_total", (("outcome", "failed"),
                                                       ("queue", "jobs")))] == 1
        assert ask(port, "ops.example")[0] == 200
        assert ask(port, f"rebound.evil.example:{port}")[0] == 400
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert f"http://127.0.0.1:{port}/metrics" in err
    taken = subprocess.run(
        [sys.executable, "-m", "blueque.cli", "metrics", "--url", redis_url, "--port",
         "99999"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=30)
    assert taken.returncode == 2 and "0 to 65535" in taken.stderr
