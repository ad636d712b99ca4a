"""Task functions that write output, for tests/test_task_logs.py (tests.output_jobs:NAME).

Parameters are JSON: {"release": a path the task waits for, "bytes": how much to print...}."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
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


def threads_and_lines(task: Task) -> str:
    """Prints its own numbered lines (to stdout and stderr), then a last line without its
    newline just before it returns; returns how many threads its process has and its pid."""
    params = _params(task)
    count = threading.active_count()
    in_proc = len(os.listdir("/proc/self/task"))
    for number in range(int(params.get("lines", 20))):
        stream = sys.stderr if number % 3 == 0 else sys.stdout
        print(f"{task.id} line {number}", file=stream)
    if params.get("bytes"):  # past the cap: numbered lines of this task only
        written = line = 0
        while written < int(params["bytes"]):
            text = f"{task.id} fill {line:08d}\n"
            sys.stdout.write(text)
            written += len(text)
            line += 1
    sys.stdout.write(f"{task.id} last line, no newline")
    return json.dumps({"threads": count, "proc_threads": in_proc, "pid": os.getpid()})


def writes_then_dies(task: Task) -> str:
    """Writes ``bytes`` of numbered lines straight to fd 1, then half a line, then dies by
    SIGKILL (or ``os._exit(exit)``) in the middle of it."""
    params = _params(task)
    written = line = 0
    while written < int(params["bytes"]):
        text = f"line {line:08d} ".encode() + b"x" * 60 + b"\n"
        os.write(1, text)
        written += len(text)
        line += 1
    os.write(1, b"half a line")
    if "exit" in params:
        os._exit(int(params["exit"]))
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def writes_until_killed(task: Task) -> str:
    """Writes numbered lines straight to fd 1 (no buffer of Python's) until it is killed."""
    line = 0
    while True:
        os.write(1, f"line {line:08d}\n".encode())
        line += 1
        if line % 100 == 0:
            time.sleep(0.001)


def ticks_then_floods(task: Task) -> str:
    """Prints a tick every 0.02 s until its ``go`` file exists, then ``bytes`` of numbered
    lines (more than a pipe holds), then waits for its release file and prints 'bye'."""
    params = _params(task)
    n = 0
    while not os.path.exists(params["go"]):
        print(f"tick {n}")
        n += 1
        time.sleep(0.02)
    written = line = 0
    while written < int(params["bytes"]):
        text = f"flood {line:08d} " + "y" * 60 + "\n"
        sys.stdout.write(text)
        written += len(text)
        line += 1
    print("FLOOD DONE", flush=True)
    while not os.path.exists(params["release"]):
        time.sleep(0.02)
    print(f"bye from {os.getpid()}")
    return "ok"
