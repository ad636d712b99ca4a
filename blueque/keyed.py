"""Fleet controls (PROTOCOL.md 5.22), the operations described once for both clients.

Concurrency limits per key across the fleet: set or clear a key's limit (limit.lua), read
each key's limit, holders and waiters (what ``blueque limit``, ``blueque status`` and the
metrics show), and the sweep's heal of the keys in use (keyed_heal.lua). A key's slots are
taken by take.lua and released by finish.lua and recover.lua, all through lua/lib/keyed.lua.
Placement: what the live listeners of a queue offer, and the pending tasks none of them could
ever run (the warning at enqueue, ``blueque status``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from blueque import keys as k
from blueque.errors import ConfigurationError
from blueque.placement import (
    PLACEMENT_OPTIONS,
    Resources,
    check_key,
    decode_resources,
    fits,
    format_resources,
)
from blueque.policy import encode_options
from blueque.protocol import Operation, Pipeline, Script, command

log = logging.getLogger("blueque.keyed")

#: Keys a sweep's heal looks at per call (drawn at random from the keys in use).
HEAL_KEYS = 100
#: Holders and waiters a key's state lists (its counts are exact).
LISTED = 20


@dataclass(frozen=True)
class Holder:
    """A run holding one of a key's slots: its task, the listener whose reserved list holds
    it, its queue and attempt."""

    task_id: str
    listener: str
    queue: str
    attempt: int | None


@dataclass(frozen=True)
class KeyState:
    """One concurrency key as Redis has it now: its limit (None: none), how many runs hold
    its slots and how many tasks wait for one, and the first LISTED of each."""

    key: str
    limit: int | None
    holding: int
    waiting: int
    holders: tuple[Holder, ...]
    waiters: tuple[str, ...]


def task_options(keys: k.Keys, options: Mapping[str, object], queue: bool = False
                 ) -> dict[str, str]:
    """A task's options (or, ``queue``, a queue's defaults) as hash fields, checked
    (policy.encode_options). A concurrency key or requires need one Redis: refused in the
    hash-tagged layout (ConfigurationError, nothing written)."""
    if keys.hash_tags and any(options.get(name) is not None for name in PLACEMENT_OPTIONS):
        raise ConfigurationError(
            "concurrency_key and requires are not available in the hash-tagged layout (a Redis "
            "Cluster): a key's slots are shared by every queue, no one hash slot holds them")
    return encode_options(options, queue=queue)


def check_limit(limit: object) -> int | None:
    """A key's limit: a whole number at least 0 (0: no run of the key starts), or None."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigurationError(f"a key's limit must be a whole number at least 0 (or None "
                                 f"to clear it), not {limit!r}")
    return limit


def set_limit(keys: k.Keys, key: str, limit: int | None) -> Operation[int]:
    """Set (or, None, clear) ``key``'s limit; waiters its new slots let run are woken. Returns
    how many runs hold its slots. Keys: blueque_limits, the key's holders and waiting list,
    the hashes and pending lists of the tasks woken. Script: limit.lua."""
    key, limit = check_key(key), check_limit(limit)
    reply = yield Script("limit", [keys.limits()],
                         [key, "" if limit is None else str(limit), *keys.keyed_names()],
                         durable=True)
    return int(reply)


def key_states(keys: k.Keys, wanted: Sequence[str] | None = None
               ) -> Operation[list[KeyState]]:
    """The state of ``wanted`` keys, or of every key with a limit or in use (sorted). Keys:
    blueque_limits, blueque_concurrency_keys, each key's holders and waiting list (read
    only, one round trip for them all)."""
    limits = yield command("hgetall", keys.limits())
    if wanted is None:
        used = yield command("smembers", keys.concurrency_keys())
        names = sorted(set(limits) | set(used))
    else:
        names = [check_key(key) for key in wanted]
    states: list[KeyState] = []
    if not names:
        return states
    replies = yield Pipeline(tuple(
        step for key in names for step in (
            command("hgetall", keys.key_holders(key)),
            command("llen", keys.key_waiting(key)),
            command("lrange", keys.key_waiting(key), -LISTED, -1))))
    for i, key in enumerate(names):
        holders, waiting, waiters = replies[3 * i: 3 * i + 3]
        raw = limits.get(key)
        states.append(KeyState(
            key, int(raw) if raw is not None and str(raw).isdigit() else None,
            len(holders), int(waiting),
            tuple(_holder(task_id, text) for task_id, text in sorted(holders.items())[:LISTED]),
            tuple(reversed(waiters))))
    return states


def _holder(task_id: str, text: str) -> Holder:
    try:
        value = json.loads(text)
    except ValueError:
        value = {}
    value = value if isinstance(value, dict) else {}
    attempt = value.get("attempt")
    return Holder(task_id, str(value.get("listener", "")), str(value.get("queue", "")),
                  int(attempt) if isinstance(attempt, int | float) else None)


