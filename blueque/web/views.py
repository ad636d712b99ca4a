"""What each dashboard page shows, read from Redis through the store: plain dicts and lists
for the templates. Every read is a window (LRANGE/ZRANGE of one page, pipelined HGETALLs of
that page's tasks) or O(1) per queue, so a page costs the same with ten tasks or a million."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blueque import keyed, pausing
from blueque.cron import CronEntry
from blueque.errors import BluequeError
from blueque.jobs import read_job_call
from blueque.metrics import pending_age
from blueque.policy import field_float
from blueque.statuses import COMPLETE, FAILED, STARTED, finish_time, state_of
from blueque.store import RedisStore
from blueque.web.history import listener_history
from blueque.web.search import ALL, SCAN_LIMIT, STATES, Filters, search_context, window_ids

#: Tasks per page of a queue's task list.
PAGE_SIZE = 50
#: Scheduled tasks shown per queue on the schedule page.
SCHEDULED_SHOWN = 20
#: Queues (those with scheduled tasks) per page of the schedule page.
SCHEDULE_QUEUES_PER_PAGE = 20
#: Minutes of the queues page's throughput chart.
CHART_MINUTES = 60
#: Queue names the filter form offers to pick from (any other can be typed).
QUEUES_LISTED = 500
#: Queues per page of the queues page (each costs 60 reads for its chart).
QUEUES_PER_PAGE = 100
#: What a queue page may list: one state's tasks (STATES, from blueque.web.search), or ALL.
VIEWS = (ALL, *STATES)
#: Outcomes of the queues page's chart and totals, per minute.
CHART_OUTCOMES = ("complete", "failed", "cancelled", "retry")
#: Characters of parameters and result shown in a task list (whitespace runs as one space).
EXCERPT_CHARS = 60


def progress_fraction(data: dict[str, str]) -> float | None:
    value = field_float(data.get("progress"))
    return None if value is None else min(1.0, max(0.0, value))


def run_time(data: dict[str, str], at: float) -> float | None:
    """Seconds the current attempt has run (started) or ran (finished)."""
    started = field_float(data.get("started_at"))
    if started is None or data.get("status") not in (STARTED, COMPLETE, FAILED):
        return None
    end = field_float(finish_time(data))
    return max(0.0, (end or at) - started)


def task_row(task_id: str, data: dict[str, str], at: float) -> dict[str, Any]:
    error = data.get("error") or ""
    call = read_job_call(data.get("parameters"))
    return {
        "job": call.name if call else None,
        "id": task_id,
        "data": data,
        "status": state_of(data) or "(missing)",
        "progress": progress_fraction(data),
        "run_time": run_time(data, at),
        "updated": field_float(data.get("updated")),
        "eta": field_float(data.get("eta")),
        "error_line": error.strip().splitlines()[-1] if error.strip() else "",
        "parameters": excerpt(data.get("parameters")),
        "result": excerpt(data.get("result")),
    }


def excerpt(text: str | None) -> str:
    """The start of a value on one line, cut at EXCERPT_CHARS (the template escapes it; the
    task page shows the whole)."""
    line = " ".join((text or "").split())
    return line if len(line) <= EXCERPT_CHARS else line[:EXCERPT_CHARS - 1] + "…"


# --- queues -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChartRange:
    """A span the queues page charts: ``bars`` buckets of ``step`` seconds, read from the
    per-minute or the per-hour outcome counters (PROTOCOL.md 5.6)."""

    name: str
    label: str
    bars: int
    step: int
    queues_per_page: int = QUEUES_PER_PAGE

    def starts(self, at: float) -> list[int]:
        newest = int(at // self.step * self.step)
        return [newest - self.step * n for n in range(self.bars - 1, -1, -1)]


#: The queues page's charts: the last hour per minute, 24 hours and 7 days per hour.
#: A 7-day page shows fewer queues, so that it reads no more hashes than a one-hour page
#: (168 a queue: 35 x 168 = 5,880, against 100 x 60 = 6,000).
CHART_RANGES = {r.name: r for r in (ChartRange("1h", "last hour", CHART_MINUTES, 60),
                                    ChartRange("24h", "last 24 h", 24, 3600),
                                    ChartRange("7d", "last 7 days", 168, 3600, 35))}


def queues_page(store: RedisStore, at: float, number_: int = 1, span: str = "1h"
                ) -> dict[str, Any]:
    """A page of queues (QUEUES_PER_PAGE): counts per state, oldest pending age, outcomes
    per minute over the last hour (or per hour over 24 hours or 7 days); a fixed number of
    pipelines for the whole page."""
    chart = CHART_RANGES.get(span, CHART_RANGES["1h"])
    starts = chart.starts(at)
    known = [queue for queue, _ in store.known_queues()]
    page = Page(max(1, number_), chart.queues_per_page, len(known))
    queues = known[page.start : page.stop + 1]
    read = (store.outcomes_per_minute_many if chart.step == 60
            else store.outcomes_per_hour_many)
    rows = []
    for queue, counts, oldest, per_bucket in zip(
            queues, store.counts_many(queues), store.oldest_pending_many(queues),
            read(queues, starts), strict=True):
        bars = [{"minute": m, **{name: c.get(name, 0) for name in CHART_OUTCOMES}}
                for m, c in zip(starts, per_bucket, strict=True)]
        rows.append({
            "name": queue,
            "counts": {state: getattr(counts, state) for state in STATES},
            "listeners": counts.listeners,
            "paused": counts.paused,
            "oldest_pending_age": pending_age(oldest, at),
            "bars": bars,
            "peak": max([1, *(sum(b[name] for name in CHART_OUTCOMES) for b in bars)]),
            "last_hour": {name: sum(b[name] for b in bars) for name in CHART_OUTCOMES},
        })
    return {"queues": rows, "page": page, "chart": chart, "ranges": list(CHART_RANGES.values()),
            # fleet controls (PROTOCOL.md 5.22): each key's slots, and tasks nobody can run
            "keys": store.perform(keyed.key_states),
            "unplaceable": store.perform(keyed.unplaceable, queues)}


# --- one queue's tasks ------------------------------------------------------------------------
@dataclass(frozen=True)
class Page:
    number: int
    size: int
    total: int

    @property
    def start(self) -> int:
        return (self.number - 1) * self.size

    @property
    def stop(self) -> int:
        return self.start + self.size - 1

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.size))


def queue_page(store: RedisStore, queue: str, state: str | None, number_: int,
               filters: Filters, at: float, start: int = 0) -> dict[str, Any]:
    """A window of one state's tasks (or of ALL the states' lists one after the other), or a
    search (search.py): an exact id, or the tasks whose id has a prefix and whose node and
    times match, looking at SCAN_LIMIT at most. Without a ``state``, the first state that
    has tasks (a queue whose tasks all run opens on them, not on an empty pending list); a
    search, and a queue without tasks, look at ALL."""
    counts = store.counts(queue)
    totals = {s: getattr(counts, s) for s in STATES}
    totals[ALL] = sum(totals.values())
    if state is None:
        state = ALL if filters.active else next((s for s in STATES if totals[s]), ALL)
    known = [name for name, _ in store.known_queues()]
    found: dict[str, Any] = {"exact": False, "elsewhere": "", "scan": None}
    if filters.problems:  # said on the page; nothing looked at
        ids, page = [], Page(1, PAGE_SIZE, 0)
    elif filters.active:
        found = search_context(store, queue, state, filters, start, PAGE_SIZE)
        ids = found["ids"]
        page = Page(1, PAGE_SIZE, len(ids))
    else:
        page = Page(max(1, number_), PAGE_SIZE, totals[state])
        ids = (window_ids(store, queue, state, page.start, page.stop)
               if page.start < page.total else [])
    rows = [task_row(i, d, at) for i, d in zip(ids, store.task_data_many(ids), strict=True)
            if d or not filters.active]  # a search finds tasks, not ids without a hash
    return {"queue": queue, "state": state, "totals": totals, "rows": rows, "page": page,
            "filters": filters, "search": filters.prefix, "exact": found["exact"],
            "elsewhere": found["elsewhere"], "scan": found["scan"],
            "scan_limit": SCAN_LIMIT, "queues": known[:QUEUES_LISTED], "known": queue in known,
            "views": VIEWS, "jobs": any(row["job"] for row in rows),
            "pause": store.perform(pausing.pauses, [queue]).get(queue) if counts.paused else None}


# --- nodes and listeners ----------------------------------------------------------------------
#: Listeners per page of the nodes page.
LISTENERS_PER_PAGE = 50
#: Running tasks shown per listener (the queue's started tab lists them all, paged).
TASKS_PER_LISTENER = 20


def nodes_page(store: RedisStore, at: float, number_: int = 1) -> dict[str, Any]:
    """The listeners of every queue, a page at a time: host, pid, leases left, slots, and the
    first tasks each runs. Hashes are read for the shown listeners and tasks only, so a fleet
    running 10,000 tasks costs the page no more than a few."""
    server_now = store.server_time()
    listeners: dict[str, dict[str, Any]] = {}
    running: dict[str, list[tuple[str, str, str]]] = {}
    queues = [queue for queue, _ in store.known_queues()]
    for queue, work in zip(queues, store.listeners_at_work(queues), strict=True):
        for listener in sorted(work.registered | set(work.leases)):
            entry = listeners.setdefault(listener, {"id": listener, "leases": []})
            deadline = work.leases.get(listener)
            entry["leases"].append({
                "queue": queue,
                "left": None if deadline is None else deadline / 1000 - server_now,
            })
        for listener, pid, task_id in work.started:
            running.setdefault(listener, []).append((queue, pid, task_id))
            listeners.setdefault(listener, {"id": listener, "leases": []})
    page = Page(max(1, number_), LISTENERS_PER_PAGE, len(listeners))
    shown = sorted(listeners)[page.start : page.stop + 1]
    # the first tasks of every listener shown, in one pipeline (not one a listener)
    listed = [task for listener in shown
              for task in running.get(listener, [])[:TASKS_PER_LISTENER]]
    datas = iter(store.task_data_many([task_id for _, _, task_id in listed]))
    for listener, info in zip(shown, store.listener_infos(shown), strict=True):
        if info.get("left"):  # it exited, leaving its runs to the node: no listener any more
            del listeners[listener]
            continue
        entry = listeners[listener]
        entry["info"] = info
        entry["host"] = info.get("host") or listener.rpartition("_")[0]
        entry["pid"] = info.get("pid") or listener.rpartition("_")[2]
        entry["busy"] = info.get("busy")
        entry["slots"] = info.get("concurrency")
        entry["renewed"] = field_float(info.get("renewed") or info.get("started"))
        tasks = running.get(listener, [])
        entry["running"] = len(tasks)
        entry["more"] = {}  # queue -> tasks not shown
        for queue, _, _ in tasks[TASKS_PER_LISTENER:]:
            entry["more"][queue] = entry["more"].get(queue, 0) + 1
        entry["tasks"] = [dict(task_row(task_id, next(datas), at), queue=queue, pid=pid)
                          for queue, pid, task_id in tasks[:TASKS_PER_LISTENER]]
        expired = [lease["left"] for lease in entry["leases"]
                   if lease["left"] is not None and lease["left"] < 0]
        entry["state"] = "expired" if expired else ("gone" if not info else "alive")
    return {"listeners": [listeners[listener] for listener in shown if listener in listeners],
            "page": page,
            "history": listener_history(store, queues, {
                listener for listener, entry in listeners.items()
                if entry.get("info", True) and not any(
                    lease["left"] is not None and lease["left"] < 0
                    for lease in entry["leases"])})}


# --- scheduled tasks and cron entries ---------------------------------------------------------
def schedule_page(store: RedisStore, entries: Sequence[CronEntry], at: float,
                  number_: int = 1) -> dict[str, Any]:
    """The soonest scheduled tasks of the queues that have some (a page of
    SCHEDULE_QUEUES_PER_PAGE queues), and the cron entries: a few pipelines in all."""
    known = [queue for queue, _ in store.known_queues()]
    waiting = [(queue, total) for queue, total
               in zip(known, store.scheduled_counts(known), strict=True) if total]
    page = Page(max(1, number_), SCHEDULE_QUEUES_PER_PAGE, len(waiting))
    shown = waiting[page.start : page.stop + 1]
    windows = store.scheduled_windows([queue for queue, _ in shown], SCHEDULED_SHOWN)
    datas = iter(store.task_data_many([task_id for window in windows for task_id, _ in window]))
    queues = []
    for (queue, total), window in zip(shown, windows, strict=True):
        rows = [dict(task_row(task_id, next(datas), at), eta=eta) for task_id, eta in window]
        queues.append({"name": queue, "total": total, "rows": rows})
    return {"queues": queues, "page": page, "cron": cron_rows(store, entries, at)}


def cron_rows(store: RedisStore, entries: Sequence[CronEntry], at: float
              ) -> list[dict[str, Any]]:
    """Entries given to the dashboard (the scheduler's --cron/--cron-file) with their next
    tick, and names found only in blueque_cron (last tick fired, no definition here)."""
    ticks = store.cron_ticks()
    rows = []
    for entry in entries:
        recorded = field_float(ticks.get(entry.name))
        try:
            upcoming = entry.next_tick(recorded if recorded is not None
                                       and recorded > at - 86400 else at)
            # the scheduler records when it first saw an entry, in the same field as the
            # ticks it fires (PROTOCOL.md 7.1): a time that is no tick of the entry is that
            fired = recorded is not None and entry.is_tick(recorded)
        except (BluequeError, ValueError):
            upcoming, fired = None, True
        rows.append({"name": entry.name, "cron": entry.cron, "queue": entry.queue,
                     "timezone": entry.timezone or "UTC", "next": upcoming,
                     "last": recorded if fired else None,
                     "registered": None if fired else recorded,
                     "next_task": entry.task_id(upcoming) if upcoming else ""})
    defined = {entry.name for entry in entries}
    for name in sorted(set(ticks) - defined):
        rows.append({"name": name, "cron": "", "queue": "", "timezone": "",
                     "last": field_float(ticks[name]), "registered": None, "next": None,
                     "next_task": ""})
    return rows
