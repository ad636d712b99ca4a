"""The blocks of docs/how-to/fleet-controls.md run as written (tests/test_readme.py's
DOC_BLOCKS names each one's test), against the private redis-server, with a real listener."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

import blueque
from blueque.keys import Keys
from tests.daemons import wait_until
from tests.readme import DOCS, Shell, block, commands, markdown_blocks

PAGE = DOCS / "how-to" / "fleet-controls.md"
KEYS = Keys()
#: The URL the page's code connects to, which the tests point at their own Redis.
PAGE_URL = '"redis://localhost:6379/0"'


def page_block(section: str, number: int) -> str:
    found = [b for b in markdown_blocks(PAGE) if b.key == (section, number)]
    assert found, f"{PAGE.name} has no block {number} under {section!r}"
    return found[0].text


def run_code(section: str, number: int, redis_url: str) -> None:
    code = page_block(section, number)
    assert code.count(PAGE_URL) == 1
    exec(code.replace(PAGE_URL, repr(redis_url)), {})  # the page's own lines


def test_the_limits_code_runs_as_written(redis_url: str, redis_client: redis.Redis) -> None:
    run_code("Concurrency limits per key", 1, redis_url)
    assert redis_client.hgetall(KEYS.limits()) == {"db-7": "2"}
    ids = redis_client.lrange(KEYS.pending("reports"), 0, -1)
    ids += redis_client.zrange(KEYS.scheduled("reports"), 0, -1)
    assert len(ids) == 4
    assert {redis_client.hget(KEYS.task(i), "concurrency_key") for i in ids} == {"db-7"}
    assert redis_client.hget(KEYS.queue_config("exports"), "concurrency_key") == "db-7"


def test_the_limit_commands_run_as_written(redis_url: str, redis_client: redis.Redis,
                                           tmp_path: Path) -> None:
    shell = Shell(tmp_path, tmp_path, redis_url)
    try:
        set_it, show, clear = commands(page_block("Concurrency limits per key", 2))
        done = shell.run(set_it)
        assert done.returncode == 0, done.stderr
        assert redis_client.hget(KEYS.limits(), "db-7") == "2"
        done = shell.run(show)
        assert done.returncode == 0 and "db-7" in done.stdout and "2" in done.stdout
        done = shell.run(clear)
        assert done.returncode == 0, done.stderr
        assert redis_client.hget(KEYS.limits(), "db-7") is None
    finally:
        shell.close()


@pytest.mark.slow
def test_the_placement_listener_and_code_run_as_written(
        redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "mypackage").mkdir(parents=True)
    (project / "mypackage" / "__init__.py").write_text("")
    (project / "mypackage" / "jobs.py").write_text(
        "def train(task):\n    return 'trained ' + task.parameters\n")
    shell = Shell(tmp_path, project, redis_url)
    client = blueque.Client(redis_url)
    try:
        (line,) = commands(page_block("Placement by resources", 1))
        listener = shell.start(line + " --interval 0.5 --poll 0.1")
        listener.until("listening on training")
        run_code("Placement by resources", 2, redis_url)
        ids = [t for s in ("pending", "reserved", "started", "complete")
               for t in client.get_queue("training").task_ids(s)]
        assert len(ids) == 3
        wait_until(lambda: all(client.get_task(i).status == "complete" for i in ids), 60,
                   "the three trainings complete")
        assert {json.loads(client.get_task(i).parameters or "{}")["model"]
                for i in ids} == {"small", "huge", "cpu-only"}
        info = next(s.info for s in client.listeners(["training"]))
        assert json.loads(info["resources"]) == {"gpu": 2, "memory": 64 * 10**9}
    finally:
        client.close()
        shell.close()


@pytest.mark.slow
def test_the_readme_fleet_commands_run_as_written(redis_url: str, redis_client: redis.Redis,
                                                  tmp_path: Path) -> None:
    """README's "Running a fleet": the pause, the limit and the listener with resources, each
    line as written (the listener's module made for it), each doing what its comment says."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "jobs.py").write_text("def render(task):\n    return 'rendered'\n")
    shell = Shell(tmp_path, project, redis_url)
    client = blueque.Client(redis_url)
    try:
        pause, limit, listen = commands(block("Running a fleet").text)
        client.get_queue("reports").enqueue("{}")  # the pause is of a queue that exists
        assert shell.run(pause).returncode == 0
        assert client.get_queue("reports").stats().paused
        assert redis_client.hget(KEYS.paused("reports"), "reason") == "db migration"
        assert shell.run(limit).returncode == 0
        assert redis_client.hget(KEYS.limits(), "db-7") == "2"
        listener = shell.start(listen + " --interval 0.5 --poll 0.1")
        listener.until("listening on render")
        fits = client.get_queue("render").enqueue("{}", requires={"gpu": 1})
        wait_until(lambda: client.get_task(fits).status == "complete", 60,
                   "a task that fits the listener's resources run")
        info = next(s.info for s in client.listeners(["render"]))
        assert json.loads(info["resources"]) == {"gpu": 2, "memory": 64 * 10**9}
    finally:
        client.close()
        shell.close()
