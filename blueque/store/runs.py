"""Operations of a run's lifecycle (PROTOCOL.md 5.4-5.6, 5.10, 5.12): reserve, stamp, start,
finish, progress, recover."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import redis

from blueque import dependencies
from blueque import keys as k
from blueque.endings import RunEnd
from blueque.errors import BluequeError
from blueque.statuses import FINISHED_STATUSES, RecoverMode, Verdict
from blueque.store.core import Reservation
from blueque.store.errors import translate, translate_errors
from blueque.store.taking import Take, Taken, TakeOperations

log = logging.getLogger(__name__)


class RunOperations(TakeOperations):
    # --- reserving and running ------------------------------------------------------------
    @translate_errors
    def stamp(self, queue: str, listener_id: str, task_id: str, now: float) -> Reservation:
        """Mark a moved task reserved by this listener and count the attempt (stamp.lua);
        an ok Reservation carries the task's fields."""
        return self._reservation(task_id, self._run("stamp", *self._stamp_call(
            queue, listener_id, task_id, now, None, None)))

    @translate_errors
    def begin_run(self, queue: str, listener_id: str, task_id: str, now: float, pid: int,
                  pid_created: float | None, node: str, record: str, ttl_s: int
                  ) -> Reservation:
        """The listener daemon's start of a run (PROTOCOL.md 6.2), in one round trip: record
        the forked process on its node (HSET blueque_node_[node] pid record; EXPIRE), then
        stamp.lua with its pid: pending -> started by that process (durable like start)."""
        runs = self.keys.node_runs(node)
        keys, args = self._stamp_call(queue, listener_id, task_id, now, pid, pid_created)
        reply = self._run_with(
            "stamp", keys, args, durable=True,
            before=[lambda pipe: pipe.hset(runs, str(pid), record),
                    lambda pipe: pipe.expire(runs, ttl_s)])
        return self._reservation(task_id, reply)

    def _stamp_call(self, queue: str, listener_id: str, task_id: str, now: float,
                    pid: int | None, pid_created: float | None
                    ) -> tuple[list[str], list[Any]]:
        keys = [self.keys.task(task_id), self.keys.reserved(queue, listener_id),
                self.keys.failed(queue), *self._outcome_keys(queue, now)]
        if pid is not None:
            keys.append(self.keys.started(queue))
        return keys, [task_id, listener_id, repr(now), queue, k.FINISHED_MINUTE_TTL,
                      "" if pid is None else pid,
                      "" if pid_created is None else repr(pid_created)]

    @translate_errors
    def start(
        self,
        queue: str,
        task_id: str,
        listener_id: str,
        pid: int,
        now: float,
        attempt: int | None = None,
        pid_created: float | None = None,
    ) -> None:
        """Reserved -> started with the process id (start.lua); raises if it may not run."""
        self._run(
            "start",
            [self.keys.task(task_id), self.keys.started(queue),
             self.keys.reserved(queue, listener_id)],
            [task_id, listener_id, pid, repr(now), "" if attempt is None else attempt,
             "" if pid_created is None else repr(pid_created)],
            durable=True,
        )

    @translate_errors
    def finish(self, end: RunEnd, forget_run: tuple[str, int] | None = None,
               renews: bool = False) -> str:
        """Record one run's ending (finish.lua): complete, failed, retry or preempted; returns
        the new status. ``forget_run`` (node identity, pid): the listener daemon drops the
        run's record from blueque_node_[node] in the same round trip (PROTOCOL.md 6.2).
        ``renews``: the caller is ``end.listener``, and its lease renewals keep its
        listeners-seen entry and its counts' expiry (PROTOCOL.md 5.6), not each ending."""
        status = self._finish(end, forget_run, None, renews)[0]
        if isinstance(status, BluequeError):
            raise status
        return status

    @translate_errors
    def finish_and_take(self, end: RunEnd, forget_run: tuple[str, int] | None,
                        take: Take, renews: bool = False
                        ) -> tuple[str | BluequeError, Taken | None]:
        """``finish``, and in the same round trip the listener's next reservation (take.lua;
        not on a Redis Cluster, where the queues and the node's runs live in other slots):
        the status recorded, and what was taken (None: every queue of ``take`` was empty).
        A refused finish (StaleAttempt, InvalidTaskState) is returned in place of the status,
        not raised: what the take did in the same round trip must not be lost with it.
        Repeated after a lost reply, the fenced finish answers its status again and the take
        takes the next task; the one the lost reply took waits in the reserved list for the
        listener's heal (PROTOCOL.md 6.2)."""
        return self._finish(end, forget_run, take, renews)

    def _finish(self, end: RunEnd, forget_run: tuple[str, int] | None,
                take: Take | None, renews: bool) -> tuple[str | BluequeError, Taken | None]:
        queue = end.queue
        if end.outcome == "complete":
            target = self.keys.complete(queue)
        elif end.outcome == "failed":  # a cancelled run's task is listed with the cancelled
            target = self.keys.cancelled(queue) if end.cancelled else self.keys.failed(queue)
        elif end.outcome == "retry" and end.retry_eta is not None:
            target = self.keys.scheduled(queue)
        elif end.outcome == "preempted":
            target = self.keys.pending(queue)
        else:
            raise ValueError(f"unknown outcome {end.outcome!r} (or retry without an eta)")
        keys = [self.keys.task(end.task_id), self.keys.reserved(queue, end.listener),
                self.keys.started(queue), target, *self._outcome_keys(queue, end.now),
                self.keys.checkpoint(end.task_id), self.keys.listener_counts(queue, end.listener),
                self.keys.listeners_seen(queue), self.keys.pending(queue),
                self.keys.scheduled(queue), self.keys.failed(queue)]
        args = [end.task_id, end.listener, "" if end.pid is None else end.pid, end.outcome,
                end.text, repr(end.now), "" if end.attempt is None else end.attempt,
                "" if end.retry_eta is None else repr(end.retry_eta),
                "" if end.result_ttl_ms is None else end.result_ttl_ms,
                self.keys.done_channel(queue), "cancelled" if end.cancelled else "",
                "renews" if renews else "",
                k.FINISHED_MINUTE_TTL, end.traceback or "", self.keys.channel(queue), queue,
                *self._keyed_names()]
        # in the same round trip: the task's dependents, so that an ending with none (nearly
        # every one) costs no second round trip to find out (PROTOCOL.md 5.21)
        dependents = self.keys.dependents(end.task_id)
        after: list[Callable[[Any], object]] = [lambda pipe: pipe.smembers(dependents)]
        if forget_run is not None:
            runs, run = self.keys.node_runs(forget_run[0]), str(forget_run[1])
            after.append(lambda pipe: pipe.hdel(runs, run))
        then = None if take is None else self._take_call(end.listener, end.now, take)
        reply, replies = self._run_then("finish", keys, args, durable=True, after=after,
                                        then=then, refusal=then is not None)
        taken = None if take is None else self._taken(replies[-1])
        if isinstance(reply, redis.exceptions.ResponseError):
            return translate(reply, self.where), taken
        status = str(reply)
        if status in FINISHED_STATUSES and replies[0]:
            self.tell_dependents([end.task_id], end.now)
        return status, taken

    def tell_dependents(self, task_ids: Sequence[str], now: float) -> None:
        """Tell the tasks enqueued after these ended ones (dependencies.tell_dependents),
        right after the ending was recorded. A failure is logged, not raised: the ending
        stands, and the recovery sweep tells them instead (PROTOCOL.md 5.21)."""
        try:
            self.perform(dependencies.tell_dependents, task_ids, now)
        except BluequeError as error:
            log.warning("could not tell the dependents of %s (a sweep will): %s",
                        ", ".join(task_ids), error)

    @translate_errors
    def progress(self, task_id: str, attempt: int, fraction: float, message: str,
                 now: float) -> None:
        """Record a running task's progress (progress.lua, fenced by attempt)."""
        self._run("progress", [self.keys.task(task_id)],
                  [attempt, repr(fraction), message, repr(now)])

    @translate_errors
    def recover(
        self,
        queue: str,
        listener_id: str,
        verdicts: Iterable[Verdict],
        now: float,
        mode: RecoverMode,
        release: bool = True,
    ) -> list[int]:
        """Apply verdicts (id, attempts seen, pending|preempted|retry|failed|cancelled|drop,
        eta, error) to a dead listener's reserved tasks (recover.lua). ``mode`` is "lease"
        (its lease expired) or "host" (death proven on its host). Returns [requeued, retried,
        failed, skipped, cancelled] (failed counts the cancelled ones too), or [-1] when the
        claim failed (the lease is live, or someone else recovered it)."""
        verdicts = list(verdicts)
        queues_key, use_queues = self._queues_key(queue)
        keys = [self.keys.leases(queue), self.keys.listeners(queue),
                self.keys.reserved(queue, listener_id), self.keys.pending(queue),
                self.keys.started(queue), self.keys.scheduled(queue), self.keys.failed(queue),
                queues_key, *self._outcome_keys(queue, now), self.keys.cancelled(queue)]
        args: list[Any] = [listener_id, repr(now), mode, queue, use_queues,
                           self.keys.channel(queue), "1" if release else "0",
                           k.FINISHED_MINUTE_TTL]
        for task_id, attempts, verdict, eta, error in verdicts:
            keys.append(self.keys.task(task_id))
            args += [task_id, attempts, verdict, "" if eta is None else repr(eta), error]
        args += self._keyed_names()
        counts = [int(n) for n in self._run("recover", keys, args)]
        if counts != [-1] and release and self.keys.hash_tags:
            self.redis.zincrby(self.keys.queues(), -1, queue)
        if counts != [-1]:
            self.tell_dependents([v[0] for v in verdicts if v[2] in ("failed", "cancelled")], now)
        return counts

    @translate_errors
    def reclaim(self, queue: str, task_id: str, listener_id: str, attempt: int, pid: int,
                pid_created: float | None, now: float) -> tuple[str, str]:
        """Take back, for a listener's run that still lives, the task recover took from it
        while it was cut off, if no newer attempt has started (reclaim.lua, PROTOCOL.md 5.12b):
        ("ok", ""), ("stale", the task's attempts) or ("no", its status)."""
        reply = self._run(
            "reclaim",
            [self.keys.task(task_id), self.keys.reserved(queue, listener_id),
             self.keys.started(queue), self.keys.pending(queue), self.keys.scheduled(queue)],
            [task_id, listener_id, attempt, pid, "" if pid_created is None else repr(pid_created),
             repr(now), *self._keyed_names()], durable=True)
        return str(reply[0]), str(reply[1]) if len(reply) > 1 else ""

    @translate_errors
    def claim_reserved(self, queue: str, dead_listener: str, new_listener: str) -> str | None:
        """blueque 1.0.1's orphan claim: the dead listener's first reserved task, marked with
        reclaimed_node (the caller has already won the claim with remove_listener)."""
        task_id = cast("str | None", self.redis.lindex(self.keys.reserved(queue, dead_listener), 0))
        if task_id is not None:
            self.redis.hset(self.keys.task(task_id), "reclaimed_node", new_listener)
        return task_id

