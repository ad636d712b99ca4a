"""Task dependencies (``after=``), written once for both clients (PROTOCOL.md 5.21).

A task enqueued after others (its *parents*) is created ``waiting``: its hash lists them
(``after``), ``blueque_awaits_[id]`` holds those it has not been told the ending of, and each
parent's ``blueque_dependents_[parent id]`` holds it. When a parent ends, whoever recorded the
ending tells its dependents (``tell_dependents``: tell.lua per dependent, in the dependent's
slot); the last parent told releases the task, a parent that did not complete ends it as
failed (unless ``after_any``), and that ending is told to its own dependents in turn. What a
crash between an ending and its telling leaves undone, the sweep (``settle_waiting``, run with
every recovery sweep) does: it reads the statuses of the parents a waiting task still awaits.
Every step is idempotent, so telling twice changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from blueque import keys as k
from blueque.errors import DependencyError
from blueque.policy import QUEUE_LIMITS
from blueque.protocol import Operation, Pipeline, Script, command, outcome_keys, touch_queue
from blueque.protocol import cancel as protocol_cancel
from blueque.statuses import CANCELLED, COMPLETE, FAILED, WAITING, state_of

#: Seconds between two sweeps' looks at one waiting task's parents: the bound on how late a
#: dependent is released when the ending of its parent was not told (a crash right after it,
#: or a parent run by blueque 1.0.1, which tells nobody).
RECHECK = 30.0
#: Waiting tasks a sweep looks at per call of settle_waiting.
SETTLE_BATCH = 100
#: Bytes of a parent's error quoted in the error of a dependent it ends.
QUOTED_ERROR = 1000


def parent_ids(task_id: str, after: object) -> list[str]:
    """The parent ids of ``after=`` (an id or a sequence of ids), each once, in order;
    DependencyError for a bad id or the task itself (a cycle)."""
    items = [after] if isinstance(after, str) else after
    if not isinstance(items, Sequence) or isinstance(items, bytes) or not items:
        raise DependencyError(f"after must be a task id or a list of task ids, not {after!r}")
    found: dict[str, None] = {}
    for item in items:
        if not isinstance(item, str) or not item or " " in item:
            raise DependencyError(f"after names {item!r}, which is not a task id")
        if item == task_id:
            raise DependencyError(f"task {task_id} cannot run after itself (a cycle)")
        found[str(item)] = None
    return list(found)


def ending_of(data: Mapping[str, str]) -> str | None:
    """How a parent ended, as tell.lua is told: complete, failed, cancelled, or gone (its hash
    is missing); None while it has not ended."""
    if not data:
        return "gone"
    state = state_of(data)
    if state in (COMPLETE, FAILED, CANCELLED):
        return state
    return None


def reason(parent: str, ending: str, data: Mapping[str, str]) -> str:
    """The error of a dependent that a parent's ending ends: it names the parent and why."""
    error = (data.get("error") or "")[:QUOTED_ERROR]
    if ending == "gone":
        return f"parent {parent} is gone (deleted or expired) before its ending was told"
    verb = "was cancelled" if ending == CANCELLED else "failed"
    return f"parent {parent} {verb}: {error}" if error else f"parent {parent} {verb}"


_PARENT_FIELDS = ("status", "cancelled", "error")


def _read_parents(keys: k.Keys, parents: Sequence[str]
                  ) -> Operation[list[dict[str, str]]]:
    replies = yield Pipeline(tuple(command("hmget", keys.task(p), list(_PARENT_FIELDS))
                                   for p in parents))
    return [{name: value for name, value in zip(_PARENT_FIELDS, reply, strict=True)
             if value is not None} for reply in replies]


# --- creating a waiting task ------------------------------------------------------------------
@dataclass(frozen=True)
class After:
    """What a task waits for: its parents, and whether any ending of theirs releases it."""

    parents: Sequence[str]
    any_ending: bool = False


