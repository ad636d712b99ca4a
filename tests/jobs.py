"""Task functions the end-to-end tests run in real listener daemons (tests.jobs:NAME).

Parameters are JSON. Functions that must prove how often they ran append a line to the file
named in their parameters."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from blueque.errors import Preempted
from blueque.task import Task
from blueque.task_process.child import report_progress


def _params(task: Task) -> dict[str, Any]:
    value = json.loads(task.parameters or "{}")
    return value if isinstance(value, dict) else {"value": value}


def _mark(params: dict[str, Any], text: str) -> None:
    if "marker" in params:
        with open(params["marker"], "a", encoding="utf-8") as handle:
            handle.write(f"{text} {os.getpid()}\n")


def echo(task: Task) -> object:
    params = _params(task)
    _mark(params, "ran")
    return params.get("value", params)


def text(task: Task) -> str:
    return f"processed {task.parameters}"


def reread(task: Task) -> str:
    """Its first Redis command is its own: the task process's connection pool at work."""
    return f"processed {task.refresh().parameters} while {task.status}"


def sleep(task: Task) -> str:
    params = _params(task)
    _mark(params, "start")
    time.sleep(float(params.get("seconds", 1)))
    _mark(params, "end")
    return "slept"


def span(task: Task) -> str:
    """Marks "start [queue] [task id] [attempt] [time]" and, ``seconds`` later (default 1),
    "end" likewise: the time is the system's monotonic clock, one for every process of the
    machine, so that the marks of all runs say how many of a queue ran at each moment."""
    params = _params(task)
    _mark(params, f"start {task.queue} {task.id} {task.attempts} {time.monotonic():.6f}")
    time.sleep(float(params.get("seconds", 1)))
    _mark(params, f"end {task.queue} {task.id} {task.attempts} {time.monotonic():.6f}")
    return "spanned"


def boom(task: Task) -> str:
    raise RuntimeError(f"boom on {task.parameters}")


def segfault(task: Task) -> str:
    _mark(_params(task), "ran")
    os.kill(os.getpid(), signal.SIGSEGV)
    return "unreachable"


def exit_code(task: Task) -> str:
    os._exit(int(_params(task).get("code", 7)))


def grandchild(task: Task) -> str:
    """Starts a grandchild that would outlive us, records its pid, then sleeps."""
    params = _params(task)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(params["pidfile"], "w", encoding="utf-8") as handle:
        handle.write(str(child.pid))
    time.sleep(float(params.get("seconds", 600)))
    return "done"


def progress(task: Task) -> str:
    params = _params(task)
    report_progress(0.5, "half way")
    _mark(params, "reported")
    deadline = time.monotonic() + float(params.get("seconds", 5))
    while time.monotonic() < deadline and not os.path.exists(params.get("release", "/nonexistent")):
        time.sleep(0.01)
    return "done"


def flaky(task: Task) -> str:
    """Fails until attempt N (from parameters), then succeeds."""
    params = _params(task)
    _mark(params, f"attempt{task.attempts}")
    if (task.attempts or 0) < int(params.get("succeed_on", 3)):
        raise RuntimeError(f"attempt {task.attempts} failed")
    return f"succeeded on attempt {task.attempts}"


def steps(task: Task) -> str:
    """Reports progress 0.05, 0.10, ... every ``interval`` seconds until it reaches 1 or the
    ``release`` file appears (the dashboard's browser tests watch it advance)."""
    params = _params(task)
    interval = float(params.get("interval", 0.3))
    done = 0
    while done < 20 and not os.path.exists(params.get("release", "/nonexistent")):
        done += 1
        report_progress(done / 20, f"step {done} of 20")
        time.sleep(interval)
    return f"{done} steps"


def explode(task: Task) -> str:
    """Fails with a traceback two frames deep (the dashboard shows it)."""

    def parse(text: str) -> int:
        return int(text)

    print(f"parsing {task.parameters}", flush=True)
    return str(parse("not a number"))


def exits(task: Task) -> str:
    """sys.exit(code), sys.exit(message) or KeyboardInterrupt, as the parameters say."""
    params = _params(task)
    if "message" in params:
        sys.exit(params["message"])
    if params.get("interrupt"):
        raise KeyboardInterrupt
    sys.exit(params.get("code"))


def some_error(task: Task) -> str:
    raise Exception("some error")


def hold(task: Task) -> str:
    """Marks "start [task id] [attempt] [pid]", waits for the release file, marks "end".
    With ``"ignore_term": true`` it ignores SIGTERM (a job that takes long to stop)."""
    params = _params(task)
    if params.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _mark(params, f"start {task.id} {task.attempts}")
    while not os.path.exists(params["release"]):
        time.sleep(0.02)
    _mark(params, f"end {task.id} {task.attempts}")
    return "held"


