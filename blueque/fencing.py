"""Fencing: whether a run is its task's current run (PROTOCOL.md 5.6), the one rule that every
part judging a run follows — the listener recording a child's ending and stopping superseded
runs at each renewal, a child whose listener died before telling it to go, recovery stopping
the fenced runs of dead listeners; whether a run that is no longer current may take its task
back (reclaim.lua: it lived through a cut, and nothing newer started); and what recover.lua
does with a task whose run never ran it.

A pure function of the task's fields (its hash, empty when gone) and of what the run knows of
itself: its listener, its attempt (the fencing token, once the stamp told it) and its pid.
"""

from __future__ import annotations

from collections.abc import Mapping

from blueque.endings import late_ending_allowed
from blueque.statuses import PENDING, RESERVED, SCHEDULED, STARTED, Verdict

#: The statuses of a task that has a current run: reserved (stamped without a process, as a
#: Processor does) or started.
HELD = (RESERVED, STARTED)


def is_current_run(task: Mapping[str, str], listener: str, attempt: int | str | None,
                   pid: int | None = None) -> bool:
    """Whether the run of ``listener`` at ``attempt`` is the task's current run.

    The rule: the task is reserved or started (``status``), by that listener (``node``), at
    that attempt (``attempts``). A run that does not know its attempt (the stamp's reply never
    came, or its node record was written at fork, before the stamp) is the current run only
    if the stamp started the task for its very process: started, by that listener, with its
    ``pid``. A task whose hash is gone has no current run."""
    if task.get("status") not in HELD or task.get("node") != listener:
        return False
    if attempt is not None:
        return task.get("attempts") == str(attempt)
    return (task.get("status") == STARTED and pid is not None
            and task.get("pid") == str(pid))


def may_reclaim(task: Mapping[str, str], listener: str, attempt: int) -> bool:
    """Whether ``listener`` may take its task back for its live run at ``attempt``, which is
    not its task's current run any more (reclaim.lua, PROTOCOL.md 5.12b): recover took this
    very attempt back from it while the run lived (its node cut off longer than its lease),
    the task waits for its retry (scheduled, or pending once due), and no newer attempt has
    started (the late-ending rule, ``endings.late_ending_allowed``). Reclaimed, the run is
    the current run again by ``is_current_run``."""
    return (task.get("status") in (PENDING, SCHEDULED)
            and late_ending_allowed(task, listener, attempt))


def unstarted_verdict(task_id: str, task: Mapping[str, str], listener: str,
                      pid: int | None = None) -> Verdict:
    """recover.lua's verdict for a task in ``listener``'s reserved list that no run of it ran.

    Pending again (at the head of the line, its attempt not held against it) while the task
    waits: pending (moved into the list, never stamped), reserved by that listener (a stamp
    without a process), its hash gone, or started by the stamp for process ``pid`` of that
    listener, which never ran it (it was never told to go). Dropped from the list otherwise:
    the task moved on (finished, scheduled, held by another run)."""
    status = task.get("status")
    waiting = (not task or status == PENDING
               or (status == RESERVED and task.get("node") == listener)
               or (pid is not None and is_current_run(task, listener, None, pid)))
    return Verdict(task_id, task.get("attempts", ""), "pending" if waiting else "drop")