def submit_after(keys: k.Keys, queue: str, task_id: str, parameters: str, now: float,
                 after: After, eta: float | None = None,
                 fields: Mapping[str, str] | None = None) -> Operation[bool]:
    """Create a task that waits for ``after.parents`` (submit_after.lua), after checking that
    every parent exists (DependencyError, nothing written) and linking it to each (SADD
    blueque_dependents_[parent]); then tell it at once of the parents that already ended.
    False if the id already exists (nothing changed)."""
    parents = list(after.parents)
    replies = yield Pipeline((command("exists", keys.task(task_id)),
                              *(command("exists", keys.task(p)) for p in parents)))
    if not replies[0]:
        unknown = [p for p, found in zip(parents, replies[1:], strict=True) if not found]
        if unknown:
            shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more"
                                               if len(unknown) > 5 else "")
            raise DependencyError(f"after names unknown task(s) {shown}: nothing enqueued")
        yield Pipeline(tuple(command("sadd", keys.dependents(p), task_id) for p in parents))
    script_keys = [keys.task(task_id), keys.awaits(task_id), keys.waiting(queue),
                   keys.queue_config(queue)]
    if not keys.hash_tags:
        script_keys.append(keys.queues())
    extra = [item for pair in (fields or {}).items() for item in pair]
    created = bool((yield Script("submit_after", script_keys, [
        task_id, queue, parameters, repr(now), "" if eta is None else repr(eta),
        json.dumps(parents), "1" if after.any_ending else "", repr(now + RECHECK),
        str(QUEUE_LIMITS["max_parameters_bytes"]), *extra], durable=True)))
    yield from touch_queue(keys, queue)
    if created:
        yield from settle(keys, queue, task_id, now)
    return created


# --- telling ----------------------------------------------------------------------------------
def tell(keys: k.Keys, queue: str, task_id: str, parent: str, ending: str, error: str,
         now: float) -> Operation[str]:
    """tell.lua: one parent's ending told to one waiting task (``parent`` "": cancel the task
    itself). Returns its verdict: released, failed, cancelled, waiting, told, not waiting."""
    reply = yield Script("tell", [
        keys.task(task_id), keys.awaits(task_id), keys.waiting(queue), keys.pending(queue),
        keys.scheduled(queue), keys.failed(queue), keys.cancelled(queue),
        *outcome_keys(keys, queue, now)],
        [task_id, parent, ending, error, repr(now), k.FINISHED_MINUTE_TTL,
         keys.channel(queue), keys.done_channel(queue), queue], durable=True)
    return str(reply[0])


def tell_dependents(keys: k.Keys, task_ids: Sequence[str], now: float) -> Operation[int]:
    """Tell the dependents of each of ``task_ids`` that has ended, and theirs in turn when
    that ends them (a cascade); each told dependent leaves the parent's dependents set.
    Returns how many tasks were released."""
    released, todo = 0, list(task_ids)
    while todo:
        parent = todo.pop()
        dependents = sorted((yield command("smembers", keys.dependents(parent))))
        if not dependents:
            continue
        data = (yield from _read_parents(keys, [parent]))[0]
        ending = ending_of(data)
        if ending is None:
            continue
        infos = yield Pipeline(tuple(command("hmget", keys.task(d), ["queue", "status"])
                                     for d in dependents))
        why = reason(parent, ending, data)
        for dependent, (queue, status) in zip(dependents, infos, strict=True):
            if status != WAITING or not queue:
                continue
            verdict = yield from tell(keys, queue, dependent, parent, ending, why, now)
            released += verdict == "released"
            if verdict == "failed":
                todo.append(dependent)
        yield command("srem", keys.dependents(parent), *dependents)
    return released


