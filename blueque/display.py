"""What the operator CLI shows people: tables, times, durations, and a progress bar."""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Sequence
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


def format_time(timestamp: float | None) -> str:
    """UTC, to the second: ``2026-11-22 18:30:05Z``."""
    if timestamp is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(timestamp, UTC)
    except (OverflowError, OSError, ValueError):  # past year 9999 (--delay 600000w), nan
        return f"{timestamp:.0f} (not a date)"
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def format_bytes(size: int) -> str:
    """``11 B``, ``4.0 KiB``, ``1.0 MiB``."""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"


def format_seconds(seconds: float) -> str:
    """A short human duration: ``850ms``, ``42s``, ``7m05s``, ``3h12m``, ``2d04h``."""
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{sign}{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{sign}{seconds:.1f}s" if seconds < 10 else f"{sign}{seconds:.0f}s"
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


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
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


class ProgressBar:
    """``[#########.........] 12/40 finished, 1 failed, 00:12`` on a stream (stderr).

    On a terminal the line is redrawn in place; elsewhere a line is written whenever the
    counts change."""

    def __init__(self, total: int, stream: TextIO, width: int = 30) -> None:
        self.total = total
        self.stream = stream
        self.width = width
        self.started = time.monotonic()
        self.tty = stream.isatty()
        self._last: tuple[int, int] | None = None

    def update(self, finished: int, failed: int) -> None:
        if (finished, failed) == self._last and not self.tty:
            return
        self._last = (finished, failed)
        filled = self.width * finished // max(1, self.total)
        elapsed = int(time.monotonic() - self.started)
        line = (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {finished}/{self.total} finished, "
            f"{failed} failed, {elapsed // 60:02d}:{elapsed % 60:02d}"
        )
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class TaskProgress:
    """``[###########.........]  55% half way, 3m10s`` for one task on a terminal: its own
    progress fraction and message, redrawn in place."""

    def __init__(self, stream: TextIO, width: int = 30) -> None:
        self.stream = stream
        self.width = width
        self.started = time.monotonic()

    def update(self, data: dict[str, str]) -> None:
        try:
            fraction = min(1.0, max(0.0, float(data.get("progress") or 0.0)))
        except ValueError:
            fraction = 0.0
        filled = int(self.width * fraction)
        message = shorten(data.get("progress_message") or data.get("status") or "", 40)
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {fraction * 100:3.0f}% "
                f"{message}, {format_seconds(time.monotonic() - self.started)}")
        self.stream.write("\r\x1b[2K" + line)  # clear the line: messages differ in length
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()
