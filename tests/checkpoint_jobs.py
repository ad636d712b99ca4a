"""Task functions that checkpoint, for the end-to-end tests (tests.checkpoint_jobs:NAME).

Parameters are JSON; each function appends one line per thing it did to the ``marker`` file
(opened for append per line, so lines of two processes never mix)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from blueque.errors import Preempted, StaleAttempt
from blueque.task import Task
from blueque.task_process.child import on_preempt, preempt_deadline, preempted


def _params(task: Task) -> dict[str, Any]:
    value = json.loads(task.parameters or "{}")
    assert isinstance(value, dict)
    return value


def _mark(params: dict[str, Any], *words: object) -> None:
    with open(params["marker"], "a", encoding="utf-8") as handle:
        handle.write(" ".join(map(str, words)) + "\n")


def count(task: Task) -> str:
    """Counts to ``n`` in steps of ``step`` seconds, saving a checkpoint every ``k`` steps and
    marking each step done as ``step [attempt] [step] [time]``; a re-run resumes after the
    last checkpoint."""
    params = _params(task)
    n, k, pause = int(params["n"]), int(params["k"]), float(params["step"])
    saved = task.checkpoint
    first = json.loads(saved)["done"] if saved else 0
    _mark(params, "begin", task.attempts, first, repr(time.time()))
    for step in range(first, n):
        time.sleep(pause)  # the work of one step
        _mark(params, "step", task.attempts, step, repr(time.time()))
        if (step + 1) % k == 0 and step + 1 < n:
            task.save_checkpoint(json.dumps({"done": step + 1}))
    return json.dumps({"steps": n, "resumed_from": first, "attempt": task.attempts})


def save_until_released(task: Task) -> str:
    """Saves ``{"attempt": a, "i": i}`` every 0.05 s until the ``release`` file appears,
    marking ``saved a i`` or, when the save is refused, ``stale a i`` (and trying again: the
    test wants to see every refusal; a real task would stop at the first)."""
    params = _params(task)
    attempt, i = task.attempts, 0
    while not os.path.exists(params["release"]):
        i += 1
        try:
            task.save_checkpoint(json.dumps({"attempt": attempt, "i": i}))
            _mark(params, "saved", attempt, i)
        except StaleAttempt as error:
            _mark(params, "stale", attempt, i, str(error).replace("\n", " "))
        time.sleep(0.05)
    return f"done by attempt {attempt}"


def save_when_told(task: Task) -> str:
    """Saves a first checkpoint (which also reads the queue's size limit), marks ``waiting``,
    waits for the ``phase`` file to say ``save``, marks ``saving``, saves again (however long
    Redis takes to come back) and marks ``saved [seconds it took]``, then waits for
    ``release``."""
    params = _params(task)
    task.save_checkpoint(json.dumps({"saved": "before the outage"}))
    _mark(params, "waiting")
    phase = Path(params["phase"])
    while not phase.exists() or phase.read_text() != "save":
        time.sleep(0.01)
    _mark(params, "saving")
    began = time.monotonic()
    try:
        task.save_checkpoint(json.dumps({"saved": "during the outage"}))
    except Exception as error:
        _mark(params, "failed", type(error).__name__, error)
        raise
    _mark(params, "saved", round(time.monotonic() - began, 2))
    while not os.path.exists(params["release"]):
        time.sleep(0.01)
    return "done"


def count_until_preempted(task: Task) -> str:
    """As ``count``, but when its node announces it goes away
    (blueque.task_process.child.on_preempt) it
    saves a checkpoint at the next step boundary and stops with blueque.Preempted; it marks
    ``preempted [attempt] [steps done] [seconds before the deadline]``."""
    params = _params(task)
    n, k, pause = int(params["n"]), int(params["k"]), float(params["step"])
    saved = task.checkpoint
    done = json.loads(saved)["done"] if saved else 0
    _mark(params, "begin", task.attempts, done, repr(time.time()))
    told: list[float] = []
    on_preempt(lambda: told.append(time.time()))
    while done < n:
        if preempted():
            task.save_checkpoint(json.dumps({"done": done}))
            deadline = preempt_deadline()
            _mark(params, "preempted", task.attempts, done,
                  "-" if deadline is None else round(deadline - time.time(), 1))
            raise Preempted(f"stopped at step {done} of {n}: the node goes away")
        time.sleep(pause)  # the work of one step
        _mark(params, "step", task.attempts, done, repr(time.time()))
        done += 1
        if done % k == 0 and done < n:
            task.save_checkpoint(json.dumps({"done": done}))
    return json.dumps({"steps": n, "resumed_from": json.loads(saved)["done"] if saved else 0,
                       "attempt": task.attempts, "told": len(told)})


def ignores_preemption(task: Task) -> str:
    """Marks ``running [attempt] [pid]`` and sleeps until ``release`` exists, whatever its
    node says: it is terminated at the deadline, and its task put back."""
    params = _params(task)
    _mark(params, "running", task.attempts, os.getpid())
    while not os.path.exists(params["release"]):
        time.sleep(0.02)
    return f"done by attempt {task.attempts}"


def marks_preemption(task: Task) -> str:
    """Marks ``running [attempt] [pid]``, then ``told [seconds before the deadline]`` when its
    node's notice comes (on_preempt), and sleeps until ``release`` exists, whatever it is told:
    it saves nothing (Redis may be away) and is terminated at the deadline."""
    params = _params(task)
    _mark(params, "running", task.attempts, os.getpid())

    def told() -> None:
        deadline = preempt_deadline()
        _mark(params, "told", "-" if deadline is None else round(deadline - time.time(), 1))

    on_preempt(told)
    while not os.path.exists(params["release"]):
        time.sleep(0.02)
    return f"done by attempt {task.attempts}"


def stops_in_its_callback(task: Task) -> str:
    """Marks ``running [attempt]`` and works (sleeps) until its node's notice; its on_preempt
    callback saves a checkpoint, marks ``stopping [attempt]`` and raises blueque.Preempted,
    which stops the task where it is. A run that finds the checkpoint returns ``resumed``."""
    params = _params(task)
    _mark(params, "running", task.attempts)
    if task.checkpoint:
        return "resumed"

    def stop() -> None:
        task.save_checkpoint(json.dumps({"stopped at": time.time()}))
        _mark(params, "stopping", task.attempts)
        raise Preempted("stopped by its on_preempt callback")

    on_preempt(stop)
    while True:
        time.sleep(0.02)
