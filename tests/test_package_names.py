"""The package's own names: a task function's author imports all it uses from ``blueque``,
and ``import blueque`` in a producer leaves the task process's machinery unloaded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import blueque

#: What a task function's author uses, and where each lives (those paths stay importable).
AUTHOR_NAMES = {
    "report_progress": "blueque.task_process.progress",
    "preempted": "blueque.preemption",
    "on_preempt": "blueque.preemption",
    "preempt_deadline": "blueque.preemption",
    "Preempted": "blueque.errors",
    "TaskFunction": "blueque.task_process.child",
    "Task": "blueque.task",
    "CheckpointInfo": "blueque.task",
    "CheckpointTooLarge": "blueque.errors",
    "check_result": "blueque.processor",
    "Jobs": "blueque.jobs",
    "job_parameters": "blueque.jobs",
    "InvalidJob": "blueque.errors",
}
#: The task process's and the listener's machinery: no producer needs it.
MACHINERY = ("blueque.child", "blueque.task_process", "blueque.daemon", "blueque.reporting",
             "blueque.preemption", "blueque.spool", "blueque.tasklog", "blueque.leftovers")


def loaded_by(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(done.stdout))


def test_import_blueque_leaves_the_task_machinery_unloaded() -> None:
    loaded = loaded_by("import blueque; blueque.Client, blueque.Queue")
    assert "blueque.client" in loaded
    machinery = sorted(m for m in loaded if m.startswith(MACHINERY))  # a package's parts too
    assert not machinery, machinery


@pytest.mark.parametrize(("name", "module"), sorted(AUTHOR_NAMES.items()))
def test_each_author_name_is_importable_from_blueque(name: str, module: str) -> None:
    assert name in blueque.__all__
    assert getattr(blueque, name) is getattr(__import__(module, fromlist=[name]), name)
    assert name in dir(blueque)


def test_the_old_import_paths_stay() -> None:
    from blueque.child import (  # noqa: F401  (what README and task modules used to say)
        Preempted,
        TaskFunction,
        on_preempt,
        preempt_deadline,
        preempted,
        report_progress,
    )

    assert report_progress is blueque.report_progress
    assert preempted is blueque.preempted


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        blueque.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def test_the_fork_server_loads_no_redis_and_none_of_the_listener() -> None:
    """What ``python -m blueque.task_process.forkserver`` imports before its task module
    (PROTOCOL.md 6.8):
    the task process's code, not redis-py nor the daemon, CLI, dashboard or metrics."""
    loaded = loaded_by("import blueque.task_process.forkserver")
    assert {"blueque.task_process.child", "blueque.task_process.warm",
            "blueque.task_process.forkserver"} <= loaded
    listener_only = ("redis", "blueque.daemon", "blueque.cli", "blueque.web", "blueque.metrics",
                     "blueque.client", "blueque.store")
    assert sorted(m for m in loaded if m.startswith(listener_only)) == []


def test_a_task_module_with_a_registry_of_jobs_loads_no_redis_in_the_fork_server() -> None:
    """``jobs = blueque.Jobs()`` in a task module: the fork server imports that module, and a
    registry (which enqueues on the caller's queue) brings no redis-py with it."""
    loaded = loaded_by("import blueque.task_process.forkserver, tests.job_registry")
    assert "blueque.jobs" in loaded
    assert sorted(m for m in loaded if m.startswith(("redis", "blueque.store",
                                                      "blueque.client", "blueque.queue"))) == []


def test_check_result_tells_early_what_a_task_could_not_store() -> None:
    assert blueque.check_result({"words": 1234}) == '{"words": 1234}'
    assert blueque.check_result("as is") == "as is"
    with pytest.raises(blueque.WrongType, match="this set cannot be encoded as JSON"):
        blueque.check_result({1, 2})
    with pytest.raises(blueque.WrongType, match="Circular reference"):
        loop: list[object] = []
        loop.append(loop)
        blueque.check_result(loop)
    deep: list[object] = []
    for _ in range(100_000):  # deeper than the encoder's recursion: WrongType, not a crash
        deep = [deep]
    with pytest.raises(blueque.WrongType, match="RecursionError"):
        blueque.check_result(deep)
