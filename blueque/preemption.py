"""Preemption with notice (PROTOCOL.md 6.3): a node about to go away tells its listeners,
which stop taking tasks and tell their task processes, so that a long job saves a checkpoint
and stops, to resume elsewhere without spending an attempt.

The listener's side is NodePreemption (the request, read from Redis or given by SIGUSR1, and
its deadline); the task's side is ``preempted()``, ``preempt_deadline()`` and ``on_preempt``,
fed by SIGUSR1 and the frame its listener sends before it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from blueque.display import format_seconds
from blueque.errors import Preempted
from blueque.policy import field_float
from blueque.process import signal_pid
from blueque.reporting import ParentLink, PreemptFrame, ToChild

if TYPE_CHECKING:
    from blueque.store import RedisStore

log = logging.getLogger("blueque.child")
#: the listener's side logs as the listener daemon does
listener_log = logging.getLogger("blueque.daemon")


class Preemption:
    """The notice that this task's node goes away (PROTOCOL.md 6.3), as a task process gets
    it: SIGUSR1 from its listener, whose frame before it gives the deadline. The handler runs
    in the task's main thread, between two bytecodes: it notes the notice and runs the
    callbacks registered with ``on_preempt``. A callback that raises blueque.Preempted while
    the task function runs stops it there (``running``: set around the call by
    blueque.task_process.calling.execute); any other exception in one is logged, never raised into
    the
    task."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.noticed = False
        self.callbacks: list[Callable[[], object]] = []
        self.link: ParentLink | None = None
        self.running = False

    def install(self, link: ParentLink | None) -> None:
        self.link = link
        signal.signal(signal.SIGUSR1, self._notice)

    def _notice(self, signum: int, frame: object) -> None:
        if self.link is not None:
            for message in self.link.pending():
                if "preempt" in message:
                    with contextlib.suppress(TypeError, ValueError):
                        self.deadline = float(message["preempt"])
        if self.noticed:
            return
        self.noticed = True
        log.warning("%s: it should save what it has and stop (raise blueque.Preempted)",
                    self.why() if self.deadline is None else
                    f"{self.why()} in {max(0.0, self.deadline - time.time()):.0f} s")
        for callback in list(self.callbacks):
            self.call(callback)

    def why(self) -> str:
        """What the notice means: a node going away comes with its deadline (a frame before
        the signal); a notice without one is an exclusive task's listener that cannot renew
        its lease (PROTOCOL.md 6.6), whose node stays. A task that raised Preempted with no
        notice at all is taken at its word (its node goes away)."""
        if self.deadline is not None or not self.noticed:
            return "this task's node goes away"
        return ("this task's listener cannot renew its lease with Redis (unreachable or too "
                "slow), and an exclusive task is stopped before its lease can lapse")

    def call(self, callback: Callable[[], object]) -> None:
        try:
            callback()
        except Preempted:
            if self.running:
                raise  # out of the task function, where it is: recorded as preempted
            log.warning("an on_preempt callback raised Preempted after the task function "
                        "ended; its outcome stands")
        except Exception:
            log.exception("an on_preempt callback raised; the task goes on")


notice = Preemption()


def preempted() -> bool:
    """True once this task's node has announced that it goes away (``blueque preempt`` or
    SIGUSR1 to the listener): save a checkpoint and stop by raising ``blueque.Preempted``;
    the task then runs again elsewhere without spending an attempt."""
    return notice.noticed


def preempt_deadline() -> float | None:
    """When the node goes away (Unix s) once preempted, if its listener said; None else.
    After it, the task's process group is terminated."""
    return notice.deadline


def on_preempt(callback: Callable[[], object]) -> None:
    """Call ``callback()`` (in the task's main thread) when the node announces that it goes
    away; at once if it already has. Typically it saves a checkpoint and sets a flag the task
    loop checks, or raises blueque.Preempted to stop the task where it is."""
    notice.callbacks.append(callback)
    if notice.noticed:
        notice.call(callback)


