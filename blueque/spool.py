"""A node's spool of held endings (PROTOCOL.md 6.5): a run's ending that Redis could not take
(away, or refusing writes) is written to a file on the node, so that it outlives the listener
that held it in memory; the node's listeners replay the files through finish (5.6), fenced by
attempt, once Redis takes writes again. One small JSON file per ending, written atomically."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blueque.display import format_bytes
from blueque.endings import RunEnd
from blueque.errors import ConfigurationError, InvalidTaskState, TaskNotFound

if TYPE_CHECKING:
    from blueque.store import RedisStore

log = logging.getLogger("blueque.daemon")

VERSION = 1
SUFFIX = ".json"
OUTCOMES = ("complete", "failed", "retry", "preempted")


def default_directory() -> Path:
    """``$XDG_STATE_HOME/blueque/spool`` (``~/.local/state/...`` without it)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state) / "blueque" / "spool"


def server_of(store: RedisStore) -> str:
    """Which Redis (and database) an ending belongs to: a spool shared by listeners of
    several servers replays each file against its own only. A Redis Cluster (no connection
    pool of its own: one per node) has database 0 only."""
    pool = getattr(store.redis, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {})
    return f"{store.where}/{kwargs.get('db', 0)}"


@dataclass(frozen=True)
class Held:
    """A spooled ending: the finish to repeat, the node whose run record it drops (or None),
    and the Redis it is for."""

    end: RunEnd
    node: str | None
    server: str

    def to_json(self) -> str:
        return json.dumps({**asdict(self.end), "node": self.node, "server": self.server,
                           "version": VERSION})

    @classmethod
    def from_json(cls, text: str) -> Held:
        """Raises ValueError for anything but a spooled ending."""
        data: Any = json.loads(text)
        if not isinstance(data, dict) or data.pop("version", None) != VERSION:
            raise ValueError("not a spooled ending (no version 1)")
        node, server = data.pop("node", None), data.pop("server", None)
        if not isinstance(server, str) or not isinstance(data.get("attempt"), int):
            raise ValueError("a spooled ending names its server and its attempt")
        if data.get("outcome") not in OUTCOMES or (
                data["outcome"] == "retry" and data.get("retry_eta") is None):
            raise ValueError(f"no outcome finish records: {data.get('outcome')!r}")
        try:
            end = RunEnd(**data)
        except TypeError as error:
            raise ValueError(str(error)) from error
        return cls(end, node if isinstance(node, str) else None, server)


#: The free space a spool must have at a listener's start (bytes): a held ending is a few KB,
#: its traceback included; less than this and the disk is as good as full.
MIN_FREE = 1024 * 1024
#: While the spool cannot be written, its error is repeated in the log at most this often (s);
#: every ending is still tried at each step.
REPEAT_EVERY = 600.0