def heal(keys: k.Keys, count: int = HEAL_KEYS) -> Operation[int]:
    """Drop the holds of runs gone from their listener's reserved list and wake the waiters
    free slots let run, for up to ``count`` keys in use. Returns how many ids left the
    waiting lists (none in the hash-tagged layout, where keys are refused). Script:
    keyed_heal.lua."""
    if keys.hash_tags:
        return 0
    reply = yield Script("keyed_heal", [keys.concurrency_keys()],
                         [count, *keys.keyed_names()])
    return int(reply)


# --- placement: what the live listeners of a queue offer ----------------------------------
#: The oldest pending tasks of each queue `blueque status` looks at for ones nobody fits.
PLACEMENT_LOOK = 20


def offers_many(keys: k.Keys, queues: Sequence[str]) -> Operation[dict[str, list[Resources]]]:
    """What each live listener of each queue offers (its info hash's ``resources``; one
    whose info hash is gone is dead, one that ``left`` gone, a 1.0.1 one writes none). Keys:
    blueque_listeners_[queue], each one's blueque_listener_[id] (SMEMBERS, HMGET: what a
    client may send); two round trips whatever the numbers of queues and listeners."""
    members = yield Pipeline(tuple(command("smembers", keys.listeners(q)) for q in queues))
    ids = sorted(set().union(*members)) if members else []
    infos = (yield Pipeline(tuple(command("hmget", keys.listener_info(listener),
                                          ["pid", "resources", "left"])
                                  for listener in ids))) if ids else []
    live = {listener: decode_resources(resources)
            for listener, (pid, resources, left) in zip(ids, infos, strict=True)
            if pid is not None and not left}
    return {queue: [live[listener] for listener in sorted(found) if listener in live]
            for queue, found in zip(queues, members, strict=True)}


def live_offers(keys: k.Keys, queue: str) -> Operation[list[Resources]]:
    """What each live listener of ``queue`` offers (offers_many)."""
    return (yield from offers_many(keys, [queue]))[queue]


def unplaceable(keys: k.Keys, queues: Sequence[str]
                ) -> Operation[dict[str, list[tuple[str, Resources, str]]]]:
    """The oldest pending tasks of each queue (PLACEMENT_LOOK) that require what no live
    listener of their queue offers, with why: four round trips (what `blueque status` and
    the dashboard's queues page say)."""
    offers = yield from offers_many(keys, queues)
    found: dict[str, list[tuple[str, Resources, str]]] = {}
    for queue, tasks in (yield from oldest_requires(keys, queues)).items():
        for task_id, needs in tasks:
            if why := nobody_fits(needs, offers[queue]):
                found.setdefault(queue, []).append((task_id, needs, why))
    return found


def nobody_fits(required: Resources, offers: Sequence[Resources]) -> str | None:
    """Why no listener of ``offers`` could ever run a task requiring ``required`` (counting
    all it offers, as if idle), or None if one could."""
    if any(fits(offer, required) for offer in offers):
        return None
    if not offers:
        return "no live listener serves its queue"
    return ("no live listener of its queue offers it (they offer: "
            + "; ".join(format_resources(offer) or "nothing" for offer in offers) + ")")


def warn_unplaceable(queue: str, what: str, requires: str, offers: Sequence[Resources]
                     ) -> None:
    """The warning at enqueue of a task (``what``) whose ``requires`` no live listener of
    ``queue`` (``offers``, live_offers) could ever run."""
    needs = decode_resources(requires)
    if needs and (why := nobody_fits(needs, offers)):
        log.warning("queue %s: %s requires %s, but %s: it waits until one does", queue, what,
                    format_resources(needs), why)


def oldest_requires(keys: k.Keys, queues: Sequence[str]
                    ) -> Operation[dict[str, list[tuple[str, Resources]]]]:
    """The ``requires`` of the PLACEMENT_LOOK oldest pending tasks of each queue (their own,
    else their queue's default), those that require anything: two round trips whatever the
    number of queues."""
    firsts = yield Pipeline(tuple(step for queue in queues for step in (
        command("lrange", keys.pending(queue), -PLACEMENT_LOOK, -1),
        command("hget", keys.queue_config(queue), "requires"))))
    ids = [(queue, task_id) for i, queue in enumerate(queues)
           for task_id in reversed(firsts[2 * i])]
    owns = (yield Pipeline(tuple(command("hget", keys.task(task_id), "requires")
                                 for _, task_id in ids), raise_on_error=False)) if ids else []
    defaults = {queue: firsts[2 * i + 1] for i, queue in enumerate(queues)}
    found: dict[str, list[tuple[str, Resources]]] = {}
    for (queue, task_id), own in zip(ids, owns, strict=True):
        own = None if isinstance(own, Exception) else own  # a foreign key under its name
        required = decode_resources(own or defaults[queue])
        if required:
            found.setdefault(queue, []).append((task_id, required))
    return found
