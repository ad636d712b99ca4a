"""Task functions that write output, for tests/test_task_logs.py (tests.output_jobs:NAME).

Parameters are JSON: {"release": a path the task waits for, "bytes": how much to print...}."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from blueque.task import Task


def _params(task: Task) -> dict[str, Any]:
    value = json.loads(task.parameters or "{}")
    return value if isinstance(value, dict) else {}


def chatty(task: Task) -> str:
    """Prints to stdout and stderr, garbage included; fails its first attempt."""
    print(f"hello from attempt {task.attempts}")
    print("not json {{{", file=sys.stderr)
    if task.attempts == 1:
        raise ValueError("first attempt fails")
    print("second attempt done")
    return "ok"


def ticking(task: Task) -> str:
    """Prints a tick every 0.05 s until its release file exists, then 'bye'."""
    params = _params(task)
    n = 0
    while not os.path.exists(params["release"]):
        print(f"tick {n}")
        n += 1
        time.sleep(0.05)
    print("bye")
    return "ok"


def flood_then_crash(task: Task) -> str:
    """Prints ``bytes`` of numbered lines, a last marker, then dies by SIGSEGV (or, given
    ``exit``, leaves with ``os._exit(exit)``, as a C library calling exit() would)."""
    params = _params(task)
    line = 0
    written = 0
    while written < int(params["bytes"]):
        text = f"line {line:08d} " + "x" * 80 + "\n"
        sys.stdout.write(text)
        written += len(text)
        line += 1
    print("LAST LINE BEFORE THE CRASH", flush=True)
    if "exit" in params:
        os._exit(int(params["exit"]))
    os.kill(os.getpid(), signal.SIGSEGV)
    return "unreachable"


def waits(task: Task) -> str:
    params = _params(task)
    print("waiting for the release file", flush=True)
    while not os.path.exists(params["release"]):
        time.sleep(0.02)
    return "ok"


def flood(task: Task) -> str:
    """Prints ``bytes`` of numbered lines, then waits for its release file."""
    params = _params(task)
    written = line = 0
    while written < int(params["bytes"]):
        text = f"line {line:08d} " + "x" * 80 + "\n"
        sys.stdout.write(text)
        written += len(text)
        line += 1
    print("FLOOD DONE", flush=True)
    while not os.path.exists(params["release"]):
        time.sleep(0.02)
    return "ok"


def pauses(task: Task) -> str:
    """Prints, stays quiet until its ``go`` file exists, prints again, waits for release."""
    params = _params(task)
    print("before the quiet spell", flush=True)
    while not os.path.exists(params["go"]):
        time.sleep(0.02)
    print("after the quiet spell", flush=True)
    while not os.path.exists(params["release"]):
        time.sleep(0.02)
    return "ok"


def chatty_waits(task: Task) -> str:
    """Prints a line, then waits for its release file."""
    print("waiting", flush=True)
    return waits(task)


def unfinished_line(task: Task) -> str:
    """Prints a line, then a last one without its newline (left in the stream's buffer)."""
    print("first line")
    sys.stdout.write("50% and no newline")
    return "ok"


def blast(task: Task) -> str:
    """Writes ``bytes`` bytes of numbered 1-MiB lines to fd 1 as fast as it can (os.write:
    C speed, between two looks of any poller), then "BLAST DONE"."""
    params = _params(task)
    chunks = int(params["bytes"]) // (1 << 20)
    for number in range(chunks):
        line = (f"chunk {number:06d} ".encode() + b"x" * ((1 << 20) - 14))[:(1 << 20) - 1]
        os.write(1, line + b"\n")
    print("BLAST DONE", flush=True)
    return "ok"
