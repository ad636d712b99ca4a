"""``blueque listen QUEUE tests.job_registry:jobs``: one real listener runs several jobs by
name, with a process per task and with warm processes (--reuse); a task naming a job the
registry lacks, or arguments its function does not take, fails at once, not retried, and the
listener goes on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import blueque
from blueque.jobs import job_parameters
from tests.daemons import FAST, lines, wait_until
from tests.job_registry import jobs

pytestmark = pytest.mark.slow



@pytest.mark.parametrize("mode", [(), ("--reuse", "20")], ids=["process-per-task", "reuse"])
def test_one_listener_runs_every_job_its_tasks_name(client: blueque.Client, start: Any,
                                                    tmp_path: Path, mode: tuple[str, ...]
                                                    ) -> None:
    marker = str(tmp_path / "marker")
    queue = client.get_queue("images")
    daemon = start("images", "tests.job_registry:jobs", *FAST, *mode)
    wait_until(lambda: "is a registry of 3 job(s): resize, images.thumbnail, flaky"
               in daemon.log(), what="the listener to say which jobs it runs")
    resized = jobs.enqueue(queue, "resize", width=10, marker=marker)
    thumb = jobs.enqueue(queue, "images.thumbnail", path="a.png", marker=marker)
    flaky = jobs.enqueue(queue, "flaky", succeed_on=2, marker=marker, max_attempts=2,
                         retry_backoff=0.01)
    # what jobs.enqueue refuses, another producer may still write: the listener refuses it
    unknown = queue.enqueue(job_parameters("rotate", degrees=90), max_attempts=3)
    misspelt = queue.enqueue(job_parameters("resise", width=10), max_attempts=3)
    bad = queue.enqueue(job_parameters("resize", width=10, depth=2, marker=marker),
                        max_attempts=3)
    missing = queue.enqueue(job_parameters("resize", marker=marker), max_attempts=3)
    not_a_job = queue.enqueue(json.dumps({"width": 10}), max_attempts=3)
    after = jobs.enqueue(queue, "resize", width=4, height=3, marker=marker)

    done = {i: client.get_task(i).wait(30) for i in
            (resized, thumb, flaky, unknown, misspelt, bad, missing, not_a_job, after)}
    assert done[resized].status == "complete"
    assert json.loads(done[resized].result) == {"width": 10, "height": 10}
    assert done[after].result == '{"width": 4, "height": 3}'
    assert done[thumb].result == f"thumbnail of a.png (task {thumb}, attempt 1)"
    assert (done[flaky].status, done[flaky].attempts) == ("complete", 2)  # its own error: retried
    refusals = {
        unknown: "unknown job 'rotate' (the jobs registered here: flaky, images.thumbnail, "
                 "resize)",
        misspelt: "unknown job 'resise'; did you mean 'resize'?",
        bad: "job 'resize' cannot take the task's arguments: got an unexpected keyword "
             "argument 'depth'; its parameters are (width, height=0, marker=None)",
        missing: "missing a required argument: 'width'",
        not_a_job: "the task's parameters name no job",
    }
    for task_id, said in refusals.items():
        task = done[task_id]
        assert (task.status, task.attempts) == ("failed", 1), task.data  # never retried
        assert said in task.error and task.error.startswith("not run: ")
        assert not task.data.get("traceback")  # nothing of a job ran
        assert [entry["outcome"] for entry in task.history] == ["failed"]
    ran = lines(Path(marker))
    # each job ran once (flaky twice); the refused ones not at all
    assert sorted(line.rsplit(" ", 1)[0] for line in ran) == [
        "flaky attempt 1", "flaky attempt 2", "resize 10x0", "resize 4x3", "thumbnail a.png"]
    pids = {line.rsplit(" ", 1)[1] for line in ran}
    if mode:  # one warm process ran them all, refusals in between
        assert len(pids) == 1
    else:
        assert len(pids) == len(ran)
    assert daemon.alive()
    assert "Traceback" not in daemon.log()
    assert daemon.stop() == 0
