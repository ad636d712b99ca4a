"""``blueque.Jobs``: registering jobs, enqueueing one by name (sync and asyncio, against the
private redis-server), and the registry as a task function (run in-process here; with real
listeners in tests/listener/test_job_registry.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import blueque
import blueque.aio
from blueque.jobs import ENQUEUE_OPTIONS, JobCall, job_parameters, read_job_call
from blueque.task import TaskView
from blueque.task_process.calling import execute, import_function
from tests.job_registry import jobs


def task_with(parameters: str | None) -> Any:
    return TaskView("t1", {} if parameters is None else {"parameters": parameters})


# --- registering ----------------------------------------------------------------------------
def test_a_job_is_registered_under_its_name_or_the_one_given() -> None:
    assert list(jobs) == ["resize", "images.thumbnail", "flaky"]
    assert "resize" in jobs and "thumbnail" not in jobs and len(jobs) == 3
    assert jobs["images.thumbnail"].__name__ == "thumbnail"
    assert repr(jobs) == "<Jobs resize, images.thumbnail, flaky>"


def test_the_decorator_returns_the_function_unchanged() -> None:
    registry = blueque.Jobs()

    def resize(task: Any, width: int) -> int:
        return width * 2

    assert registry.job(resize) is resize
    assert resize(None, 3) == 6


@pytest.mark.parametrize(("function", "message"), [
    (lambda: None, "must take the task as its first parameter"),
    (lambda *, task: None, "must take the task as its first parameter"),
    (lambda task, delay: None, "'delay' has the name of an enqueue option"),
    (lambda task, time_limit=5: None, "'time_limit' has the name of an enqueue option"),
    (lambda task, width, /: None, "'width' is positional-only"),
])
def test_a_function_jobs_enqueue_could_not_call_is_refused(function: Any, message: str) -> None:
    with pytest.raises(blueque.ConfigurationError, match=message):
        blueque.Jobs().job(function, name="job")


def test_two_jobs_of_one_name_are_refused_with_where_each_is() -> None:
    registry = blueque.Jobs()
    registry.job(lambda task: None, name="resize")
    with pytest.raises(blueque.ConfigurationError,
                       match=r"two jobs are named 'resize' \(.*<lambda> and .*<lambda>\)"):
        registry.job(lambda task: None, name="resize")


def test_the_enqueue_options_are_what_queue_enqueue_and_schedule_take() -> None:
    assert {"task_id", "after", "after_any", "eta", "delay", "max_attempts", "time_limit",
            "exclusive", "checkpoint_max_bytes"} <= ENQUEUE_OPTIONS


# --- parameters -----------------------------------------------------------------------------
def test_the_parameters_are_json_any_client_reads() -> None:
    text = jobs.parameters("resize", width=10)
    assert json.loads(text) == {"job": "resize", "arguments": {"width": 10}}
    assert text == job_parameters("resize", width=10)
    assert read_job_call(text) == JobCall("resize", {"width": 10})
    # a producer without the jobs' code writes the same text
    assert read_job_call(job_parameters("anything", a=[1, {"b": None}])) == JobCall(
        "anything", {"a": [1, {"b": None}]})


@pytest.mark.parametrize("parameters", [
    None, "", "not json", '"resize"', "[1, 2]", '{"width": 10}', '{"job": 7}',
    '{"job": "resize", "arguments": [10]}',
])
def test_other_parameters_name_no_job(parameters: str | None) -> None:
    assert read_job_call(parameters) is None


def test_an_unknown_job_is_refused_at_enqueue_with_a_suggestion() -> None:
    with pytest.raises(blueque.ConfigurationError,
                       match=r"unknown job 'resise'; did you mean 'resize'\? \(the jobs "
                             r"registered here: flaky, images.thumbnail, resize\)"):
        jobs.parameters("resise", width=10)


@pytest.mark.parametrize(("arguments", "message"), [
    ({}, "missing a required argument: 'width'"),
    ({"width": 1, "depth": 2}, "unexpected keyword argument 'depth'"),
])
def test_arguments_the_function_does_not_take_are_refused_at_enqueue(
        arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(blueque.WrongType, match=message) as raised:
        jobs.parameters("resize", **arguments)
    assert "its parameters are (width, height=0, marker=None)" in str(
        raised.value)


def test_arguments_that_are_not_json_are_refused_at_enqueue() -> None:
    with pytest.raises(blueque.WrongType, match="must be JSON values"):
        jobs.parameters("resize", width={1, 2})
    with pytest.raises(blueque.WrongType, match="must be JSON values"):
        jobs.parameters("resize", width=float("nan"))


# --- enqueueing -----------------------------------------------------------------------------
def test_enqueue_splits_the_jobs_arguments_from_the_enqueue_options(
        client: blueque.Client) -> None:
    queue = client.get_queue("images")
    task_id = jobs.enqueue(queue, "resize", width=10, max_attempts=3, time_limit="2h",
                           task_id="resize-1")
    assert task_id == "resize-1" and task_id.created
    task = client.get_task(task_id)
    assert task.status == "pending"
    assert json.loads(task.parameters) == {"job": "resize", "arguments": {"width": 10}}
    assert task.data["max_attempts"] == "3" and float(task.data["time_limit"]) == 7200
    assert jobs.enqueue(queue, "resize", width=10, task_id="resize-1").created is False


def test_enqueue_with_a_delay_or_after_goes_where_queue_would_put_it(
        client: blueque.Client) -> None:
    queue = client.get_queue("images")
    later = jobs.enqueue(queue, "images.thumbnail", path="a.png", delay=3600)
    assert client.get_task(later).status == "scheduled"
    child = jobs.enqueue(queue, "resize", width=1, after=later)
    assert client.get_task(child).status == "waiting"
    assert queue.stats().pending == 0


def test_enqueue_async_is_the_twin(redis_url: str, client: blueque.Client) -> None:
    async def enqueue() -> tuple[str, str]:
        async with blueque.aio.Client(redis_url) as aio:
            queue = aio.get_queue("images")
            now = await jobs.enqueue_async(queue, "resize", width=3, max_attempts=2)
            later = await jobs.enqueue_async(queue, "resize", width=3, delay=60)
            with pytest.raises(blueque.WrongType, match="'depth'"):
                await jobs.enqueue_async(queue, "resize", width=3, depth=1)
            return now, later

    now, later = asyncio.run(enqueue())
    task = client.get_task(now)
    assert json.loads(task.parameters) == {"job": "resize", "arguments": {"width": 3}}
    assert task.data["max_attempts"] == "2"
    assert client.get_task(later).status == "scheduled"
    assert client.get_queue("images").stats().pending == 1


# --- running --------------------------------------------------------------------------------
def test_the_registry_runs_the_job_its_task_names() -> None:
    outcome = execute(jobs, task_with(jobs.parameters("resize", width=10, height=5)))
    assert (outcome.outcome, outcome.text) == ("complete", '{"width": 10, "height": 5}')


@pytest.mark.parametrize(("parameters", "error"), [
    ('{"job": "rotate", "arguments": {}}', "unknown job 'rotate'"),
    ('{"job": "resise", "arguments": {"width": 1}}', "did you mean 'resize'?"),
    ('{"job": "resize", "arguments": {"height": 2}}',
     "job 'resize' cannot take the task's arguments: missing a required argument: 'width'"),
    ('{"job": "resize", "arguments": {"width": 1, "depth": 2}}',
     "unexpected keyword argument 'depth'"),
    ('{"job": "resize", "arguments": [1]}', "must be a JSON object"),
    ('{"width": 10}', "the task's parameters name no job"),
    ("not json", "the task's parameters name no job"),
])
def test_a_task_the_registry_cannot_run_fails_not_retried(parameters: str, error: str) -> None:
    outcome = execute(jobs, task_with(parameters))
    assert outcome.outcome == "failed" and outcome.retry is False
    assert error in outcome.text and outcome.text.startswith("not run: ")
    assert outcome.traceback is None  # nothing of the job ran: no traceback to read


def test_a_jobs_own_exception_is_an_ordinary_failure() -> None:
    outcome = execute(jobs, TaskView("t1", {"parameters": jobs.parameters("flaky", succeed_on=2),
                                           "attempts": "1"}))
    assert outcome.outcome == "failed" and outcome.retry is True
    assert outcome.text == "attempt 1 failed" and "Traceback" in (outcome.traceback or "")


def test_the_listener_imports_a_registry_as_its_task_function() -> None:
    assert import_function("tests.job_registry:jobs") is jobs


def test_an_empty_registry_is_refused_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.job_registry as module

    monkeypatch.setattr(module, "empty", blueque.Jobs(), raising=False)
    with pytest.raises(blueque.CallbackError, match=r"a blueque\.Jobs with no job registered"):
        import_function("tests.job_registry:empty")
