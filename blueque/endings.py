"""How a run that did not simply complete ends: the one rule (PROTOCOL.md 6.2) that every
path recording a run's end follows — the listener for what its child reported or for how it
exited, a child whose listener is gone for itself, and recovery for a dead listener's run.

A pure function of the task's policy and fields: cancelled wins (failed, stamped cancelled);
a preemption puts the task back without spending an attempt, until ``max_preemptions``; any
other failure is retried by the policy while attempts remain (preempted runs not counted).
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from blueque.policy import Policy

#: What a run reports or comes to before the rule: it returned, it raised (or died), or it
#: stopped because its node goes away.
Ran = Literal["complete", "failed", "preempted"]
#: What finish records (finish.lua's outcomes).
Outcome = Literal["complete", "failed", "retry", "preempted"]
#: Why its listener stopped it, if it did ("" for a run that ended by itself). "lease": an
#: exclusive run stopped because its listener could not renew its lease (PROTOCOL.md 6.6),
#: put back as a preempted one is, though its node is not going away.
Stopped = Literal["", "time limit", "cancelled", "shutdown", "superseded", "preempted",
                  "lease"]


@dataclass(frozen=True)
class Ending:
    outcome: Outcome
    text: str  # the result, or the error (or why it was preempted)
    eta: float | None = None  # retry: when the next attempt runs
    cancelled: bool = False  # failed because it was cancelled: stamped ``cancelled``


def _count(fields: Mapping[str, str], name: str) -> int:
    raw = fields.get(name) or "0"
    return int(raw) if raw.isdigit() else 0


def decide(policy: Policy, task: Mapping[str, str], ran: Ran, text: str, now: float, *,
           retry: bool = True, stopped: Stopped = "",
           rng: random.Random | None = None) -> Ending:
    """The ending of one run of ``task`` (its hash's fields). ``retry`` False: the work
    finished but its value could not be recorded, so running it again would not help."""
    if ran == "complete":
        return Ending("complete", text)
    if stopped == "cancelled" or task.get("cancel_requested"):
        reason = task.get("cancel_reason") or "cancelled"  # with the operator's --reason
        return Ending("failed", f"{reason} ({text})", cancelled=True)
    if ran == "preempted" or stopped in ("preempted", "lease"):
        done = _count(task, "preemptions")
        if done >= policy.max_preemptions:
            return Ending("failed", f"preempted {done + 1} times, more than its max_preemptions "
                                    f"of {policy.max_preemptions}: stopped so that it does not "
                                    f"loop ({text})")
        return Ending("preempted", text)
    eta = policy.retry_eta(Policy.attempts_used(task), now, rng) if retry else None
    return Ending("failed" if eta is None else "retry", text, eta)


@dataclass(frozen=True)
class RunEnd:
    """One run's ending as finish.lua records it (PROTOCOL.md 5.6): which run (the task, the
    listener that reserved it, its process and attempt, the fencing token), what it came to,
    and when."""

    queue: str
    task_id: str
    listener: str
    pid: int | None
    attempt: int | None  # None: unfenced (a task 1.0.1 reserved)
    outcome: Outcome
    text: str  # the result, the error, or why it was preempted
    now: float
    retry_eta: float | None = None
    result_ttl_ms: int | None = None  # complete and failed: how long the task is kept
    cancelled: bool = False  # a failed run that was cancelled: stamped ``cancelled``
    traceback: str | None = None


#: What a task may be after recover took back a run that was in fact alive (PROTOCOL.md 5.6,
#: "A late ending"), and the history outcomes recover writes for a started run.
LATE_STATUSES = ("failed", "scheduled", "pending")
RECOVERED_OUTCOMES = ("failed", "retry", "preempted")


def late_ending_allowed(task: Mapping[str, str], listener: str, attempt: int) -> bool:
    """Whether finish.lua would record the late ending of ``attempt``, run by ``listener``
    (PROTOCOL.md 5.6): recover took this very attempt back from it, and no newer attempt has
    started (nor was the task cancelled). The twin of finish.lua's ``late``."""
    if task.get("attempts") != str(attempt) or task.get("status") not in LATE_STATUSES:
        return False
    if task.get("cancelled"):
        return False
    try:
        history = json.loads(task.get("history") or "[]")
    except ValueError:
        return False
    last = history[-1] if isinstance(history, list) and history else None
    return (isinstance(last, dict) and last.get("recovered") is True
            and last.get("node") == listener
            and str(last.get("attempt")) == str(attempt)
            and last.get("outcome") in RECOVERED_OUTCOMES)


def describe_exit(status: int, reason: str, time_limit: float) -> str:
    """What an unreported ending means, for the task's error field."""
    if reason == "time limit":
        return f"time limit of {time_limit:g} s exceeded: the task's process group was killed"
    if reason == "cancelled":
        return "cancelled while it ran: its process group was terminated"
    if reason == "shutdown":
        return "terminated because its listener shut down (--on-stop=terminate)"
    if reason == "preempted":
        return ("preempted: its node goes away, and it still ran at the deadline; its process "
                "group was terminated")
    if reason == "lease":
        return ("stopped by its listener, which could not renew its lease with Redis (Redis "
                "unreachable or too slow): an exclusive task is stopped before its lease can "
                "lapse, so that it never runs twice; put back, its attempt not spent")
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        name = signal.Signals(signum).name if signum in signal.valid_signals() else str(signum)
        text = f"process killed by signal {name} ({signum}) without reporting an outcome"
        if signum == signal.SIGKILL:
            text += "; if nobody sent it, the kernel's out-of-memory killer may have"
        return text
    return f"process exited with code {os.WEXITSTATUS(status)} without reporting an outcome"
