"""What the operator CLI shows people: tables, times, durations, and a progress line."""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TextIO

from blueque.errors import ConfigurationError

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``7d``, ``1w`` -> seconds."""
    match = _DURATION.match(text.lower())
    if not match:
        raise ConfigurationError(
            f"bad duration {text!r}: use a number of seconds or a number with s, m, h, d or w "
            "(e.g. 90, 15m, 2h, 7d)"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


def positive_seconds(text: str) -> float:
    """An argparse type for intervals: a number of seconds above 0. Zero or less would make a
    daemon spin (and a listener declare itself dead at once), so it is a usage error."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds above 0 (such as 0.5 or 10), not {text!r}"
        )
    return value


def positive_int(text: str) -> int:
    """An argparse type for counts (``--concurrency``, ``--limit``): a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return value


def port_number(text: str) -> int:
    """An argparse type for TCP ports to listen on: 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, not {text!r}")
    return value


#: The levels ``--log-level`` accepts (any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(text: str) -> str:
    """An argparse type for ``--log-level``: one of LOG_LEVELS, in any case."""
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(LOG_LEVELS)} (any case), not {text!r}")
    return text.upper()


def parse_eta(text: str) -> float:
    """A Unix timestamp, or an ISO 8601 date-time (without an offset: this machine's local
    time) -> Unix seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"bad --eta {text!r}: give Unix seconds or an ISO 8601 date-time such as "
            "2026-11-22T18:30:00Z"
        ) from None
    return moment.timestamp()


def format_time(timestamp: float | None, zone: str = "Z") -> str:
    """UTC, to the second: ``2026-11-22 18:30:05Z`` (the dashboard's ``zone``: `` UTC``); a
    time that is no date (past year 9999, nan) as its number, ``-`` for none."""
    if timestamp is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(timestamp, UTC)
    except (OverflowError, OSError, ValueError):  # past year 9999 (--delay 600000w), nan
        return f"{timestamp:.0f} (not a date)"
    return moment.strftime("%Y-%m-%d %H:%M:%S") + zone


def format_bytes(size: int) -> str:
    """``11 B``, ``4.0 KiB``, ``1.0 MiB``."""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"


#: How much of one field `blueque show` prints without --full (parameters and results may be
#: megabytes: a queue's max_parameters_bytes and max_result_bytes are 16 MiB by default).
SHOWN_CHARACTERS = 2000


def cut_value(value: str) -> str:
    """A field's value as `blueque show` prints it: whole, or its start and its length."""
    if len(value) <= SHOWN_CHARACTERS:
        return value
    return (f"{value[:SHOWN_CHARACTERS]}… [cut: {len(value):,} characters in all; --full "
            "prints them]")


def largest_memory(raw: str | None) -> str:
    """A listener's ``task_memory`` (its task processes' resident bytes by pid, JSON) as
    `blueque status` shows it: the largest, and how many there are (``618.0 MiB (max of
    3)``); ``-`` when it says nothing."""
    try:
        sizes = [int(size) for size in json.loads(raw or "{}").values()]
    except (ValueError, TypeError, AttributeError):
        return "-"
    if not sizes:
        return "-"
    return format_bytes(max(sizes)) + (f" (max of {len(sizes)})" if len(sizes) > 1 else "")


def format_seconds(seconds: float) -> str:
    """A short human duration: ``850ms``, ``42s``, ``7m05s``, ``3h12m``, ``2d04h``; ``-`` for
    no number (inf or nan: a corrupt field read as a time). Cut, never rounded up: 59.96 s is
    ``59s``, as 119.6 s is ``1m59s``."""
    if not math.isfinite(seconds):
        return "-"
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{sign}{int(seconds * 1000)}ms"
    if seconds < 60:
        return f"{sign}{int(seconds * 10) / 10}s" if seconds < 10 else f"{sign}{int(seconds)}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{sign}{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{sign}{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{sign}{days}d{hours:02d}h" if hours else f"{sign}{days}d"


def shorten(text: str | None, width: int = 48) -> str:
    """One line, at most ``width`` characters."""
    if not text:
        return "-"
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def last_line(text: str | None) -> str | None:
    """The last non-blank line: for a traceback, the exception and its message."""
    if not text:
        return text
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else text


#: C0 and C1 control characters but tab, with or without newline: escape sequences among them
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def visible(text: str, newlines: bool = True) -> str:
    """``text`` with control characters written out (``\\x1b``; without ``newlines``, a
    newline too: ``\\x0a``): what Redis holds, which whoever enqueues writes, never drives the
    terminal that prints it (its title, its screen), nor forges a line of a log."""
    pattern = _CONTROL if newlines else _CONTROL_OR_NEWLINE
    return pattern.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned; control characters
    written out (``visible``)."""
    cells = [[str(h) for h in headers]] + [[visible(str(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        bool(rows) and all(isinstance(row[i], (int, float)) for row in rows)
        for i in range(len(headers))
    ]
    lines = []
    for row in cells:
        parts = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def bar(fraction: float, width: int = 30) -> str:
    """``[###############...............]`` for 0.5: ``fraction`` (clamped to 0..1) of
    ``width``."""
    filled = int(width * min(1.0, max(0.0, fraction)))
    return f"[{'#' * filled}{'.' * (width - filled)}]"


class ProgressLine:
    """One line of progress on a stream (stderr), the one renderer of everything that waits.

    On a terminal each ``update`` redraws the line in place and ``close`` ends it. Elsewhere
    nothing is drawn unless the caller shows progress anyway (``blueque wait --progress
    always``, Spark's ``wait_for_tasks``): then a line is written at most every ``every``
    seconds, and the last one at ``close``, so a log stays readable."""

    def __init__(self, stream: TextIO, every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.every = every
        self.tty = stream.isatty()
        self._clock = clock
        self._line: str | None = None  # the newest
        self._written: str | None = None  # the last written off a terminal
        self._written_at = -math.inf

    def update(self, line: str) -> None:
        self._line = line
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)  # clear the line: lines differ in length
            self.stream.flush()
        elif self._clock() - self._written_at >= self.every:
            self._write(line)

    def close(self) -> None:
        if self._line is None:
            return
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
        elif self._line != self._written:
            self._write(self._line)

    def _write(self, line: str) -> None:
        self._written, self._written_at = line, self._clock()
        self.stream.write(line + "\n")
        self.stream.flush()
