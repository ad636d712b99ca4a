"""A listener's resources (``--resources``, PROTOCOL.md 5.22): what it offers, less what the
tasks of its runs require (its children's, from their stamps; its adopted runs', read once
each), as take.lua reads them to pass over the tasks that do not fit."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from blueque.daemon.running import Running
from blueque.daemon.slots import Slots
from blueque.placement import Resources, decode_resources, encode_resources, free_resources
from blueque.store import RedisStore


class ResourceBook:
    """What a listener offers (``total``) and what its runs use of it: its Supervisor's
    children and the runs its Slots adopted (read only)."""

    def __init__(self, store: RedisStore, total: Mapping[str, float],
                 children: Mapping[int, Running], slots: Slots) -> None:
        """``children``: the Supervisor's runs by pid (shared, never copied)."""
        self.store = store
        self.total = dict(total)
        self.children = children
        self.slots = slots
        #: what the adopted runs' tasks require, by task id
        self.adopted: dict[str, Resources] = {}

    def offered(self) -> str:
        """``total`` as the info hash's ``resources`` (JSON; "" when it offers none)."""
        return encode_resources(self.total) if self.total else ""

    def free(self, ending: str | None = None) -> str:
        """``total`` less what the runs require (the run of task ``ending`` not counted: its
        slot is being freed), as JSON. Raises RedisUnavailable (a new adopted run's read)."""
        self._adopt(self.slots.adopted)
        used = [decode_resources(r.fields.get("requires"))
                for r in self.children.values() if r.task_id != ending]
        return encode_resources(free_resources(self.total, [*used, *self.adopted.values()]))

    def _adopt(self, task_ids: Iterable[str]) -> None:
        """The adopted runs are now those of ``task_ids``: each new one's requires read once."""
        wanted = set(task_ids)
        for task_id in wanted - set(self.adopted):
            self.adopted[task_id] = decode_resources(
                (self.store.task_data(task_id) or {}).get("requires"))
        for task_id in set(self.adopted) - wanted:
            del self.adopted[task_id]
