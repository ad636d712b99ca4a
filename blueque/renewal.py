"""What a listener does at each lease renewal (PROTOCOL.md 6 "One step"): renew its leases and
info hash (Membership), write its runs to blueque_node_[node], and look at each running
child's task as it is now: a run taken back or reserved again is stopped (superseded: it
could record nothing), and a cancel whose message was missed is found."""

from __future__ import annotations

from collections.abc import Iterable

from blueque import keys as k
from blueque.endings import late_ending_allowed
from blueque.membership import Membership
from blueque.runs import Running
from blueque.store import RedisStore
from blueque.supervisor import NODE_RUNS_TTL, Supervisor


class Renewal:
    def __init__(self, store: RedisStore, membership: Membership,
                 supervisor: Supervisor) -> None:
        self.store, self.membership, self.supervisor = store, membership, supervisor

    def renew(self, busy: int) -> list[str]:
        """Renew, and return the tasks whose cancel was asked for (their message may have
        been missed). Raises RedisUnavailable."""
        supervisor = self.supervisor
        supervisor.defaults.clear()  # an operator's Queue.configure applies from now
        self.membership.renew(busy, supervisor.recorder.metrics)
        self.store.record_runs(self.membership.node, supervisor.records(), NODE_RUNS_TTL)
        checked = self.checked()
        if not checked:
            return []
        datas = self.store.task_data_many([r.task_id for r in checked])
        return self.check(zip(checked, datas, strict=True))

    def heal(self) -> None:
        """Put back the ids in our reserved lists that no child of ours runs or still has
        an ending to record (Membership.heal). Raises RedisUnavailable."""
        self.membership.heal(self.supervisor.task_ids())

    def check(self, fields: Iterable[tuple[Running, dict[str, str]]]) -> list[str]:
        """With each running child's task as it is now: stop the runs that were taken back
        or reserved again; returns the tasks whose cancel was asked for."""
        cancels = []
        for running, data in fields:
            if data.get("cancel_requested"):
                cancels.append(running.task_id)
            elif self._superseded(running, data):
                self.supervisor.stop(running, "superseded")
        return cancels

    def checked(self) -> list[Running]:
        """The children whose task a renewal looks at: running, and not yet reported (one
        whose outcome we took in is only exiting, not superseded by its own end)."""
        return [r for r in self.supervisor.children.values()
                if r.report is None and r.state == "running"]

    def _superseded(self, running: Running, data: dict[str, str]) -> bool:
        if not data or running.attempt is None:
            return False
        if (data.get("status") == k.FAILED
                and late_ending_allowed(data, self.membership.id, running.attempt)):
            return False  # recovered while it lived, and no attempt will follow: it may end
        return (data.get("attempts") != str(running.attempt)
                or data.get("node") != self.membership.id
                or data.get("status") not in (k.RESERVED, k.STARTED))
