"""The dashboard's Jinja2 environment and its filters (times, durations, sizes as people read
them)."""

from __future__ import annotations

from datetime import UTC, datetime

from jinja2 import Environment, PackageLoader, select_autoescape

from blueque.display import format_bytes, format_seconds


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    try:
        return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # past year 9999: a task scheduled for never
        return f"{timestamp:.0f} (not a date)"


def _ago(timestamp: float | None, at: float) -> str:
    if timestamp is None:
        return "-"
    delta = at - timestamp
    return f"{format_seconds(delta)} ago" if delta >= 0 else f"in {format_seconds(-delta)}"


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else format_seconds(seconds)


def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("blueque.web", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True, lstrip_blocks=True,
    )
    env.filters.update(when=_when, duration=_duration, ago=_ago, bytes=format_bytes)
    return env
