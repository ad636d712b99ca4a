"""Making a listener's task process (PROTOCOL.md 6.2): a socket pair for its frames, a pipe for
its output when task output is captured (5.19), and a fork: by the listener's fork server when
it has a ready one (6.8: the child's ends go to it), else fork() here under the store's pool
lock. The child runs ``blueque.task_process.warm.run_task_process`` and never returns; the listener
keeps
its end of the socket and the read end of the pipe (see Recorder.settle)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from blueque.daemon.forks import ANSWER_WAIT, ForkServerLink
from blueque.process import create_time
from blueque.reporting import READ_SIZE, ChildChannel, encode
from blueque.store import RedisStore
from blueque.task_process.calling import TaskFunction
from blueque.task_process.child import Assignment
from blueque.task_process.warm import run_task_process
from blueque.tasklog import TaskLogSettings

log = logging.getLogger("blueque.daemon")


@dataclass(frozen=True)
class Forked:
    """A task process just forked: its pid, the listener's end of its socket, and the read
    end of its output pipe (None: its output is not captured)."""

    pid: int
    channel: ChildChannel
    output: int | None
    created: float | None  # its create time (as its fork server read it, if it forked it)


def fork_task_process(store: RedisStore, task_store: RedisStore, assignment: Assignment,
                      function: TaskFunction, task_logs: TaskLogSettings | None, reuse: int,
                      inherited: Callable[[], None], server: ForkServerLink | None = None
                      ) -> Forked | None:
    """Fork the process that runs ``assignment`` (its task moved into the listener's reserved
    list; ``reuse``: how many tasks it may run, 6.7), by ``server`` if it is ready. In a child
    forked here, ``inherited`` closes what it must not keep of the listener's (its siblings'
    sockets). None: no process could be forked (EAGAIN at a pids limit, ENOMEM), said in the
    log."""
    if server is not None and server.ready:
        made, ours, output = _ask(server, assignment, task_logs, reuse)
        if made is not None:
            return _made(made, assignment, ours, output)
        # it went away meanwhile: a child it may have made is told to stop, and is gone
        # before this one, forked here, takes its place (never one process too many, 6.8)
        _dismiss(ours, assignment)
        close_fds(output)
    ours, theirs = socket.socketpair()
    output = os.pipe() if task_logs is not None else None
    try:
        with _pool_lock(store):
            pid = os.fork()
    except OSError as error:  # EAGAIN at a pids limit (systemd TasksMax), ENOMEM
        ours.close()
        theirs.close()
        close_fds(output)
        log.error("task %s: cannot fork a process to run it (%s); putting it back",
                  assignment.task_id, error)
        return None
    if pid == 0:
        ours.close()
        inherited()
        run_task_process(task_store, theirs, replace(assignment, output=output), function,
                         task_logs, reuse)
    theirs.close()
    if output is not None:  # the read end stays ours too: see Recorder.settle
        os.close(output[1])
        os.set_blocking(output[0], False)
    return Forked(pid, ChildChannel(ours), None if output is None else output[0],
                  create_time(pid))


@dataclass(frozen=True)
class AskedSpare:
    """A spare asked for and not answered yet (ForkServerLink.ask_spare): our end of its
    socket pair and its output pipe."""

    ours: socket.socket
    output: tuple[int, int] | None

    def made(self, answer: tuple[int, float | None] | str | None,
             assignment: Assignment) -> Forked | str | None:
        """Its process, from the fork server's answer; else (a str: why it refused; None:
        it went away) our ends are closed."""
        if answer is None or isinstance(answer, str):
            self.ours.close()
            close_fds(self.output)
            return answer
        return _made(answer, assignment, self.ours, self.output)


def ask_spare(server: ForkServerLink, assignment: Assignment,
              task_logs: TaskLogSettings | None, reuse: int) -> AskedSpare | None:
    """Ask ``server`` for a spare (6.8) without waiting for its answer; None: it is not
    ready (nothing asked)."""
    ours, theirs = socket.socketpair()
    output = os.pipe() if task_logs is not None else None
    asked = AskedSpare(ours, output)
    sent = server.ask_spare(assignment, reuse, [theirs.fileno(), *(output or ())], asked)
    theirs.close()
    if not sent:
        ours.close()
        close_fds(output)
        return None
    return asked


def _ask(server: ForkServerLink, assignment: Assignment, task_logs: TaskLogSettings | None,
         reuse: int, spare: bool = False
         ) -> tuple[tuple[int, float | None] | str | None, socket.socket, tuple[int, int] | None]:
    """Ask ``server`` for a task process (ForkServerLink.fork): its answer, and our end of the
    process's socket pair and its output pipe (their ends, sent to it, are closed here)."""
    ours, theirs = socket.socketpair()
    output = os.pipe() if task_logs is not None else None
    made = server.fork(assignment, reuse, [theirs.fileno(), *(output or ())], spare=spare)
    theirs.close()
    return made, ours, output


def _dismiss(ours: socket.socket, assignment: Assignment) -> None:
    """The task process a fork server that died before its answer may have made: the only
    holder of the other end of ``ours`` once the server is gone. Told to stop (6.2: it never
    ran), then waited for (its end closes as it exits); none, and the send fails at once."""
    try:
        ours.settimeout(ANSWER_WAIT)
        ours.sendall(encode({"stop": "its fork server died before answering"}))
        while ours.recv(READ_SIZE):
            pass
    except OSError:  # no child (EPIPE), or one slower than ANSWER_WAIT: it reads its task
        pass
    finally:
        ours.close()
    log.warning("task %s: its fork server went away while making its process; forking it "
                "from the listener", assignment.task_id)


def _made(made: tuple[int, float | None] | str, assignment: Assignment, ours: socket.socket,
          output: tuple[int, int] | None) -> Forked | None:
    if isinstance(made, str):
        ours.close()
        close_fds(output)
        log.error("task %s: its fork server cannot fork a process to run it (%s); putting it "
                  "back", assignment.task_id, made)
        return None
    if output is not None:  # the read end stays ours too: see Recorder.settle
        os.close(output[1])
        os.set_blocking(output[0], False)
    return Forked(made[0], ChildChannel(ours), None if output is None else output[0], made[1])


def _pool_lock(store: RedisStore) -> contextlib.AbstractContextManager[object]:
    """The connection pool's lock, held across fork(): the child reuses the store, and
    redis-py resets an inherited pool under that lock; forked while the subscriber thread
    held it, the child's first command would wait forever."""
    lock = getattr(getattr(store.redis, "connection_pool", None), "_lock", None)
    return lock if lock is not None else contextlib.nullcontext()


def close_fds(fds: Iterable[int] | None) -> None:
    for fd in fds or ():
        with contextlib.suppress(OSError):
            os.close(fd)
