"""Periodic task definitions: parse them (file or command line) and compute their due ticks.

A cron entry names a periodic task: a cron expression (5 fields, or 6 with seconds last, as
croniter reads them), the queue its tasks go to, their parameters (a string; JSON by
convention), an optional IANA time zone for the expression (default UTC), optional task
options (max_attempts, time_limit... as for Queue.enqueue) and an optional catch-up cap.

Each tick of an entry is enqueued as the task ``cron-<name>-<tick>`` (tick: Unix seconds),
so the scheduler can enqueue a tick again after a crash without creating a second task.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from blueque.errors import ConfigurationError
from blueque.keys import queue_name_problem
from blueque.policy import encode_options

#: How many missed ticks of one entry the scheduler fires after downtime, by default; older
#: missed ticks are skipped (and logged). Per entry: ``catch_up`` in the cron file.
DEFAULT_CATCH_UP = 10

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")
DEFAULT_PARAMETERS = "{}"


@dataclass(frozen=True)
class CronEntry:
    name: str
    cron: str
    queue: str
    parameters: str = DEFAULT_PARAMETERS
    timezone: str | None = None
    options: Mapping[str, object] = field(default_factory=dict)
    catch_up: int = DEFAULT_CATCH_UP

    def __post_init__(self) -> None:
        where = f"cron entry {self.name!r}"
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            raise ConfigurationError(
                f"{where}: a name may hold only letters, digits, '_', '.' and '-'"
            )
        if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
            raise ConfigurationError(
                f"{where}: {self.cron!r} is not a cron expression (5 fields, or 6 with "
                "seconds last, e.g. '*/5 * * * *')"
            )
        if not isinstance(self.queue, str) or not self.queue:
            raise ConfigurationError(f"{where}: give the queue its tasks go to")
        problem = queue_name_problem(self.queue)
        if problem:
            raise ConfigurationError(f"{where}: {problem}")
        if not isinstance(self.parameters, str):
            raise ConfigurationError(f"{where}: parameters must be a string")
        if not isinstance(self.catch_up, int) or self.catch_up < 1:
            raise ConfigurationError(f"{where}: catch_up must be a whole number >= 1")
        encode_options(self.options)  # raises ConfigurationError on an unknown option
        self.zone()

    def zone(self) -> tzinfo:
        if self.timezone is None:
            return UTC
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as error:
            raise ConfigurationError(
                f"cron entry {self.name!r}: unknown time zone {self.timezone!r}"
            ) from error

    def task_id(self, tick: int) -> str:
        return f"cron-{self.name}-{tick}"

    def due_ticks(self, after: int, now: float) -> tuple[list[int], bool]:
        """Ticks in (after, now], oldest first, at most ``catch_up`` of them (the newest);
        and whether older ones were left out."""
        # croniter's get_prev is strictly before its start; ticks are whole seconds
        start = datetime.fromtimestamp(math.floor(now) + 1, self.zone())
        iterator = croniter(self.cron, start)
        ticks: list[int] = []
        while True:
            tick = int(iterator.get_prev(float))
            if tick <= after:
                return ticks[::-1], False
            if len(ticks) == self.catch_up:
                return ticks[::-1], True
            ticks.append(tick)

    def next_tick(self, after: float) -> int:
        start = datetime.fromtimestamp(after, self.zone())
        return int(croniter(self.cron, start).get_next(float))

    def is_tick(self, moment: float) -> bool:
        """Whether ``moment`` (Unix s) is one of the entry's ticks."""
        return float(moment).is_integer() and self.next_tick(moment - 1) == int(moment)


def _parameters(value: object, name: str) -> str:
    if value is None:
        return DEFAULT_PARAMETERS
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, int, float, bool)):
        return json.dumps(value)
    raise ConfigurationError(f"cron entry {name!r}: parameters must be a string or JSON value")


def entry_from_mapping(data: Mapping[str, Any]) -> CronEntry:
    """One entry from a file's table: name, cron, queue, [parameters, timezone, options,
    catch_up]."""
    known = {"name", "cron", "queue", "parameters", "timezone", "options", "catch_up"}
    name = str(data.get("name", "?"))
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigurationError(
            f"cron entry {name!r}: unknown field(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(known))}"
        )
    missing = [key for key in ("name", "cron", "queue") if key not in data]
    if missing:
        raise ConfigurationError(f"cron entry {name!r}: missing {', '.join(missing)}")
    options = data.get("options") or {}
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"cron entry {name!r}: options must be a table")
    return CronEntry(
        name=data["name"],
        cron=data["cron"],
        queue=data["queue"],
        parameters=_parameters(data.get("parameters"), name),
        timezone=data.get("timezone"),
        options=dict(options),
        catch_up=data.get("catch_up", DEFAULT_CATCH_UP),
    )


def load_file(path: str | Path) -> list[CronEntry]:
    """Entries from a TOML file (``[[cron]]`` tables) or a JSON file (``{"cron": [...]}`` or
    a bare list); the format follows the extension (.toml or .json)."""
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except OSError as error:
        raise ConfigurationError(f"cannot read cron file {str(path)!r}: {error}") from error
    try:
        if path.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigurationError(f"cron file {str(path)!r}: use a .toml or .json file")
    except (ValueError, json.JSONDecodeError) as error:  # TOMLDecodeError is a ValueError
        raise ConfigurationError(f"cron file {str(path)!r} does not parse: {error}") from error
    items = data.get("cron", []) if isinstance(data, dict) else data
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ConfigurationError(
            f"cron file {str(path)!r}: expected a list of entries under 'cron'"
        )
    return [entry_from_mapping(item) for item in items]


def parse_spec(spec: str, tz_name: str | None = None) -> CronEntry:
    """``NAME=CRON:QUEUE[:PARAMETERS]`` (the command line form). A cron expression holds no
    ':', so the first ':' ends it and the second ends the queue name; the parameters run to
    the end of the string and may hold ':' (e.g. JSON)."""
    name, equals, rest = spec.partition("=")
    cron, colon, rest = rest.partition(":")
    queue, _, parameters = rest.partition(":")
    if not equals or not colon:
        raise ConfigurationError(
            f"bad --cron {spec!r}: expected NAME=CRON:QUEUE[:PARAMETERS], e.g. "
            "'report=0 3 * * *:reports:{\"kind\": \"daily\"}'"
        )
    return CronEntry(
        name=name.strip(), cron=cron.strip(), queue=queue.strip(),
        parameters=parameters or DEFAULT_PARAMETERS, timezone=tz_name,
    )


def check_unique(entries: Iterable[CronEntry]) -> list[CronEntry]:
    seen: set[str] = set()
    result = []
    for entry in entries:
        if entry.name in seen:
            raise ConfigurationError(f"two cron entries are named {entry.name!r}")
        seen.add(entry.name)
        result.append(entry)
    return result
