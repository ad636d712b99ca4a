"""Per-task and per-queue job controls: retries with backoff, time limits, result retention.

A task's own fields (set at enqueue) win over its queue's defaults (blueque_queue_config_[queue]),
which win over the built-in defaults below. There is no short default time limit: long jobs
are the point.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import get_type_hints

from blueque import placement
from blueque.display import parse_duration
from blueque.errors import ConfigurationError
from blueque.placement import PLACEMENT_OPTIONS

#: The options that are 0 or 1 (which also take True and False), and what they mean.
FLAGS = {
    "keep_processes": "0 (stop what a run started when it ends, the default) or 1 (keep it)",
    "exclusive": "0 (the default) or 1 (never two runs at once: PROTOCOL.md 6.6)",
}

_RANDOM = random.Random()


@dataclass(frozen=True)
class Policy:
    max_attempts: int = 1
    retry_backoff: float = 10.0
    retry_backoff_max: float = 3600.0
    time_limit: float = 0.0  # 0: none
    kill_grace: float = 30.0
    result_ttl: float = 0.0  # 0: finished tasks stay until deleted
    #: runs stopped by a preemption that do not count as attempts, before the task fails
    max_preemptions: int = 10
    #: 1: what a run started is left running when it ends (a task that starts a daemon on
    #: purpose); 0: stopped with it, SIGTERM then SIGKILL after kill_grace (blueque.leftovers)
    keep_processes: int = 0
    #: 1: the task never runs twice at once (PROTOCOL.md 6.6): its listener stops it before
    #: its lease can lapse, other nodes recover it only a margin past the lapse
    exclusive: int = 0

    def result_ttl_ms(self) -> int | None:
        """The result TTL in milliseconds for PEXPIRE, None to keep the result."""
        return int(self.result_ttl * 1000) if self.result_ttl > 0 else None

    @classmethod
    def resolve(cls, task: Mapping[str, str], queue_config: Mapping[str, str]) -> Policy:
        values: dict[str, object] = {}
        for option in fields(cls):
            raw = task.get(option.name) or queue_config.get(option.name)
            if raw not in (None, ""):
                try:
                    values[option.name] = OPTION_TYPES[option.name](float(raw))
                except (ValueError, OverflowError):
                    continue  # a corrupt option falls back to the default, never blocks a task
        return cls(**values)  # type: ignore[arg-type]

    @staticmethod
    def attempts_used(fields: Mapping[str, str]) -> int:
        """Attempts a task has spent: its runs (``attempts``, the fencing token) less those a
        preemption stopped (``preemptions``), which do not count against max_attempts."""
        def number(name: str) -> int:
            raw = fields.get(name) or "0"
            return int(raw) if raw.isdigit() else 0
        return max(1, number("attempts") - number("preemptions"))

    def retry_eta(
        self, attempts: int, now: float, rng: random.Random | None = None
    ) -> float | None:
        """When attempt ``attempts + 1`` should run, or None when attempts are used up.

        Exponential backoff with "equal jitter": half the delay fixed, half random, so retries
        of many tasks that failed together spread out."""
        if attempts >= self.max_attempts:
            return None
        delay = min(self.retry_backoff_max, self.retry_backoff * 2.0 ** max(0, attempts - 1))
        jitter = (rng or _RANDOM).random()
        return now + delay / 2 + jitter * delay / 2


#: Fields a task hash or a queue config may carry, with their types: Policy's fields, in its
#: order, and the largest checkpoint in bytes (read by Task.save_checkpoint, not by Policy:
#: its default is the client's).
OPTION_TYPES: dict[str, type] = {**get_type_hints(Policy), "checkpoint_max_bytes": int}


#: A queue's limits on the size of a task's parameters and result, in bytes, and their
#: defaults (16 MiB each: far above what a queue should carry, far below Redis' 512 MB string;
#: store large data elsewhere and pass a reference). Set per queue with ``Queue.configure``
#: (0: no limit); not task options: a caller does not raise its own queue's limit.
#: ``max_parameters_bytes`` is checked by the submit scripts (5.1), ``max_result_bytes`` by the
#: task process when its function returns (a larger result fails the run, not retried).
QUEUE_LIMITS: dict[str, int] = {"max_parameters_bytes": 16 * 1024 * 1024,
                                "max_result_bytes": 16 * 1024 * 1024}


def queue_limit(config: Mapping[str, str], name: str) -> int:
    """A queue's limit ``name`` (QUEUE_LIMITS) from its config; a missing or corrupt value is
    the default."""
    try:
        return max(0, int(float(config.get(name) or QUEUE_LIMITS[name])))
    except (ValueError, OverflowError):
        return QUEUE_LIMITS[name]


def field_float(raw: str | None) -> float | None:
    """A number field of a hash (a create time, an interval, a time): None when missing or
    corrupt (no number, or none that is finite: ``"abc"``, ``"inf"``, ``"nan"``, as
    ``fields.typed`` says), which its readers take as unknown rather than failing on. The one
    reader of such fields: a reader that wants a default says it (``field_float(raw) or 0.0``)."""
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _number(name: str, value: object) -> float:
    """An option's value as a number: a number, a numeric string, True/False for a flag
    (exclusive=True), or for a duration option text as the CLI takes it (time_limit="4h":
    ``"90"``, ``"15m"``, ``"4h"``, ``"7d"``)."""
    if isinstance(value, bool) and name in FLAGS:
        return int(value)
    if isinstance(value, str) and OPTION_TYPES.get(name) is float:
        try:
            return parse_duration(value)
        except ConfigurationError as error:
            raise ConfigurationError(f"option {name}={value!r}: {error}") from None
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError(type(value).__name__)
        return float(value)
    except (TypeError, ValueError) as error:
        raise ConfigurationError(f"option {name}={value!r} is not a number") from error


def encode_options(options: Mapping[str, object], queue: bool = False) -> dict[str, str]:
    """Validate enqueue options (or, ``queue``, a queue's defaults and limits: QUEUE_LIMITS)
    and turn them into hash field values."""
    encoded: dict[str, str] = {}
    for name, value in options.items():
        if name in PLACEMENT_OPTIONS:  # text and JSON, not numbers (PROTOCOL.md 5.22)
            if value is not None:
                encoded[name] = placement.encode(name, value)
            continue
        kind = _option_type(name, queue)
        if value is None:
            continue
        number = _number(name, value)
        if not math.isfinite(number):  # nan would mean "no limit" unsaid; inf is no int
            raise ConfigurationError(f"option {name}={value!r} is not a finite number")
        least = 1 if name in ("max_attempts", "checkpoint_max_bytes") else 0
        if number < least:
            raise ConfigurationError(f"option {name}={value!r} is out of range: it must be at "
                                     f"least {least}")
        if name in FLAGS and number not in (0, 1):
            raise ConfigurationError(f"option {name}={value!r} must be 0 or 1: {FLAGS[name]}")
        encoded[name] = str(kind(number))
    return encoded


def _option_type(name: str, queue: bool) -> type:
    """The type of option ``name`` (ConfigurationError for one that is not an option, or a
    queue's limit given as a task's)."""
    if name in QUEUE_LIMITS:
        if queue:
            return int
        raise ConfigurationError(
            f"{name} is a queue's limit, not a task's option: set it with "
            f"Queue.configure({name}=...) or blueque configure QUEUE "
            f"--{name.replace('_', '-')} N")
    if name not in OPTION_TYPES:
        known = [*OPTION_TYPES, *PLACEMENT_OPTIONS, *(QUEUE_LIMITS if queue else ())]
        raise ConfigurationError(
            f"unknown task option {name!r}; known options: {', '.join(known)}")
    return OPTION_TYPES[name]