class Spool:
    """The spool directory of a node (``blueque listen --spool-dir``). ``failing``: the error
    of its latest write while writes fail (None while they work), which the listener's
    status and metrics say."""

    def __init__(self, directory: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.clock = clock
        self.failing: str | None = None
        self._said: float | None = None  # when the failure was last logged
        #: the endings a failure was said for (each once, though tried at each step)
        self._named: set[tuple[str, int | None]] = set()

    def look(self) -> None:
        """A listener's look at each renewal: its free space, and a file made and removed
        (no fsync: cheap), so that ``failing`` says a spool gone read-only or full before an
        ending needs it (status, metrics), and stops saying it once it is usable again."""
        probe = self.directory / f".probe.{os.getpid()}.tmp"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            free = os.statvfs(self.directory)
            if free.f_bavail * free.f_frsize < MIN_FREE:
                raise OSError(errno.ENOSPC, f"{format_bytes(free.f_bavail * free.f_frsize)} "
                              f"free, less than {format_bytes(MIN_FREE)}")
            probe.write_text("{}", encoding="utf-8")
            probe.unlink()
        except OSError as error:
            with contextlib.suppress(OSError):
                probe.unlink()
            self._failed(None, error)
            return
        self._works()

    @classmethod
    def checked(cls, directory: Path) -> Spool:
        """The spool, once it was found usable: the directory made if need be, a file
        written, fsynced and removed, and MIN_FREE bytes free. ConfigurationError (blueque
        listen: exit 2) says what is wrong: a listener that cannot spool would lose an ending
        that Redis refused, if it died before Redis took it."""
        spool = cls(directory)
        probe = directory / f".probe.{os.getpid()}.tmp"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with open(probe, "w", encoding="utf-8") as handle:
                handle.write("{}")
                handle.flush()
                os.fsync(handle.fileno())
            probe.unlink()
            found = os.statvfs(directory)
        except OSError as error:
            with contextlib.suppress(OSError):
                probe.unlink()
            raise ConfigurationError(
                f"cannot use --spool-dir {directory}: {error.strerror or error}; give a "
                "writable directory on a disk with room (it holds the endings Redis cannot "
                "take until it can)") from error
        free = found.f_bavail * found.f_frsize
        if free < MIN_FREE:
            raise ConfigurationError(
                f"cannot use --spool-dir {directory}: its disk has {format_bytes(free)} free, "
                f"less than {format_bytes(MIN_FREE)}; free some space or give another "
                "directory (it holds the endings Redis cannot take until it can)")
        return spool

    def path(self, task_id: str, attempt: int) -> Path:
        return self.directory / f"{attempt}-{urllib.parse.quote(task_id, safe='')}{SUFFIX}"

    def hold(self, held: Held, quiet: bool = False) -> bool:
        """Write the ending to its file (temporary name, fsync, rename, fsync of the
        directory). Never raises: a disk that cannot take it leaves the ending in memory only,
        said at error level."""
        end = held.end
        if end.attempt is None:
            return False  # unfenced (1.0.1's runs): a replay could not be told from a repeat
        path = self.path(end.task_id, end.attempt)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(held.to_json())
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as error:
            with contextlib.suppress(OSError):
                temporary.unlink()
            self._failed(end, error)
            return False
        self._works()
        log.log(logging.DEBUG if quiet else logging.WARNING,
                "task %s: its ending (%s, attempt %s) is held in %s until Redis takes it",
                end.task_id, end.outcome, end.attempt, path)
        return True

    def _works(self) -> None:
        if self.failing is not None:
            log.warning("the spool %s can be written again (an ending held in memory only "
                        "meanwhile is written when it is tried again)", self.directory)
            self.failing, self._said = None, None
            self._named.clear()

    def _failed(self, end: RunEnd | None, error: OSError) -> None:
        """A write (of ``end``; None: a look) failed: said at error the first time and for
        each ending once, else at most every REPEAT_EVERY seconds (endings are tried again at
        each step, and the spool looked at at each renewal: neither may flood the log)."""
        current = self.clock()
        first = self.failing is None
        self.failing = str(error.strerror or error)
        named = end is not None and (end.task_id, end.attempt) not in self._named
        if not (first or named) and current - (self._said or current) < REPEAT_EVERY:
            return
        if end is not None:
            self._named.add((end.task_id, end.attempt))
        self._said = current
        what = ("an ending Redis refuses would be held in memory only" if end is None else
                f"task {end.task_id}: its ending ({end.outcome}, attempt {end.attempt}) is "
                "held in memory only")
        log.error("the spool %s cannot be written (%s): %s, lost if this process dies before "
                  "Redis takes it; tried again at each step, said again every %d s while it "
                  "fails", self.directory, self.failing, what, REPEAT_EVERY)

    def release(self, task_id: str, attempt: int | None) -> None:
        """The ending was recorded: its file, if any, goes."""
        if attempt is not None:
            with contextlib.suppress(OSError):
                self.path(task_id, attempt).unlink()

    def files(self) -> list[Path]:
        """The spooled endings, oldest first."""
        try:
            found = [p for p in self.directory.iterdir()
                     if p.name.endswith(SUFFIX) and not p.name.startswith(".")]
        except OSError:
            return []

        def written(path: Path) -> float:
            try:
                return path.stat().st_mtime
            except OSError:
                return 0.0
        return sorted(found, key=written)

    def replay(self, store: RedisStore) -> int:
        """Record every spooled ending of ``store``'s Redis (finish, fenced by attempt) and
        remove its file; how many were recorded. Raises RedisUnavailable (the rest waits)."""
        recorded, server = 0, server_of(store)
        for path in self.files():
            held = self._read(path)
            if held is None or held.server != server:
                continue
            end = held.end
            try:
                status = store.finish(end, forget_run=(held.node, end.pid)
                                      if held.node and end.pid is not None else None)
            except (InvalidTaskState, TaskNotFound) as refused:
                log.warning("task %s: spooled ending (%s, attempt %s) not recorded: %s",
                            end.task_id, end.outcome, end.attempt, refused)
            else:
                recorded += 1
                log.warning("task %s: spooled ending of attempt %s recorded: %s", end.task_id,
                            end.attempt, status)
            with contextlib.suppress(OSError):
                path.unlink()
        return recorded

    def _read(self, path: Path) -> Held | None:
        try:
            return Held.from_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None  # recorded and removed meanwhile
        except (OSError, ValueError) as error:
            bad = path.with_name(path.name + ".bad")
            log.error("%s is not a spooled ending (%s): renamed %s", path, error, bad.name)
            with contextlib.suppress(OSError):
                path.rename(bad)
            return None
