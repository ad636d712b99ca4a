"""The dashboard's Jinja2 environment and its filters (times, durations, sizes as people read
them)."""

from __future__ import annotations

from jinja2 import Environment, PackageLoader, select_autoescape

from blueque.display import format_bytes, format_seconds, format_time
from blueque.placement import format_resources


def _when(timestamp: float | None) -> str:
    """A time as the dashboard shows it: display.format_time, its zone spelled out."""
    return format_time(timestamp, zone=" UTC")


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
    env.filters.update(when=_when, duration=_duration, ago=_ago, bytes=format_bytes,
                       resources=format_resources)
    return env
