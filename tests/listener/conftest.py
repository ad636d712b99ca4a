"""Real `blueque listen` daemons on the private redis-server, for the listener's scenarios
(tests/daemons.py starts and stops them; their task functions are tests.jobs:NAME)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemons import Daemon, listen_command


@pytest.fixture
def start(redis_url: str, tmp_path: Path, started: list[Daemon]):  # type: ignore[no-untyped-def]
    def start_daemon(queues: str, function: str, *options: str, url: str = redis_url
                     ) -> Daemon:
        log = tmp_path / f"daemon{len(started)}.log"
        daemon = Daemon(listen_command(url, queues, function, *options), log)
        started.append(daemon)
        return daemon

    return start_daemon
