"""Make a private redis-server refuse writes as production does (issue 19): out of memory
(``maxmemory`` reached under ``noeviction``: OOM) or unable to persist (a failed snapshot with
``stop-writes-on-bgsave-error``: MISCONF), and take them again once "space is freed".

The snapshot fails because its file name names a directory (the rename onto it fails), which
holds for root too (a read-only directory would not stop root); the server must be started
with SERVER_ARGS (Redis 7 protects ``dbfilename`` from CONFIG SET)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

import redis

from blueque.testing import RedisServer

Kind = Literal["out of memory", "cannot persist"]
SNAPSHOT = "blocked.rdb"
SERVER_ARGS = ("--dbfilename", SNAPSHOT)


class Refusal:
    def __init__(self, server: RedisServer) -> None:
        assert server.directory is not None
        self.admin = redis.Redis(port=server.port, decode_responses=True)
        self.blocked = Path(server.directory) / SNAPSHOT

    def refuse(self, kind: Kind) -> None:
        """From now on every write is refused (OOM or MISCONF)."""
        if kind == "out of memory":
            self.admin.config_set("maxmemory-policy", "noeviction")
            self.admin.config_set("maxmemory", "1")
        else:
            if self.blocked.is_file():  # the snapshot a free() wrote
                self.blocked.unlink()
            self.blocked.mkdir(exist_ok=True)
            self.admin.config_set("save", "3600 1")
            self._snapshot("err")
        try:
            self.admin.set("blueque_test_refusal", "1")
        except redis.exceptions.ResponseError as error:
            assert isinstance(error, redis.exceptions.OutOfMemoryError) or str(
                error).startswith("MISCONF"), error
        else:
            raise AssertionError("the server still takes writes")

    def free(self) -> None:
        """Memory or disk space is back: writes are taken again."""
        self.admin.config_set("maxmemory", "0")
        if self.blocked.is_dir():
            os.rmdir(self.blocked)
            self._snapshot("ok")
            self.admin.config_set("save", "")
        self.admin.set("blueque_test_refusal", "0")

    def _snapshot(self, wanted: str) -> None:
        """BGSAVE, and wait until it has ended with ``wanted``: the last one ended otherwise."""
        self.admin.bgsave()
        deadline = time.monotonic() + 20
        while True:
            info = self.admin.info("persistence")
            if not info["rdb_bgsave_in_progress"] and info["rdb_last_bgsave_status"] == wanted:
                return
            assert time.monotonic() < deadline, f"BGSAVE did not end {wanted}: {info}"
            time.sleep(0.02)
