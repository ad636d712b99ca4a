"""Make a private redis-server refuse writes as production does (issue 19): out of memory
(``maxmemory`` reached under ``noeviction``: OOM) or unable to persist (a failed snapshot with
``stop-writes-on-bgsave-error``: MISCONF), and take them again once "space is freed".

The snapshot fails because its file name names a directory (the rename onto it fails), which
holds for root too (a read-only directory would not stop root); the server must be started
with SERVER_ARGS (Redis 7 protects ``dbfilename`` from CONFIG SET)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
import redis

from blueque.testing import RedisServer
from tests.daemons import wait_until

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


@contextlib.contextmanager
def tmpfs(where: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` (``4m``) of the test's own at ``where``, read-only if asked, to put
    an append-only file or a spool on and fill; unmounted at the end. It takes root (or
    CAP_SYS_ADMIN): elsewhere the test is skipped."""
    where.mkdir(exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}): it takes "
                    "root (or CAP_SYS_ADMIN)")
    try:
        yield where
    finally:
        wait_until(lambda: subprocess.run(["umount", str(where)]).returncode == 0,
                   what=f"{where} unmounted")


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; the file to remove to free it."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):  # ENOSPC: full
            while os.write(fd, b"\0" * 65536):
                pass
    finally:
        os.close(fd)
    return filler
