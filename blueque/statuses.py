"""The words Blueque's state is written in, beside its keys (blueque.keys): a task's statuses
(blueque 1.0.1's, and ``waiting``) and states (a status, or cancelled), and the words the
scripts take and count: lease.lua's modes, recover.lua's verdicts, the outcomes of a task's
run or life. PROTOCOL.md 2 and 4 define them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple

#: Statuses of blueque 1.0.1; Blueque adds one, ``waiting``, written only for a task enqueued
#: with ``after=`` (it waits for other tasks to end: PROTOCOL.md 4, 5.21); cancelled tasks are
#: ``failed``.
WAITING = "waiting"
SCHEDULED = "scheduled"
PENDING = "pending"
RESERVED = "reserved"
STARTED = "started"
COMPLETE = "complete"
FAILED = "failed"
STATUSES = (WAITING, SCHEDULED, PENDING, RESERVED, STARTED, COMPLETE, FAILED)
FINISHED_STATUSES = (COMPLETE, FAILED)
#: Not a status: a task that was cancelled has status ``failed`` and a ``cancelled`` stamp
#: (what blueque 1.0.1 can read), and its id is kept in the queue's cancelled list, not in
#: its failed list, so that it is counted, listed and retried apart (PROTOCOL.md 2, 4).
CANCELLED = "cancelled"
#: Where a task can be: its status, or cancelled (shown, counted and listed on its own).
STATES = (*STATUSES, CANCELLED)
#: The lists of ended tasks: complete, failed, cancelled (newest at the left).
ENDED_LISTS = (COMPLETE, FAILED, CANCELLED)


def state_of(data: Mapping[str, str]) -> str | None:
    """A task hash's state: its status, except ``cancelled`` for a failed task stamped
    cancelled; None for a missing hash (no status)."""
    status = data.get("status")
    if status == FAILED and data.get("cancelled"):
        return CANCELLED
    return status


def finish_time(data: Mapping[str, str]) -> str | None:
    """When a finished task ended, as its hash says it (PROTOCOL.md 3): ``finished_at``, which
    Blueque wrote before issue 29, else ``updated``, which the script that ended it wrote then;
    None for a task that has not finished (or a missing hash)."""
    if data.get("status") not in FINISHED_STATUSES:
        return None
    return data.get("finished_at") or data.get("updated")


def status_of_list(state: str) -> str:
    """The status a task in an ended list has: complete, or failed (the cancelled list's
    tasks are failed too)."""
    return FAILED if state == CANCELLED else state

#: lease.lua's modes (PROTOCOL.md 5.12).
LeaseMode = Literal["register", "renew", "release"]
#: How a listener's death was established, for recover.lua: its lease expired, or its pid is
#: gone on its own node (PROTOCOL.md 5.12).
RecoverMode = Literal["lease", "host"]
#: What recover.lua does with one task of a dead listener.
VerdictKind = Literal["pending", "preempted", "retry", "failed", "cancelled", "drop"]


class Verdict(NamedTuple):
    """One task's verdict for recover.lua (PROTOCOL.md 5.12)."""

    task_id: str
    attempts: str  # as the caller saw them: recover.lua applies the verdict only if unchanged
    kind: VerdictKind
    eta: float | None = None  # retry: when the next attempt runs
    error: str = ""  # why (failed, retry, cancelled, preempted)


#: How a task's run or life ended, as counted in finished_per_minute and outcome_counts:
#: complete, failed (for good), cancelled (failed with ``cancelled``), retry (a failed attempt
#: scheduled to run again).
OUTCOMES = ("complete", "failed", "cancelled", "retry")