def settle(keys: k.Keys, queue: str, task_id: str, now: float) -> Operation[str]:
    """Read the statuses of the parents a waiting task still awaits and tell it of those
    that ended (and its dependents, if that ends it). Returns its last verdict."""
    awaited = sorted((yield command("smembers", keys.awaits(task_id))))
    datas = yield from _read_parents(keys, awaited)
    verdict = "waiting"
    for parent, data in zip(awaited, datas, strict=True):
        ending = ending_of(data)
        if ending is None:
            continue
        verdict = yield from tell(keys, queue, task_id, parent, ending,
                                  reason(parent, ending, data), now)
        if ending == "gone":  # nobody else will ever read it
            yield command("del", keys.dependents(parent))
        if verdict in ("failed", "not waiting", "released"):
            break
    if verdict == "failed":
        yield from tell_dependents(keys, [task_id], now)
    return verdict


def settle_waiting(keys: k.Keys, queue: str, now: float, limit: int = SETTLE_BATCH
                   ) -> Operation[int]:
    """The sweep: settle the waiting tasks of ``queue`` whose check is due (score <= now),
    then put the next check RECHECK seconds on. Returns how many it looked at."""
    due: list[str] = yield command("zrangebyscore", keys.waiting(queue), "-inf", now,
                                   start=0, num=limit)
    for task_id in due:
        status = yield command("hget", keys.task(task_id), "status")
        if status != WAITING:  # a stale entry (its hash deleted by hand)
            yield command("zrem", keys.waiting(queue), task_id)
            continue
        if (yield from settle(keys, queue, task_id, now)) in ("waiting", "told"):
            yield command("zadd", keys.waiting(queue), {task_id: now + RECHECK}, xx=True)
    return len(due)


def cancel_waiting_task(keys: k.Keys, queue: str, task_id: str, now: float, error: str
                        ) -> Operation[str]:
    """Cancel a waiting task (tell.lua with no parent) and end its dependents in turn.
    Returns its verdict: cancelled, or not waiting (it was released meanwhile)."""
    verdict = yield from tell(keys, queue, task_id, "", "", error, now)
    if verdict == "cancelled":
        yield from tell_dependents(keys, [task_id], now)
    return verdict


# --- reading ----------------------------------------------------------------------------------
def after_of(data: Mapping[str, str]) -> list[str]:
    """The parent ids a task hash's ``after`` field lists ([] for none or a corrupt one)."""
    try:
        parents = json.loads(data.get("after") or "[]")
    except ValueError:
        return []
    return [p for p in parents if isinstance(p, str)] if isinstance(parents, list) else []


def awaited(keys: k.Keys, task_id: str) -> Operation[list[str]]:
    """The parents a waiting task has not yet been told the ending of."""
    return sorted((yield command("smembers", keys.awaits(task_id))))


def dependents(keys: k.Keys, task_id: str) -> Operation[list[str]]:
    """The tasks waiting for this one that have not yet been told of its ending."""
    return sorted((yield command("smembers", keys.dependents(task_id))))


# --- cancelling -------------------------------------------------------------------------------
def cancel(keys: k.Keys, queue: str, task_id: str, status: str | None, now: float,
           error: str) -> Operation[tuple[str, str]]:
    """Client.cancel_task: a waiting task (``status`` as read) by tell.lua, any other by
    cancel.lua (protocol.cancel); a task this cancels ends its waiting dependents too."""
    if status == WAITING:
        verdict = yield from cancel_waiting_task(keys, queue, task_id, now, error)
        if verdict == "cancelled":
            return verdict, WAITING
    verdict, detail = yield from protocol_cancel(keys, queue, task_id, now, error)
    if verdict == "cancelled":
        yield from tell_dependents(keys, [task_id], now)
    return verdict, detail


def wanted(task_id: str, after: object, after_any: object = False) -> After:
    """``after=`` and ``after_any=`` of an enqueue, checked (DependencyError)."""
    if not isinstance(after_any, bool):
        raise DependencyError(f"after_any must be True or False, not {after_any!r}")
    return After(parent_ids(task_id, after), after_any)
