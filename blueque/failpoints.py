"""Failure injection for the crash-window tests of PROTOCOL.md 6.2: real processes killed (or
held) at named points of the reporting path, so each window is tested as it happens.

``BLUEQUE_FAILPOINTS=name[:seconds],...`` in a listener's environment (inherited by its task
processes): at point ``name`` the process SIGKILLs itself, or with ``:seconds`` sleeps that
long (the test acts meanwhile, e.g. restarts Redis). Without the variable every ``hit`` is one
set lookup. Points: ``listener-before-stamp``, ``listener-before-go``,
``listener-before-finish``, ``listener-before-recorded``, ``child-after-outcome``;
``listener-before-warm-stamp`` (a warm process told its next task, PROTOCOL.md 6.7),
``listener-after-take`` (an ending's round trip took the next task ahead, 6.2);
``forkserver-after-fork`` (the fork server, between its fork and its answer, 6.8), and
``forkserver-after-spare-fork`` (the same, for a process made ahead of its task);
``listener-after-lease`` (registration, between a queue's lease and its listeners set, 6).
"""

from __future__ import annotations

import os
import signal
import time


def _parse(text: str) -> dict[str, float | None]:
    points: dict[str, float | None] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, seconds = item.partition(":")
        points[name] = float(seconds) if seconds else None
    return points


_POINTS = _parse(os.environ.get("BLUEQUE_FAILPOINTS", ""))


def hit(name: str) -> None:
    if name not in _POINTS:
        return
    seconds = _POINTS[name]
    if seconds is None:
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        time.sleep(seconds)
