"""The listener's side of its fork server (PROTOCOL.md 6.8, blueque.task_process.forkserver): start
it (and
start it again when it dies, said in the log), ask it for a task process, hear the exits it
reports. While it is not ready (starting, dead, broken) ``fork`` answers None and the listener
forks from itself, as without one: no task waits for it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

from blueque.config import Settings
from blueque.logs import JsonFormatter
from blueque.process import signal_pid
from blueque.task_process.child import Assignment
from blueque.task_process.forkserver import MESSAGE_BYTES, Setup
from blueque.task_process.server_frames import (
    ForkedAnswer,
    ForkOrder,
    ForkRequest,
    FromForkServer,
    ReapRequest,
    RefusedAnswer,
)
from blueque.tasklog import TaskLogSettings

#: Room in the fork server's command line for its children's titles. setproctitle writes a
#: title over the argv (and, unless SPT_NOENV is set, the environment after it); a title longer
#: than that room is cut, and a task's escaped processes are told apart by their whole title
#: (run_processes.find): a fork server run as ``python -m blueque.forkserver 7`` had 50 bytes.
TITLE_ROOM = " " * 512

log = logging.getLogger("blueque.daemon")

#: The largest setup sent (one packet of the control socket: its send buffer bounds it).
SETUP_BYTES = 64 * 1024
#: How long the listener waits for the fork server's answer to one request before it takes
#: it for broken (killed, then forked without it).
ANSWER_WAIT = 5.0
#: A fork server that lived less than this was not well: the next start waits, doubling up to
#: RESTART_MAX (one that cannot import the task function is not started in a tight loop).
SHORT_LIFE = 10.0
RESTART_MAX = 60.0


def server_setup(function: str, settings: Settings, checkpoint_max_bytes: int | None,
                 task_logs: TaskLogSettings | None, spool: Any) -> Setup | None:
    """The setup a listener gives its fork server: its own sys.path and log set-up. None
    (said in the log): its connection settings cannot be passed (a redis option that cannot
    be pickled), and it forks its task processes itself."""
    root = logging.getLogger()
    json_logs = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    try:
        setup = Setup(function, pickle.dumps(settings), checkpoint_max_bytes, task_logs,
                      None if spool is None else spool.directory, list(sys.path),
                      "json" if json_logs else "text", logging.getLevelName(root.level))
        if len(pickle.dumps(setup)) <= SETUP_BYTES:
            return setup
        why = "they are too large"
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        why = str(error)
    log.warning("the connection settings cannot be passed to a fork server (%s): task "
                "processes are forked from the listener", why)
    return None


class ForkServerLink:
    """One listener's fork server: its process, its control socket, the exits it reported."""

    wants_write = False  # for the loop's poll: we only read its socket between requests

    def __init__(self, setup: Setup, clock: Callable[[], float] = time.monotonic) -> None:
        self.setup, self.clock = setup, clock
        self.pid: int | None = None
        self.ready = False
        self.control: socket.socket | None = None
        self.exits: list[tuple[int, int]] = []  # (pid, raw status), reported, not settled
        #: it loaded the client since this was last read (spares_stale)
        self._stale = False
        #: the spares asked for and not answered yet (ask_spare), oldest first: its answers
        #: come in the order of the requests
        self._spares_asked: list[object] = []
        #: each asked spare's answer: (pid, create time), why it refused, or None (gone)
        self._spares_answered: list[tuple[object, tuple[int, float | None] | str | None]] = []
        self._started = 0.0
        self._delay = 0.0
        self._start_at = 0.0
        self.wanted = False  # started by the listener's run(), not yet stopped

    # --- its process ------------------------------------------------------------------------
    def start(self) -> None:
        """Start it (the listener's run() does), and later start it again whenever it is not
        running and its restart is due (its answer comes later)."""
        self.wanted = True
        self.restart()

    def restart(self) -> None:
        if not self.wanted or self.pid is not None or self.clock() < self._start_at:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            theirs.set_inheritable(True)
            self.pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-m", "blueque.task_process.forkserver", str(theirs.fileno()),
                 TITLE_ROOM],
                _environment(), setsid=True)  # a terminal's Ctrl-C is the listener's
            ours.sendall(pickle.dumps(self.setup))
        except OSError as error:
            log.error("cannot start a fork server (%s); forking task processes from the "
                      "listener", error)
            ours.close()
            self._later()
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        self.control, self.ready, self._started = ours, False, self.clock()

    def _later(self) -> None:
        lived = self.clock() - self._started
        self._delay = 0.0 if lived >= SHORT_LIFE else min(RESTART_MAX, max(1.0, self._delay * 2))
        self._start_at = self.clock() + self._delay

    def reaped(self, pid: int, status: int) -> bool:
        """Whether ``pid``, reaped by the listener, was its fork server (then it is started
        again, at once or after a wait, and its children, now the listener's, are reaped by
        the listener)."""
        if pid != self.pid:
            return False
        self.read()  # the exits it reported before it went
        self._drop()
        self._later()
        log.warning("fork server %d exited (%s); %s", pid, _describe(status),
                    "starting another" if not self._delay
                    else f"starting another in {self._delay:g} s")
        self.restart()
        return True

    def _drop(self) -> None:
        if self.control is not None:
            self.control.close()
        self.control, self.ready, self.pid = None, False, None

    def _broken(self, why: str) -> None:
        """It answered wrong or not at all: killed (its exit is reaped as any), not used."""
        log.error("fork server %s %s; forking task processes from the listener until "
                  "another starts", self.pid, why)
        if self.pid is not None:
            signal_pid(self.pid, signal.SIGKILL)
        if self.control is not None:
            self.control.close()
            self.control = None
        self.ready = False

    # --- its socket -------------------------------------------------------------------------
    def fileno(self) -> int:
        return -1 if self.control is None else self.control.fileno()

    def flush(self) -> None:
        """Nothing waits to be written (for the loop's poll)."""

    def read(self) -> None:
        """What it said meanwhile: that it is ready, or failed, and its children's exits."""
        while self.control is not None:
            message = self._receive(block=False)
            if message is None:
                return
            self._heard(message)

    def _receive(self, block: bool) -> FromForkServer | None:
        control = self.control
        if control is None:
            return None
        try:
            control.settimeout(ANSWER_WAIT if block else 0.0)
            data = control.recv(MESSAGE_BYTES)
        except (BlockingIOError, InterruptedError):
            return None
        except TimeoutError:
            self._broken(f"did not answer within {ANSWER_WAIT:g} s")
            return None
        except OSError as error:
            self._broken(f"cannot be read ({error})")
            return None
        if not data:  # it is gone: its exit is reaped as the listener's child
            self.close()
            return None
        try:
            message = json.loads(data)
        except ValueError:
            self._broken("said something that is not its frames")
            return None
        return cast(FromForkServer, message) if isinstance(message, dict) else None

    def _heard(self, message: FromForkServer) -> None:
        if ("forked" in message or "refused" in message) and self._spares_asked:
            self._spares_answered.append((self._spares_asked.pop(0), _answer(message)))
        elif "exited" in message:
            self.exits.append((int(message["exited"]), int(message["status"])))
        elif "loaded" in message:
            self._stale = True
        elif "ready" in message:
            self.ready = True
            log.info("fork server %s ready (%s)", self.pid, self.setup.function)
        elif "failed" in message:
            self._broken(f"could not start: {message['failed']}")

    def spares_stale(self) -> bool:
        """Whether the spares it made (6.8) are to be retired, since last asked: it loaded the
        client (they would import it themselves, a quarter of a second, where a process made
        now inherits it)."""
        self.read()
        stale, self._stale = self._stale, False
        return stale

    def take_exits(self) -> list[tuple[int, int]]:
        self.read()
        exits, self.exits = self.exits, []
        return exits

    def release(self, pids: list[int]) -> None:
        """Tell it the exits it reported are settled: it reaps them (a pid the listener may
        still signal is never free for another process before)."""
        if pids and self.control is not None:
            with contextlib.suppress(OSError):  # it is going: its zombies come to us
                self.control.settimeout(ANSWER_WAIT)
                self.control.send(json.dumps(ReapRequest(reap=pids)).encode())

    def fork(self, assignment: Assignment, reuse: int, fds: list[int], spare: bool = False
             ) -> tuple[int, float | None] | str | None:
        """Ask it for the task process of ``assignment`` (``fds``: the child's end of its
        socket, and its output pipe's ends; ``spare``: one made before its task, 6.8): its
        pid and create time; a str: it could not fork (EAGAIN...); None: it is not there
        (fork from the listener)."""
        if not self._request(assignment, reuse, fds, spare):
            return None
        while self.control is not None:
            message = self._receive(block=True)
            if message is None:
                return None
            if ("forked" in message or "refused" in message) and not self._spares_asked:
                return _answer(message)
            self._heard(message)  # a spare's answer (asked before) comes first
        return None

    def ask_spare(self, assignment: Assignment, reuse: int, fds: list[int],
                  token: object) -> bool:
        """Ask it for a process ahead of its task (6.8) without waiting for the answer: the
        loop goes on (its task's run, its outcome) while it forks. The answer comes with
        ``token`` from ``spares_made``. False: it is not ready, or could not be written to."""
        if not self._request(assignment, reuse, fds, spare=True):
            return False
        self._spares_asked.append(token)
        return True

    def _request(self, assignment: Assignment, reuse: int, fds: list[int], spare: bool
                 ) -> bool:
        """Send a fork request; False: it is not ready, or could not be written to."""
        self.read()
        if not self.ready or self.control is None:
            return False
        request = ForkRequest(fork=ForkOrder(
            task=assignment.task_id, queue=assignment.queue, listener=assignment.listener,
            patience=assignment.patience, node=assignment.node, reuse=reuse, spare=spare))
        try:
            self.control.setblocking(True)
            socket.send_fds(self.control, [json.dumps(request).encode()], fds)
        except OSError as error:
            self._broken(f"cannot be written to ({error})")
            return False
        return True

    def heard(self) -> bool:
        """Whether it said something read from its socket and not taken yet (exits, a spare's
        answer): the loop must not wait for its socket then, which has nothing more to say."""
        return bool(self.exits or self._spares_answered)

    def spares_asked(self) -> int:
        return len(self._spares_asked)

    def spares_made(self) -> list[tuple[object, tuple[int, float | None] | str | None]]:
        """The answers to ask_spare since last asked, with their tokens: (pid, create time),
        why it could not fork, or None: it went away before answering (a child it made
        meanwhile reads end of file once the token's socket is closed)."""
        self.read()
        if self.control is None:
            self._spares_answered += [(token, None) for token in self._spares_asked]
            self._spares_asked = []
        answered, self._spares_answered = self._spares_answered, []
        return answered

    def close(self) -> None:
        """Our end of its socket (it exits when it sees it closed); in a task process forked
        from the listener, so that it does not hold the fork server up."""
        if self.control is not None:
            self.control.close()
        self.control, self.ready = None, False

    def stop(self, patience: float = 2.0) -> None:
        """Close its socket and reap it (it exits at once; its children live on)."""
        self.wanted = False
        self.close()
        pid, self.pid = self.pid, None
        deadline = time.monotonic() + patience
        while pid is not None and time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    return
            except ChildProcessError:
                return
            time.sleep(0.01)


def _answer(message: ForkedAnswer | RefusedAnswer) -> tuple[int, float | None] | str:
    if "forked" in message:
        created = message.get("created")
        return int(message["forked"]), None if created is None else float(created)
    return str(message["refused"])


def exits(server: ForkServerLink | None) -> Iterator[tuple[int, int]]:
    """The exits a listener settles (pid, raw status): its own children's, reaped here (its
    fork server's own is the link's: it starts another), then those its fork server reported
    (its children, 6.8); then its fork server is started again if that is due."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if server is None or not server.reaped(pid, status):
            yield pid, status
    if server is not None:
        reported = server.take_exits()
        yield from reported
        server.release([pid for pid, _ in reported])  # settled: their pids may go
        server.restart()


def _environment() -> dict[str, str]:
    """The listener's environment, with the directory its own blueque package came from first
    on PYTHONPATH: the fork server runs the same code (its setup then gives it sys.path)."""
    home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": home if not path else os.pathsep.join((home, path))}


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
