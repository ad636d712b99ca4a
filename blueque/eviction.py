"""Whether Redis may delete Blueque's keys to make room: its ``maxmemory-policy``.

Blueque's keys are the only record of every acknowledged task, the pending lists, the leases
and the running attempts. A Redis that evicts keys when it reaches ``maxmemory`` loses them
without a word (with ``allkeys-lru``, 199 of 200 acknowledged tasks, the pending list and a
listener's lease went). So the listener, the scheduler and the dashboard refuse to start on a
server whose policy is anything but ``noeviction`` unless told to accept it (``--allow-
eviction``, ``BLUEQUE_ALLOW_EVICTION=1``, ``allow_eviction=True``), and ``blueque status``
and the dashboard say so (docs/how-to/persistence.md).

The ``volatile-*`` policies evict only keys with a TTL, and so never a pending or running
task, a reserved list nor a lease; they are refused all the same, because Blueque's keys with
a TTL are not disposable either: a running task's checkpoint (its resume point: evicted, its
next attempt starts from zero), a finished task's result kept for ``result_ttl`` (evicted
before anyone read it), a node's run records (by which the node's next listener adopts or
stops the runs of a dead one), task output and the outcome counters behind the metrics.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from blueque.display import format_bytes
from blueque.errors import EvictingServer

#: The one policy under which Redis never deletes a key to make room (it refuses writes).
SAFE_POLICY = "noeviction"
#: What makes a Redis safe for Blueque.
FIX = f"CONFIG SET maxmemory-policy {SAFE_POLICY}"
#: Set to 1 (or true, yes) to let a listener, scheduler or dashboard start on an evicting Redis.
ALLOW_VARIABLE = "BLUEQUE_ALLOW_EVICTION"


@dataclass(frozen=True)
class MemoryPolicy:
    """What a Redis server does when it reaches ``maxmemory``, as it told: ``policy`` (its
    ``maxmemory-policy``) and ``maxmemory`` (bytes, 0 for no limit), each None when neither
    ``CONFIG GET`` nor ``INFO memory`` said; ``source`` says which answered, ``why`` why
    neither did."""

    where: str
    policy: str | None
    maxmemory: int | None = None
    source: str = ""
    why: str = ""

    @property
    def evicts(self) -> bool:
        """Every policy but noeviction deletes keys (an unknown name too: Upstash's
        ``optimistic-volatile``, a future one)."""
        return self.policy is not None and self.policy != SAFE_POLICY

    @property
    def known(self) -> bool:
        return self.policy is not None

    def limit(self) -> str:
        if self.maxmemory is None:
            return "maxmemory unknown"
        if not self.evicts:  # noeviction: a full Redis refuses writes, deletes nothing
            return ("maxmemory 0: no limit" if self.maxmemory == 0 else
                    f"maxmemory {format_bytes(self.maxmemory)}: when full it refuses writes")
        if self.maxmemory == 0:
            return "maxmemory 0: no limit yet, but one CONFIG SET maxmemory makes it evict"
        return f"maxmemory {format_bytes(self.maxmemory)}"

    def summary(self) -> str:
        """One line for `blueque status`."""
        if not self.known:
            return f"Redis {self.where}: maxmemory-policy unknown ({self.why})"
        text = f"Redis {self.where}: maxmemory-policy {self.policy} ({self.limit()})"
        return f"{text}. WARNING: {self.danger()}" if self.evicts else text

    def loses(self) -> str:
        """What an evicting policy deletes."""
        kind = ("keys with a TTL to make room: checkpoints of running tasks, results not yet "
                "read, a node's run records" if (self.policy or "").startswith("volatile") else
                "any key to make room: acknowledged tasks, pending lists, leases of live "
                "listeners, running attempts")
        return f"when Redis is full it deletes {kind}, all lost without a word"

    def danger(self) -> str:
        """Why an evicting policy loses work, and how to fix it."""
        return (f"{self.loses()}. Run `redis-cli {FIX}` (and set it in redis.conf so that it "
                "survives a restart), or give Blueque a Redis of its own")

    def refusal(self, role: str, flag: str = "--allow-eviction") -> str:
        """The message of a daemon that will not start on it."""
        return (f"Redis {self.where} has maxmemory-policy {self.policy} ({self.limit()}): "
                f"{self.danger()}. Not starting the {role}; to start it anyway, pass {flag} "
                f"(or set {ALLOW_VARIABLE}=1)")

    def as_dict(self) -> dict[str, object]:
        """For `blueque status --json`."""
        return {"where": self.where, "maxmemory_policy": self.policy,
                "maxmemory": self.maxmemory, "evicts": self.evicts, "source": self.source,
                "warning": self.danger() if self.evicts else
                (None if self.known else f"maxmemory-policy unknown: {self.why}")}


def allowed(explicit: bool | None) -> bool:
    """Whether an evicting Redis is accepted: ``explicit`` when given (a flag, an argument),
    else $BLUEQUE_ALLOW_EVICTION (read when asked, never at import)."""
    if explicit is not None:
        return explicit
    return os.environ.get(ALLOW_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


def check(policy: MemoryPolicy, role: str, allow: bool | None, log: logging.Logger,
          flag: str = "--allow-eviction") -> None:
    """At a daemon's start: refuse an evicting Redis (EvictingServer) unless ``allow``
    (see ``allowed``), then warn; an unknown policy is said once and the daemon goes on."""
    if not policy.known:
        log.warning("%s: cannot tell whether Redis %s may evict Blueque's keys (%s); make sure "
                    "its maxmemory-policy is %s", role, policy.where, policy.why, SAFE_POLICY)
    elif policy.evicts:
        if not allowed(allow):
            raise EvictingServer(policy.refusal(role, flag))
        log.warning("%s started on Redis %s although its maxmemory-policy is %s (%s): %s",
                    role, policy.where, policy.policy, policy.limit(), policy.danger())


class PolicyWatch:
    """A daemon's looks at the policy: the first one at its start (``check``: refused, or
    accepted with a warning), then each later one (the listener's, after each renewal): an
    operator's ``CONFIG SET maxmemory-policy allkeys-lru`` while it runs is said (at error
    unless ``allow``), once, and so is the way back to noeviction. A later look never stops
    the daemon: its runs would be orphaned, and no key is evicted until Redis is full."""

    def __init__(self, role: str, allow: bool | None, log: logging.Logger) -> None:
        self.role, self.allow, self.log = role, allow, log
        self.started = False  # the first look (``check``) was made
        self.evicting: bool | None = None  # as last seen (None: not known yet)

    def look(self, policy: MemoryPolicy) -> None:
        """Raises EvictingServer at the first look only."""
        if not self.started:
            check(policy, self.role, self.allow, self.log)
            self.started = True
        if not policy.known:
            return  # said once at start; a look that could not tell changes nothing
        before, self.evicting = self.evicting, policy.evicts
        if before is None or before == policy.evicts:
            return
        if policy.evicts:
            level = logging.WARNING if allowed(self.allow) else logging.ERROR
            self.log.log(level, "%s: Redis %s's maxmemory-policy was changed to %s while it "
                         "runs (%s): %s", self.role, policy.where, policy.policy,
                         policy.limit(), policy.danger())
        else:
            self.log.warning("%s: Redis %s's maxmemory-policy is %s again", self.role,
                             policy.where, policy.policy)
