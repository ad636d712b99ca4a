"""A queue page's search: a task by its id, ids by prefix, and filters by node and by time
(created, updated), over one state's list of one queue. A filtered page looks at no more than
SCAN_LIMIT tasks (their ids, then a few fields of those whose id matches), so a page costs the
same with 120,000 pending tasks as with 100; the next page looks further on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from blueque.policy import field_float
from blueque.statuses import (
    CANCELLED,
    COMPLETE,
    FAILED,
    PENDING,
    RESERVED,
    SCHEDULED,
    STARTED,
    WAITING,
)
from blueque.store import RedisStore

#: States in the order a task moves through them; cancelled (failed, stamped cancelled) apart.
STATES = (WAITING, PENDING, SCHEDULED, RESERVED, STARTED, COMPLETE, FAILED, CANCELLED)
#: A queue page's view of every state at once: their lists one after the other, in STATES'
#: order.
ALL = "all"

#: Tasks a filtered page looks at, at most (ids read in one window, fields of those whose id
#: matches in one pipeline of HMGET).
SCAN_LIMIT = 2000
#: The time filters: query parameter -> (field, bound).
TIME_FILTERS = {"created_from": ("created", "from"), "created_to": ("created", "to"),
                "updated_from": ("updated", "from"), "updated_to": ("updated", "to")}


def parse_time(text: str) -> float:
    """An instant as the filter form gives it (``2026-11-25T20:40``, the browser's
    datetime-local, read as UTC like every time the dashboard shows), or Unix seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip().replace(" ", "T"))
    except ValueError:
        raise ValueError(f"{text!r} is no time: give 2026-11-25T20:40 (UTC) "
                         "or Unix seconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@dataclass(frozen=True)
class Filters:
    """What a queue page's search asks for; ``problems`` says which values were refused."""

    prefix: str = ""
    node: str = ""
    times: dict[str, float] = field(default_factory=dict)  # query parameter -> Unix s
    given: dict[str, str] = field(default_factory=dict)  # query parameter -> as typed
    problems: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> Filters:
        times, given, problems = {}, {}, []
        for name in TIME_FILTERS:
            text = (params.get(name) or "").strip()
            if not text:
                continue
            given[name] = text
            try:
                times[name] = parse_time(text)
            except ValueError as error:
                problems.append(f"{name.replace('_', ' ')}: {error}")
        prefix = (params.get("id") or "").strip()
        node = (params.get("node") or "").strip()
        given.update({name: value for name, value in (("id", prefix), ("node", node)) if value})
        return cls(prefix, node, times, given, problems)

    @property
    def active(self) -> bool:
        return bool(self.prefix or self.node or self.times)

    @property
    def reads_fields(self) -> bool:
        return bool(self.node or self.times)

    def fields(self) -> list[str]:
        """The fields the filters read from each looked-at task (HMGET): its queue (a task
        moved or a foreign key is not this queue's), and those the filters compare."""
        wanted = ["queue"] + (["node"] if self.node else [])
        return wanted + sorted({TIME_FILTERS[name][0] for name in self.times})

    def matches(self, fields: Mapping[str, str]) -> bool:
        if self.node and self.node not in (fields.get("node") or ""):
            return False
        for name, bound in self.times.items():
            which, side = TIME_FILTERS[name]
            value = field_float(fields.get(which))
            if value is None or (value < bound if side == "from" else value > bound):
                return False
        return True


def window_ids(store: RedisStore, queue: str, state: str, start: int, stop: int) -> list[str]:
    """Ids ``start`` to ``stop`` (inclusive) of a state's list, in the order the page shows
    them: pending next-in-line first (the list's right end), scheduled soonest first,
    finished newest first. ALL: of the states' lists one after the other."""
    if state == ALL:
        return _all_window(store, queue, start, stop)
    if state == PENDING:
        return store.task_ids(queue, state, -(stop + 1), -(start + 1))[::-1]
    if state == RESERVED:  # read whole (bounded by the listeners' slots), then windowed
        return store.task_ids(queue, state)[start : stop + 1]
    return store.task_ids(queue, state, start, stop)


def _all_window(store: RedisStore, queue: str, start: int, stop: int) -> list[str]:
    """Ids ``start`` to ``stop`` of every state's list taken one after the other (their
    counts first: O(1) each), reading only the lists the window reaches."""
    counts = store.counts(queue)
    ids: list[str] = []
    offset = 0
    for state in STATES:
        total = getattr(counts, state)
        low, high = max(start - offset, 0), min(stop - offset, total - 1)
        if low <= high:
            ids += window_ids(store, queue, state, low, high)
        offset += total
        if offset > stop:
            break
    return ids


@dataclass(frozen=True)
class Scan:
    """One filtered page: the matching ids shown, where the look began and ended (offsets
    in the state's list) and where the next page starts (None: the list's end)."""

    ids: list[str]
    start: int
    stop: int
    next_start: int | None


def scan(store: RedisStore, queue: str, state: str, filters: Filters, start: int,
         shown: int) -> Scan:
    """Look at no more than SCAN_LIMIT tasks from ``start``: their ids (one window), then
    the fields the filters compare of those whose id has the prefix, when a node or time
    filter is given (one pipeline); the first ``shown`` matches are the page."""
    ids = window_ids(store, queue, state, start, start + SCAN_LIMIT - 1)
    # in the hash-tagged layout ids start with the queue's tag: a prefix may leave it out
    tagged = store.keys.task_id_for(queue, filters.prefix)
    candidates = [(n, task_id) for n, task_id in enumerate(ids)
                  if task_id.startswith(filters.prefix) or task_id.startswith(tagged)]
    if filters.reads_fields and candidates:
        values = store.task_fields_many([task_id for _, task_id in candidates],
                                        filters.fields())
        candidates = [(n, task_id) for (n, task_id), fields in zip(candidates, values,
                                                                    strict=True)
                      if fields.get("queue") == queue and filters.matches(fields)]
    matched = candidates[:shown]
    if len(candidates) > shown:  # the next page starts at the first match not shown
        return Scan([i for _, i in matched], start, start + candidates[shown][0] - 1,
                    start + candidates[shown][0])
    end = start + len(ids)
    return Scan([i for _, i in matched], start, end - 1,
                end if len(ids) == SCAN_LIMIT else None)


def search_context(store: RedisStore, queue: str, state: str, filters: Filters,
                   start: int, shown: int) -> dict[str, Any]:
    """What the queue page shows for a search: an exact id first (a task of this queue,
    or a note naming its queue), else the filtered scan."""
    exact: dict[str, str] = {}
    if filters.prefix and not (filters.node or filters.times):
        exact = store.task_data_many([filters.prefix])[0]  # no hash reads as no task
        if exact and exact.get("queue") == queue:
            return {"ids": [filters.prefix], "exact": True, "elsewhere": "", "scan": None}
    found = scan(store, queue, state, filters, max(0, start), shown)
    return {"ids": found.ids, "exact": False, "scan": found,
            "elsewhere": exact.get("queue", "") if exact else ""}
