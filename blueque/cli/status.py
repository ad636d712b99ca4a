"""`blueque status`: every queue's counts, every listener's leases, slots, memory, spool and
state, and the server's memory policy; once, or again and again (--watch)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time

from blueque import keyed, pausing
from blueque.cli.base import EXIT_OK, emit, json_text
from blueque.client import Client, ListenerStatus
from blueque.display import format_seconds, format_time, largest_memory, table
from blueque.errors import RedisUnavailable
from blueque.fields import LISTENER_FIELDS, typed
from blueque.placement import format_resources
from blueque.policy import field_float

#: What a terminal is sent before each snapshot of `status --watch`: cursor home, clear.
CLEAR_SCREEN = "\x1b[H\x1b[2J"


# --- status ---------------------------------------------------------------------------------
def cmd_status(client: Client, args: argparse.Namespace) -> int:
    if args.watch is not None:
        return _watch(client.bounded(max(1.0, args.watch)), args)
    data, text = _status(client)
    emit(args, data, text)
    return EXIT_OK


def _status(client: Client) -> tuple[dict[str, object], str]:
    """The status as JSON data and as text: every queue's counts, every listener's leases
    and slots."""
    queues = client.queue_names()
    # a fixed number of round trips, whatever the number of queues and listeners
    stats = [{**vars(counts), "name": name}
             for name, counts in zip(queues, client.store.counts_many(queues), strict=True)]
    listeners = client.listeners(queues)
    current = client.store.now()
    counts = ("pending", "scheduled", "reserved", "started", "complete", "failed", "cancelled",
              "waiting", "listeners")
    pauses = _pauses(client, stats)
    text = table(("QUEUE", *(c.upper() for c in counts)),
                 [(s["name"] + (" (PAUSED)" if s["paused"] else ""), *(s[c] for c in counts))
                  for s in stats]) if stats else "no queues"
    text += "".join(f"\n{p.queue} paused since {format_time(p.paused_at)}"
                    + (f": {p.reason}" if p.reason else "") for p in pauses.values())
    rows = [(item.listener, item.queue, item.host or "-", item.info.get("pid", "-"),
             _slots_text(item), _lease_text(item.lease_remaining),
             _age_text(item.renewed_age), _renewal_text(item.info),
             largest_memory(item.info.get("task_memory")), _state_text(item, current))
            for item in listeners]
    text += "\n\n" + (table(("LISTENER", "QUEUE", "HOST", "PID", "SLOTS", "LEASE", "RENEWED",
                             "RENEWAL", "MEMORY", "STATE"), rows) if rows else "no listeners")
    keys = client.key_states()
    if keys:
        text += "\n\n" + table(("KEY", "LIMIT", "HOLDING", "WAITING"), [
            (key.key, "none" if key.limit is None else key.limit, key.holding, key.waiting)
            for key in keys])
    unplaceable = client.store.perform(keyed.unplaceable, queues)  # 5.22
    text += "".join(f"\n\nqueue {queue}: task {task_id} requires {format_resources(needs)}, "
                    f"but {why}: it waits until one does"
                    for queue, found in unplaceable.items() for task_id, needs, why in found)
    policy = client.store.memory_policy()  # anything but noeviction loses tasks silently
    text += "\n\n" + policy.summary()
    data = {"time": current, "queues": stats,
            "listeners": [{**vars(item), "info": typed(item.info, LISTENER_FIELDS)}
                          for item in listeners],
            "keys": [{"key": key.key, "limit": key.limit, "holding": key.holding,
                      "waiting": key.waiting} for key in keys],
            "unplaceable": {queue: [{"task": task_id, "requires": needs, "why": why}
                                    for task_id, needs, why in found]
                            for queue, found in unplaceable.items()},
            "redis": policy.as_dict()}
    return data, text


def _pauses(client: Client, stats: list[dict[str, object]]) -> dict[str, pausing.Pause]:
    """The pauses of the paused queues (PROTOCOL.md 5.16c), each also put in its queue's
    ``pause`` ({reason, paused_at}) for --json."""
    pauses = client.store.perform(pausing.pauses, [str(s["name"]) for s in stats
                                                   if s["paused"]])
    for entry in stats:
        pause = pauses.get(str(entry["name"]))
        if pause is not None:
            entry["pause"] = {"reason": pause.reason, "paused_at": pause.paused_at}
    return pauses


def _watch(client: Client, args: argparse.Namespace) -> int:
    """`status --watch`: a snapshot every args.watch seconds until Ctrl-C (exit 0, quietly).
    A terminal is cleared before each; a pipe or file gets one after the other, each under
    its time (--json: one document a line). Redis away: that snapshot says so, and the next
    one tries again."""
    terminal = sys.stdout.isatty() and not args.json
    every = format_seconds(args.watch)
    # the snapshots say that Redis is away: no retry warnings between them on the screen
    retries = logging.getLogger("blueque.retry")
    level = retries.level
    retries.setLevel(logging.ERROR)
    try:
        while True:
            taken = time.monotonic()
            try:
                data, text = _status(client)
            except RedisUnavailable as error:
                data = {"time": client.store.clock.now(), "error": str(error)}
                text = f"blueque: error: {error}"
            if args.json:
                shown = json_text(data, indent=None)
            else:
                heading = (f"blueque status every {every}: "
                           f"{format_time(client.store.clock.now())}")
                shown = (CLEAR_SCREEN if terminal else "") + heading + "\n\n" + text + "\n"
            print(shown, flush=True)
            time.sleep(max(0.0, args.watch - (time.monotonic() - taken)))
    except KeyboardInterrupt:  # how a watch ends
        return EXIT_OK
    finally:
        retries.setLevel(level)


def _slots_text(listener: ListenerStatus) -> str:
    """Busy slots of all it has, ``3/4``; ``-`` when its info hash does not say."""
    if listener.slots is None:
        return "-"
    return f"{'-' if listener.busy is None else listener.busy}/{listener.slots}"


def _state_text(listener: ListenerStatus, current: float) -> str:
    """``preempting: node goes away in 1m20s (12:34:56)`` for a preempted listener; ``SPOOL
    FAILING: [why]`` for one whose spool cannot be written (--spool-dir)."""
    deadline = listener.preempting_until
    spool = listener.info.get("spool_error")
    if spool:  # an ending Redis refuses would be held in memory only
        return f"SPOOL FAILING: {spool}"
    if deadline is None:
        return "listening"
    when = time.strftime("%H:%M:%S", time.localtime(deadline))
    left = deadline - current
    if left <= 0:
        return f"preempted: node gone since {when}"
    return f"preempting: node goes away in {format_seconds(left)} ({when})"


def _lease_text(remaining: float | None) -> str:
    if remaining is None:
        return "none"
    if remaining < 0:
        return f"EXPIRED {format_seconds(-remaining)} ago"
    return f"{format_seconds(remaining)} left"


def _renewal_text(info: dict[str, str]) -> str:
    """How long its latest lease renewal's round trip took; SLOW, with an --interval that
    would hold, past a tenth of its interval (a slow link: PROTOCOL.md 6, step 2)."""
    took, interval = field_float(info.get("renewal_seconds")), field_float(info.get("interval"))
    if took is None:
        return "-"
    text = format_seconds(took)
    if interval and took > interval / 10:
        text += f" SLOW (--interval {math.ceil(took * 20) / 2:g} would hold)"
    return text


def _age_text(age: float | None) -> str:
    return "-" if age is None else f"{format_seconds(age)} ago"