class NodePreemption:
    """A listener's view of its node's preemption: SIGUSR1 (its own ``grace``), or a request
    for its node name in Redis (read when its message comes, and at every renewal in case the
    message was missed). ``deadline`` (Unix s) once preempted; an earlier one replaces it."""

    def __init__(self, store: RedisStore, node_name: str, listener: str,
                 clock: Callable[[], float], grace: float = 90.0) -> None:
        self.store, self.node_name, self.listener, self.clock = store, node_name, listener, clock
        self.grace = grace
        self.deadline: float | None = None
        self.at = 0.0  # the same deadline, on ``clock``
        self.signalled = False  # SIGUSR1 arrived (or SIGTERM, --on-stop=preempt)
        self.signal_name = "SIGUSR1"
        self.heard = True  # read blueque_preempt_[node name] at the next look
        self._seen = ""  # requested_at of the request acted on (or found stale)
        #: a request made before this (Unix s) whose deadline has passed is over: the node
        #: is still here. One made since (--grace 0) is acted on, however late it is read
        self.started = self.store.now()

    def hear(self) -> None:
        """A request may wait in Redis (its message came, or one may have been missed): read
        it at the next look. Called from the subscriber thread too (a bool's write)."""
        self.heard = True

    def on_signal(self, signum: int, frame: object) -> None:
        """SIGUSR1's handler (and SIGTERM's with --on-stop=preempt): acted on at the loop's
        next step (the wakeup fd wakes it)."""
        self.signal_name = signal.Signals(signum).name
        self.signalled = True

    def news(self) -> tuple[float, str] | None:
        """A deadline to act on, with why, or None."""
        if self.signalled:
            self.signalled = False
            return self.store.now() + self.grace, self.signal_name
        if not self.heard:
            return None
        self.heard = False
        request = self.store.preemption(self.node_name)
        requested = request.get("requested_at", "")
        if not request or requested == self._seen:
            return None
        self._seen = requested
        deadline = field_float(request.get("deadline"))
        if deadline is None:
            listener_log.error("listener %s: unreadable preemption request %r ignored",
                               self.listener, request)
            return None
        made = field_float(requested) or 0.0  # unreadable: as old as can be
        if deadline <= self.store.now() and self.deadline is None and made < self.started:
            listener_log.info("listener %s: a preemption of node %s that ended %s ago is "
                              "ignored (the node is still here)", self.listener,
                              self.node_name, format_seconds(self.store.now() - deadline))
            return None
        return deadline, request.get("reason") or "blueque preempt"

    def take(self, deadline: float) -> bool:
        """Adopt ``deadline`` if it is the first or an earlier one."""
        if self.deadline is not None and deadline >= self.deadline:
            return False
        self.deadline = deadline
        self.at = self.clock() + max(0.0, deadline - self.store.now())
        return True

    def due(self) -> bool:
        return self.deadline is not None and self.clock() >= self.at

    def announce(self, deadline: float, why: str, notify: Callable[[ToChild, int], int],
                 adopted: Iterable[int]) -> bool:
        """This node goes away at ``deadline`` (Unix s): tell every task process of ours (a
        frame with the deadline, then SIGUSR1, through ``notify``) and the adopted runs
        (SIGUSR1 alone), so that they save and stop. False if an earlier deadline stands."""
        if not self.take(deadline):
            return False
        # the task process reads its deadline on its host's clock (preempt_deadline())
        told = notify(PreemptFrame(preempt=self.store.clock.to_local(deadline)),
                      signal.SIGUSR1)
        for pid in adopted:
            told += 1
            signal_pid(pid, signal.SIGUSR1)
        listener_log.warning("listener %s: node %s goes away in %s (%s): taking no more "
                             "tasks; told %d task(s)", self.listener, self.node_name,
                             format_seconds(max(0.0, deadline - self.store.now())), why, told,
                             extra={"event": "preempted", "deadline": deadline})
        return True

    def check(self, notify: Callable[[ToChild, int], int], adopted: Iterable[int]
              ) -> bool:
        """Act on news of this node's preemption (SIGUSR1, or a request in Redis): announce
        its deadline to our task processes. True if a new (or earlier) deadline now stands."""
        news = self.news()
        return news is not None and self.announce(*news, notify, adopted)

    def deadlines(self) -> list[float]:
        """When the deadline comes (on ``clock``), while it is ahead: the loop's wait ends
        then."""
        return [self.at] if self.deadline is not None and self.at > self.clock() else []
