"""A listener's pod deletion cost (issue 31.4): in a Kubernetes pod it PATCHes its own pod's
``controller.kubernetes.io/pod-deletion-cost`` to its busy slots, with its service account's
token, over TLS checked against the account's CA. A small HTTPS server on loopback stands in
for the Kubernetes API (a self-signed certificate made by openssl is the "cluster's" CA)."""

from __future__ import annotations

import http.server
import json
import logging
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import blueque
from blueque.daemon import podcost
from blueque.daemon.podcost import ANNOTATION, RETRY_AFTER, PodDeletionCost
from tests.daemons import Daemon, listen_command, wait_until

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@dataclass
class FakeApi:
    """The Kubernetes API as far as a pod patching itself sees it: PATCHes recorded, and
    ``status`` the answer to the next ones (200, or 403 for an account without the right)."""

    port: int = 0
    status: int = 200
    patches: list[tuple[str, dict[str, str], dict[str, object]]] = field(default_factory=list)

    def costs(self) -> list[str]:
        return [str(body["metadata"]["annotations"][ANNOTATION])  # type: ignore[index]
                for _, _, body in self.patches]


@pytest.fixture
def account(tmp_path: Path) -> Path:
    """A service account directory as Kubernetes mounts it, with a CA for 127.0.0.1."""
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(folder / "ca.crt"),
                    "-subj", "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    (folder / "token").write_text("the-token\n")
    (folder / "namespace").write_text("jobs\n")
    return folder


@pytest.fixture
def api(account: Path) -> Iterator[FakeApi]:
    fake = FakeApi()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.patches.append((self.path, dict(self.headers), body))
            self.send_response(fake.status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(account / "ca.crt", account.parent / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    fake.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()
    thread.join(10)


def environment(api: FakeApi, account: Path) -> dict[str, str]:
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
            "BLUEQUE_SERVICE_ACCOUNT_DIR": str(account), "POD_NAME": "listener-7f9c-abcde"}


def test_the_cost_follows_the_busy_slots_patched_with_the_token(
        api: FakeApi, account: Path) -> None:
    link = podcost.pod_link({**environment(api, account), "KUBERNETES_SERVICE_HOST": "fd00::1"})
    assert not isinstance(link, str) and link.base == f"https://[fd00::1]:{api.port}"
    cost = PodDeletionCost("node_1", environment(api, account), every=5.0)
    assert cost.update(0, now=0.0) and cost.update(0, now=6.0)  # unchanged: not sent again
    assert cost.update(3, now=7.0)
    assert not cost.update(1, now=8.0)  # too soon after the last: sent when it is time
    assert cost.update(1, now=12.5)
    assert api.costs() == ["0", "3", "1"]
    path, headers, _ = api.patches[0]
    assert path == "/api/v1/namespaces/jobs/pods/listener-7f9c-abcde"
    assert headers["Authorization"] == "Bearer the-token"
    assert headers["Content-Type"] == "application/merge-patch+json"


def test_a_refusal_is_said_once_with_the_way_and_tried_again_later(
        api: FakeApi, account: Path, caplog: pytest.LogCaptureFixture) -> None:
    api.status = 403
    cost = PodDeletionCost("node_1", environment(api, account))
    with caplog.at_level(logging.WARNING, "blueque.daemon"):
        assert not cost.update(2, now=0.0)
        assert not cost.update(2, now=1.0)  # not tried again at once
    assert len(api.patches) == 1
    assert len(caplog.records) == 1 and "403" in caplog.text and "patch pods" in caplog.text
    api.status = 200
    assert cost.update(2, now=RETRY_AFTER + 1)
    assert api.costs() == ["2", "2"]


def test_without_a_token_it_says_how_and_outside_kubernetes_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "blueque.daemon"):
        outside = PodDeletionCost("node_1", {})
        assert caplog.text == "" and not outside.update(1, now=0.0)
        inside = PodDeletionCost("node_1", {"KUBERNETES_SERVICE_HOST": "10.0.0.1",
                                            "BLUEQUE_SERVICE_ACCOUNT_DIR": str(tmp_path)})
    assert not inside.update(1, now=0.0)
    assert "no service account token mounted" in caplog.text
    assert "docs/how-to/containers.md" in caplog.text


@pytest.mark.slow
def test_a_real_listener_keeps_its_pods_cost(  # type: ignore[no-untyped-def]
        api: FakeApi, account: Path, client: blueque.Client, redis_url, started,
        tmp_path) -> None:
    marker, release = tmp_path / "marker", tmp_path / "release"
    daemon = Daemon(listen_command(redis_url, "work", "tests.jobs:hold", "--interval", "0.5",
                                   "--poll", "0.1", "--concurrency", "2"),
                    tmp_path / "listener.log", env=environment(api, account))
    started.append(daemon)
    wait_until(lambda: api.costs() == ["0"], what="the idle cost set")
    params = json.dumps({"marker": str(marker), "release": str(release)})
    ids = [client.get_queue("work").enqueue(params) for _ in range(2)]
    wait_until(lambda: api.costs()[-1:] == ["2"], what="the busy cost")
    release.touch()
    for task_id in ids:
        assert client.get_task(task_id).wait(20).status == "complete"
    wait_until(lambda: api.costs()[-1:] == ["0"], what="idle again")
    assert "keeps the deletion cost of pod listener-7f9c-abcde" in daemon.log()
