"""Start and stop a real `blueque dashboard` process for the end-to-end tests (by pid)."""

from __future__ import annotations

import html
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from blueque.testing import stop_process

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def page_text(markup: str) -> str:
    """What a page's HTML (or a piece of it) reads as: its tags out, its entities decoded,
    each run of blanks one space."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


class DashboardProcess:
    """``blueque dashboard`` on a free loopback port; ``close()`` stops it by pid."""

    def __init__(self, redis_url: str, log_path: Path, token: str | None = None,
                 options: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("BLUEQUE_DASHBOARD_TOKEN", None)
        if token is not None:
            env["BLUEQUE_DASHBOARD_TOKEN"] = token
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "blueque.cli", "dashboard", "--url", redis_url,
             "--port", str(self.port), "--refresh", "0.3", *options],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"dashboard exited: {self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(self.url + "/metrics", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        raise AssertionError(f"dashboard not ready after {timeout} s")

    def close(self) -> None:
        stop_process(self.process)
        self._log.close()
