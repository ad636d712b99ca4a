"""Exclusive runs (PROTOCOL.md 6.6): a listener that cannot renew its lease stops its exclusive
runs before the lease can lapse in anyone else's view, so that a task marked ``exclusive``
never runs twice at once, even on a node cut off from Redis. Enforced on the listener's own
monotonic clock by a thread of its own: no Redis, and no wait for a loop that may be stuck in
a Redis call until its socket times out."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping

from blueque.daemon.running import Running
from blueque.process import signal_group, signal_pid

log = logging.getLogger("blueque.daemon")

__all__ = ["KILL", "NOTICE", "TERM", "ExclusiveGuard"]

#: Shares of the lease, counted from the sending of the latest renewal that renewed every
#: lease: the preemption notice (SIGUSR1), SIGTERM, and SIGKILL.
NOTICE, TERM, KILL = 0.5, 0.625, 0.75
#: How often the guard's thread looks (s).
GUARD_PERIOD = 0.05


class ExclusiveGuard:
    """Watches how long ago the listener's leases were last renewed, and stops its exclusive
    runs (``everything``: all its runs, ``blueque listen --exclusive``) in time: SIGUSR1 (the
    preemption notice) at NOTICE of the lease, SIGTERM to the group at TERM (the run's ending
    is then put back as a preempted one's, its reason "lease"), SIGKILL to the group at
    KILL."""

    def __init__(self, children: Mapping[int, Running], lease_s: float, everything: bool = False,
                 clock: Callable[[], float] = time.monotonic,
                 kill: Callable[[int, int], None] | None = None) -> None:
        #: the Supervisor's runs by pid (shared, never copied; read from the guard's thread)
        self.children, self.lease_s, self.everything = children, lease_s, everything
        self.clock = clock
        self._kill = kill or signal_group
        #: when the latest renewal that held every lease (renewed or registered again) was
        #: sent (None: not yet)
        self.renewed: float | None = None
        self._sent: dict[int, int] = {}  # pid -> the last signal sent since that renewal
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def renewed_at(self, sent: float) -> None:
        """Every lease was renewed by a renewal sent at ``sent`` (this guard's clock)."""
        self.renewed = sent

    def exclusive(self, running: Running) -> bool:
        return self.everything or running.policy.exclusive == 1

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="blueque-exclusive",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._closed.set()

    def _watch(self) -> None:
        while not self._closed.wait(GUARD_PERIOD):
            try:
                self.step()
            except Exception:  # never let the guard die: log and go on
                log.exception("the exclusive runs' guard failed a step")

    def step(self) -> None:
        """Signal each exclusive run as far as the silence since the latest renewal says."""
        renewed = self.renewed
        if renewed is None:
            return
        silent = self.clock() - renewed
        wanted = (signal.SIGKILL if silent >= KILL * self.lease_s else
                  signal.SIGTERM if silent >= TERM * self.lease_s else
                  signal.SIGUSR1 if silent >= NOTICE * self.lease_s else None)
        if wanted is None:
            self._sent.clear()
            return
        for running in list(self.children.values()):
            if running.pid and self.exclusive(running) and running.exit_code is None:
                self._signal(running, wanted, silent)

    def _signal(self, running: Running, signum: int, silent: float) -> None:
        if self._sent.get(running.pid) == signum:
            return
        self._sent[running.pid] = signum
        if signum == signal.SIGUSR1:
            log.warning("task %s: exclusive, and no lease renewal for %.1f s (lease %g s): "
                        "preemption notice; it is stopped before its lease can lapse",
                        running.task_id, silent, self.lease_s)
            signal_pid(running.pid, signum)
            return
        if not running.reason:  # the one field this thread writes (Running's contract)
            running.reason = "lease"  # its ending: back to pending, no attempt spent
        log.warning("task %s: exclusive, no lease renewal for %.1f s: sending %s to its group",
                    running.task_id, silent, signal.Signals(signum).name)
        self._kill(running.pid, signum)
