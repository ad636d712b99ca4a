"""Redis Sentinel: real master, replicas and sentinels on loopback; the master is SIGKILLed
while real listener daemons drain tasks. A fresh topology per test (they are destructive)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from failover import run_failover

import blueque
from blueque.errors import RedisUnavailable
from blueque.testing import SentinelTopology, TLSFiles

pytestmark = [pytest.mark.ha, pytest.mark.slow]


@pytest.fixture
def sentinel() -> Iterator[SentinelTopology]:
    with SentinelTopology(replicas=2, sentinels=3) as topology:
        yield topology


def test_client_reaches_the_master_through_sentinel_url(sentinel: SentinelTopology) -> None:
    client = blueque.Client(sentinel.url)
    task_id = client.get_queue("q").enqueue('{"x": 1}')
    assert client.store.task_data(task_id)["status"] == "pending"
    master = sentinel.master()
    assert client.redis.connection_pool.get_master_address() == ("127.0.0.1", master.port)
    client.close()


def test_wait_replicas_confirms_enqueue_on_a_replica(sentinel: SentinelTopology) -> None:
    client = blueque.Client(sentinel.url + "?wait_replicas=2&wait_timeout=2000")
    task_id = client.get_queue("q").enqueue("{}")
    # acknowledged by both replicas: each already holds the task hash
    for server in sentinel.servers[1:]:
        replica = blueque.Client(server.url)
        assert replica.store.task_data(task_id)["status"] == "pending"
        replica.close()
    client.close()


def test_too_few_replicas_to_acknowledge_is_an_error(sentinel: SentinelTopology) -> None:
    # three acknowledgements asked, two replicas exist: the write is never confirmed
    client = blueque.Client(sentinel.url + "?wait_replicas=3&wait_timeout=50&retry_deadline=1")
    with pytest.raises(RedisUnavailable, match="acknowledged"):
        client.get_queue("q").enqueue("{}", task_id="t1")
    # it is on the master all the same (a WAIT shortfall is not a rollback)
    assert client.store.task_data("t1")["status"] == "pending"
    client.close()


def test_three_listeners_drain_500_tasks_through_a_master_sigkill(
    sentinel: SentinelTopology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old_port = sentinel.master().port

    def kill_master() -> None:
        sentinel.kill_master()

    outcome = run_failover(
        tmp_path, sentinel.url + "?wait_replicas=1&wait_timeout=500", kill_master,
    )
    assert sentinel.master().port != old_port, "no failover happened"
    figures = outcome.figures()
    with capsys.disabled():
        print(f"\nsentinel failover figures: {json.dumps(figures)}")
    # every acknowledged task ends complete: none lost, none failed by the failover
    assert len(outcome.acknowledged) == 500
    assert outcome.statuses == {"complete": 500}, outcome.statuses
    # every daemon and every task process stayed alive, so no task may have run twice
    assert outcome.ran_twice == []
    assert set(outcome.runs) == set(outcome.acknowledged)
    assert outcome.daemons_alive, "a listener daemon died during the failover"
    assert outcome.daemon_exit_codes == [0, 0, 0]


def test_tls_and_passwords_to_servers_and_sentinels(tmp_path: Path) -> None:
    tls = TLSFiles.self_signed(str(tmp_path))
    topology = SentinelTopology(
        replicas=1, tls=tls,
        acl=["app on >app-secret ~* &* +@all"],
        sentinel_acl=["user watcher on >watch-secret +@all"],
        url_auth="app:app-secret",
        url_options=("sentinel_username=watcher&sentinel_password=watch-secret"
                     f"&ssl_ca_certs={tls.ca}&ssl_check_hostname=true"),
    )
    with topology:
        assert topology.url.startswith("rediss+sentinel://app:app-secret@")
        client = blueque.Client(topology.url)
        task_id = client.get_queue("secure").enqueue("{}")
        assert client.store.task_data(task_id)["status"] == "pending"
        # the connection is the master's TLS port, authenticated as "app"
        info = client.redis.client_info()
        assert info["user"] == "app"
        assert info["laddr"].endswith(f":{topology.client_port(topology.master())}")
        assert topology.client_port(topology.master()) != topology.master().port
        # a wrong password is refused at once, not retried until the deadline, and not
        # mistaken for an unreachable server
        wrong = blueque.Client(topology.url.replace("app-secret", "wrong"))
        with pytest.raises(blueque.AuthenticationFailed, match="password"):
            wrong.get_queue("secure").enqueue("{}")
        wrong_sentinel = blueque.Client(topology.url.replace("watch-secret", "wrong"))
        with pytest.raises(blueque.AuthenticationFailed, match="AuthenticationError"):
            wrong_sentinel.get_queue("secure").enqueue("{}")
        # and a failover over TLS is ridden through like any other
        old = topology.kill_master()
        again = client.get_queue("secure").enqueue("{}")
        assert topology.master().port != old.port
        assert client.store.task_data(task_id)["status"] == "pending"
        assert client.store.task_data(again)["status"] == "pending"
        for other in (client, wrong, wrong_sentinel):
            other.close()


def test_the_readmes_sentinel_lines_run_with_its_sentinels(tmp_path: Path) -> None:
    """The high availability page's "Sentinel": the export and listen lines, and the Client
    line, run with this topology's sentinels for s1, s2, s3 (master name "jobs", as written).
    Its servers and sentinels keep the default user open (the topology's own probes use it),
    so the lines' passwords are left out here; test_tls_and_passwords_to_servers_and_sentinels
    has them."""
    from tests.readme import Shell, block, commands

    page = "how-to/high-availability.md"
    with SentinelTopology(replicas=1, sentinels=3, master_name="jobs") as topology:
        hosts = topology.url.split("://", 1)[1].split("/", 1)[0]
        replace = {"s1:26379,s2:26379,s3:26379": hosts, ":app-secret@": "",
                   "?sentinel_password=x": ""}
        code = block("Sentinel", 2, page).text
        for old, new in replace.items():
            code = code.replace(old, new)
        namespace: dict[str, object] = {"blueque": blueque}
        exec(code, namespace)  # the page's own line
        client = namespace["client"]
        assert isinstance(client, blueque.Client)
        (root := tmp_path / "project" / "myapp").mkdir(parents=True)
        (root / "__init__.py").write_text("")
        (root / "tasks.py").write_text("def convert(task):\n    return 'converted'\n")
        shell = Shell(tmp_path, root.parent, "", replace=replace)
        export, listen = commands(block("Sentinel", 1, page).text)
        try:
            listener = shell.start(f"{export}; {listen}")
            listener.until("listening on")
            task_id = client.get_queue("documents").enqueue("{}")  # wait_replicas=1
            assert client.get_task(task_id).wait(30).result == "converted"
            assert listener.stop() == 0, listener.output()
        finally:
            shell.close()
            client.close()
