"""Task functions of the dependency end-to-end tests (tests.dependency_jobs:NAME).

Parameters are JSON objects; ``marker`` names a file each run appends a line to, so a test
proves how often a task ran."""

from __future__ import annotations

import json
import os
from typing import Any

from blueque.task import Task


def _params(task: Task) -> dict[str, Any]:
    value = json.loads(task.parameters or "{}")
    return value if isinstance(value, dict) else {}


def _mark(params: dict[str, Any], text: str) -> None:
    if "marker" in params:
        with open(params["marker"], "a", encoding="utf-8") as handle:
            handle.write(f"{text}\n")


def adds(task: Task) -> str:
    """Its ``value`` plus the sum of its parents' results (a chain's running total); fails
    with ``fail`` when given."""
    params = _params(task)
    _mark(params, f"ran {task.id}")
    if "fail" in params:
        raise RuntimeError(params["fail"])
    total = int(params.get("value", 0)) + sum(int(p.result or 0) for p in task.parents())
    return str(total)


def counts_parents(task: Task) -> str:
    """How many parents completed, as JSON: an assemble step that keeps no books."""
    params = _params(task)
    parents = task.parents()
    _mark(params, f"ran {task.id}")
    return json.dumps({"parents": len(parents),
                       "complete": sum(p.status == "complete" for p in parents),
                       "pid": os.getpid()})