def keeps_reporting(task: Task) -> str:
    """Marks "start", reports progress every 20 ms (the message names the ``phase`` file's
    text when it exists), marks "reported [phase]" after each new phase's first report, and
    returns once the ``release`` file exists."""
    params = _params(task)
    _mark(params, f"start {task.attempts}")
    seen = ""
    while not os.path.exists(params["release"]):
        phase = ""
        if os.path.exists(params["phase"]):
            with open(params["phase"], encoding="utf-8") as handle:
                phase = handle.read().strip()
        report_progress(0.5, f"phase {phase or 'none'}")
        if phase != seen:
            _mark(params, f"reported {phase}")
            seen = phase
        time.sleep(0.02)
    _mark(params, "end")
    return "done"


def returns_a_set(task: Task) -> object:
    _mark(_params(task), "ran")
    return {1, 2, 3}


def ignores_sigterm(task: Task) -> str:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _mark(_params(task), "ignoring")
    time.sleep(600)
    return "unreachable"


def waits_for_release(task: Task) -> str:
    params = _params(task)
    _mark(params, "start")
    deadline = time.monotonic() + float(params.get("seconds", 60))
    while time.monotonic() < deadline and not os.path.exists(params["release"]):
        time.sleep(0.01)
    _mark(params, "end")
    return "released"


def acts(task: Task) -> object:
    """Does what its parameters say, in this order: marks "start [id] [attempt]", prints
    "print", reports "progress" ([fraction, message]), saves "checkpoint", waits for the
    "release" file, then raises Preempted ("preempt": true; only attempts before
    "preempt_until" when given), fails with "fail" (only attempts before "fail_until" when
    given), or returns "value" (default "done")."""
    params = _params(task)
    attempt = task.attempts or 0
    _mark(params, f"start {task.id} {attempt}")
    if "print" in params:
        print(params["print"], flush=True)
    if "progress" in params:
        report_progress(*params["progress"])
    if "checkpoint" in params:
        task.save_checkpoint(params["checkpoint"])
    while "release" in params and not os.path.exists(params["release"]):
        time.sleep(0.02)
    if params.get("preempt") and attempt < params.get("preempt_until", sys.maxsize):
        raise Preempted(f"attempt {attempt} preempted by its parameters")
    if "fail" in params and attempt < params.get("fail_until", sys.maxsize):
        raise RuntimeError(params["fail"])
    return params.get("value", "done")


def page(task: Task) -> object:
    """The README's documents (its Operator CLI session): ``{"page": N}`` prints "reading
    page N", saves a checkpoint and returns ``{"words": 1234}``; a page that is not a number
    fails (ValueError)."""
    number = json.loads(task.parameters or "{}").get("page")
    if not isinstance(number, int):
        raise ValueError(f"not a page number: {number!r}")
    print(f"reading page {number}", flush=True)
    task.save_checkpoint(json.dumps({"page": number, "done": True}))
    return {"words": 1234}


def words(task: Task) -> object:
    """The README's Spark pages: ``{"doc_id", "page", "text"}`` -> ``{"words": N}``."""
    return {"words": len(str(_params(task).get("text", "")).split())}


def holds_a_lock(task: Task) -> str:
    """Holds an exclusive flock on the ``lock`` file while it runs (the kernel drops it when
    the process dies, however): marks "overlap [attempt]" if another run holds it when it
    starts, else "start [attempt]"; returns once ``release`` exists or after ``seconds``."""
    params = _params(task)
    handle = open(params["lock"], "a")  # noqa: SIM115 - held until the process ends
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _mark(params, f"overlap {task.attempts}")
        fcntl.flock(handle, fcntl.LOCK_EX)
    _mark(params, f"start {task.attempts}")
    deadline = time.monotonic() + float(params.get("seconds", 60))
    while time.monotonic() < deadline and not os.path.exists(params["release"]):
        time.sleep(0.01)
    _mark(params, "end")
    return "done"


#: What ``leaks`` keeps between the tasks of a warm process: it is never freed.
_LEAKED: list[bytearray] = []


def leaks(task: Task) -> dict[str, int]:
    """Leaks ``mb`` MiB (written, so resident) into a module global, as a task with a cache
    that never forgets does; returns its pid and its resident memory at its end."""
    _LEAKED.append(bytearray(b"\x01") * (int(_params(task)["mb"]) * 1024 * 1024))
    with open(f"/proc/{os.getpid()}/statm", "rb") as handle:
        resident = int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"pid": os.getpid(), "rss": resident}
