"""The fork server (PROTOCOL.md 6.8, ``python -m blueque.task_process.forkserver FD``): a small
process a
listener starts once, which imports the task function and the task process's code and nothing
the listener alone needs (no connection pool, no thread, no redis-py), and forks the task
processes from there: a fork of a small quiet process costs less than one of the listener, and
the listener takes no copy-on-write faults from its children's lives.

Over its control socket (FD, a SOCK_SEQPACKET socket: one message a packet) it reads its setup
(``Setup``, pickled), says ``{"ready": pid}``, then takes ``{"fork": {...}}`` requests, each
with the child's end of its socket pair (and its output pipe) as SCM_RIGHTS, and answers
``{"forked": pid, "created": t}`` (or ``{"refused": why}``); a request marked ``"spare"``
makes a task process ahead of its task, which waits for it as an idle warm one does. It
reports each child's exit, ``{"exited": pid, "status": raw}``, and reaps it only once the
listener, having settled it, says ``{"reap": [pids]}`` (until then its pid is nobody else's);
it exits when the socket closes (its listener is gone: its children live on, as a dead
listener's do)."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import pickle
import select
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

from blueque import failpoints
from blueque import logs as log_setup
from blueque.process import create_time, set_title
from blueque.run_processes import libc_prctl
from blueque.spool import Spool
from blueque.task_process.calling import TaskFunction, import_function
from blueque.task_process.child import Assignment, leave_process
from blueque.task_process.server_frames import (
    ExitedAnswer,
    FailedAnswer,
    ForkedAnswer,
    ForkOrder,
    FromForkServer,
    LoadedAnswer,
    ReadyAnswer,
    RefusedAnswer,
    ToForkServer,
)
from blueque.task_process.warm import run_task_process
from blueque.tasklog import TaskLogSettings

if TYPE_CHECKING:
    from blueque.store import RedisStore

log = logging.getLogger("blueque.forkserver")

#: The largest control message (a setup with its pickled settings is well under it).
MESSAGE_BYTES = 1 << 20
#: Descriptors one request may carry: the child's socket, its output pipe's two ends.
MAX_FDS = 3


@dataclass(frozen=True)
class Setup:
    """What a fork server is told once: its listener's task function and how its children
    reach Redis should they need to (``settings``: blueque.config.Settings, pickled, opened
    only by a child that needs it), where their output and endings go, its log set-up."""

    function: str
    settings: bytes
    checkpoint_max_bytes: int | None
    task_logs: TaskLogSettings | None
    spool: Path | None
    sys_path: list[str]
    log_format: str
    log_level: str


class LazyStore:
    """A task process's RedisStore, made on first use from its listener's settings: a child
    whose listener records all it reports never loads redis-py nor opens a connection."""

    def __init__(self, setup: Setup, bound: tuple[float, bool | None] | None = None,
                 loaded: int | None = None) -> None:
        self._setup, self._bound, self._loaded = setup, bound, loaded
        self._store: Any = None
        self._lock = threading.Lock()  # the output shipper's thread may be the first user

    def _real(self) -> Any:
        with self._lock:
            if self._store is None:
                from blueque.client import Client  # redis-py: only now

                _tell(self._loaded)
                client = Client(pickle.loads(self._setup.settings),
                                checkpoint_max_bytes=self._setup.checkpoint_max_bytes)
                self._store = (client.store if self._bound is None
                               else client.store.bounded(*self._bound))
            return self._store

    def bounded(self, seconds: float, quiet: bool | None = None) -> Any:
        if self._store is None:
            return LazyStore(self._setup, (seconds, quiet), self._loaded)
        return self._store.bounded(seconds, quiet)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)


class ForkServer:
    """The fork server's loop over its control socket and its children's exits."""

    def __init__(self, control: socket.socket, setup: Setup, function: TaskFunction) -> None:
        self.control, self.setup, self.function = control, setup, function
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(self._wake_w)
        # a child that had to import the client writes a byte here: the next ones find it loaded
        self._loaded: tuple[int, int] | None = None
        if "blueque.client" not in sys.modules:
            self._loaded = os.pipe()
            for fd in self._loaded:
                os.set_blocking(fd, False)
        self.children: set[int] = set()  # forked, running (or exited, not yet reported)
        self.reported: set[int] = set()  # exited and reported: zombies until "reap"

    def serve(self) -> None:
        """Until the listener closes the control socket."""
        poller = select.poll()
        poller.register(self.control, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        if self._loaded is not None:
            poller.register(self._loaded[0], select.POLLIN)
        while True:
            self.report_exits()
            try:
                events = dict(poller.poll())
            except InterruptedError:
                continue
            if self._wake_r in events:
                while _read_some(self._wake_r):
                    pass
            if self._loaded is not None and self._loaded[0] in events:
                poller.unregister(self._loaded[0])
                self.load_client()
            if self.control.fileno() in events and not self.take_request():
                return

    def load_client(self) -> None:
        """A child of ours needed Redis and imported redis-py and the client, a quarter of a
        second each time: from now on they are here, and its siblings inherit them."""
        _close(list(self._loaded or ()))
        self._loaded = None
        try:
            import blueque.client  # noqa: F401 - loaded for the children to inherit
        except Exception:  # children import it themselves, as before
            log.exception("fork server: cannot load the client for its task processes")
            return
        gc.freeze()
        log.info("fork server: a task process used Redis; the client is loaded here now, "
                 "for the next ones")
        self.send(LoadedAnswer(loaded=True))  # its listener retires the spares made before

    def take_request(self) -> bool:
        """One request; False once the listener is gone."""
        try:
            data, fds, _, _ = socket.recv_fds(self.control, MESSAGE_BYTES, MAX_FDS)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            _close(fds)
            return False
        try:
            message = cast(ToForkServer, json.loads(data))
            if "reap" in message:
                self.reap([int(pid) for pid in message["reap"]])
                return True
            reply = self.fork(message["fork"], fds)
        except (ValueError, KeyError, TypeError) as error:
            reply = RefusedAnswer(refused=f"a request it cannot read: {error}")
        finally:
            _close(fds)
        return self.send(reply)

    def reap(self, pids: list[int]) -> None:
        """The exits the listener settled: their zombies go (their pids may be reused)."""
        for pid in set(pids) & self.reported:
            self.reported.discard(pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def fork(self, request: ForkOrder, fds: list[int]) -> ForkedAnswer | RefusedAnswer:
        if len(fds) not in (1, 3):
            return RefusedAnswer(refused=f"{len(fds)} descriptors (1 or 3 expected)")
        assignment = Assignment(
            str(request["task"]), str(request["queue"]), str(request["listener"]),
            float(request["patience"]),
            None if self.setup.spool is None else Spool(self.setup.spool),
            (fds[1], fds[2]) if len(fds) == 3 else None, str(request.get("node") or ""))
        reuse = int(request.get("reuse") or 1)
        spare = bool(request.get("spare"))
        try:
            pid = os.fork()
        except OSError as error:  # EAGAIN at a pids limit, ENOMEM
            return RefusedAnswer(refused=str(error))
        if pid == 0:
            self._child(assignment, fds[0], reuse, spare)
        self.children.add(pid)
        failpoints.hit("forkserver-after-spare-fork" if spare else "forkserver-after-fork")
        return ForkedAnswer(forked=pid, created=create_time(pid))

    def _child(self, assignment: Assignment, sock: int, reuse: int, spare: bool) -> NoReturn:
        try:
            self.control.close()
            _close([self._wake_r, self._wake_w])
            loaded = None
            if self._loaded is not None:
                _close([self._loaded[0]])
                loaded = self._loaded[1]
            store = cast("RedisStore", LazyStore(self.setup, loaded=loaded))
            run_task_process(store, socket.socket(fileno=sock), assignment, self.function,
                             self.setup.task_logs, reuse, spare)
        finally:
            leave_process(1)

    def report_exits(self) -> None:
        """Each child that exited: reported, and left a zombie (waitid with WNOWAIT) until the
        listener says it settled it. Killed meanwhile, this server leaves its zombies to its
        listener (a child subreaper), which reaps them: never an exit nobody heard of."""
        for pid in sorted(self.children):
            try:
                found = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                self.children.discard(pid)
                continue
            if found is None or found.si_pid == 0:
                continue
            if not self.send(ExitedAnswer(exited=pid, status=raw_status(found))):
                return
            self.children.discard(pid)
            self.reported.add(pid)

    def send(self, message: FromForkServer) -> bool:
        try:
            self.control.sendall(json.dumps(message).encode())
        except OSError:
            return False
        return True


def raw_status(found: os.waitid_result) -> int:
    """waitid's answer as waitpid's status word (what os.waitstatus_to_exitcode reads)."""
    if found.si_code == os.CLD_EXITED:
        return (found.si_status & 0xFF) << 8
    return found.si_status | (0x80 if found.si_code == os.CLD_DUMPED else 0)


def _read_some(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except (BlockingIOError, InterruptedError):
        return False


def _tell(fd: int | None) -> None:
    """A child's word to its fork server that it imported the client (its pipe may be closed:
    the server loaded it already, or is gone)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(fd, b"1")


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def main(argv: list[str]) -> int:
    """``python -m blueque.task_process.forkserver FD [ROOM]``: set up, import, say ready, serve
    (ROOM:
    blanks that keep room in the command line for the titles of the processes it forks)."""
    # Ctrl-C on the listener's terminal is the listener's to handle: it closes our socket
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    control = socket.socket(fileno=int(argv[1]))
    data = control.recv(MESSAGE_BYTES)
    if not data:
        return 0
    setup = cast(Setup, pickle.loads(data))
    sys.path[:] = setup.sys_path
    log_setup.configure(setup.log_format, setup.log_level)
    set_title(f"blueque fork server {setup.function}")
    try:
        function = import_function(setup.function)
    except Exception as error:  # CallbackError, or anything the module raised
        control.sendall(json.dumps(FailedAnswer(failed=str(error))).encode())
        return 1
    # each child sets its parent-death signal with libc's prctl: looked up here, once, for
    # them all to inherit
    libc_prctl()
    gc.freeze()  # what it holds stays put: its children's collections never copy it
    server = ForkServer(control, setup, function)
    if not server.send(ReadyAnswer(ready=os.getpid())):
        return 0
    server.serve()
    return 0


if __name__ == "__main__":  # run as blueque.task_process.forkserver, the module its setup names
    from blueque.task_process.forkserver import main as _main

    sys.exit(_main(sys.argv))
