"""The README's "Using it" example runs top to bottom as written (issue 9 §4), against the
private redis-server, with its task function served by a real `blueque listen` started from
the project directory, as the README says to."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.daemons import Daemon, daemons, listen_command, wait_until
from tests.test_cli import ROOT, environment

README = ROOT / "README.md"


def using_it_blocks() -> list[str]:
    """The ```python blocks of the "Using it" section, in order."""
    text = README.read_text("utf-8")
    section = text.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Daemon]]:
    with daemons(tmp_path) as running:
        yield running


@pytest.mark.slow
def test_using_it_runs_as_written(redis_url: str, redis_client: redis.Redis, tmp_path: Path,
                                  started: list[Daemon]) -> None:
    program, function = using_it_blocks()[:2]
    assert program.count('"redis://localhost:6379/0"') == 1
    program = program.replace('"redis://localhost:6379/0"', repr(redis_url))
    project = tmp_path / "project"
    (project / "mypackage").mkdir(parents=True)
    (project / "mypackage" / "__init__.py").write_text("")
    assert function.startswith("# mypackage/jobs.py\n")
    (project / "mypackage" / "jobs.py").write_text(function)
    # as the README's command line, from the project directory (bin/blueque is the checkout's
    # `blueque`; its script directory, not the current one, is what Python puts on the path)
    listener = Daemon([sys.executable, str(ROOT / "bin" / "blueque"), "listen", "documents",
                       "mypackage.jobs:ocr_page", "--concurrency", "2", "--url", redis_url,
                       "--interval", "0.5", "--poll", "0.1"], tmp_path / "listen.log",
                      cwd=project)
    started.append(listener)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=environment(), cwd=project, timeout=120)
    assert listener.stop() == 0
    assert done.returncode == 0, done.stderr + listener.log()
    lines = done.stdout.splitlines()
    assert lines[0] == "doc-42-page-7 False"
    assert lines[1] == "10000 0"
    assert lines[2] == 'complete {"words": 1234} 1 None'
    assert lines[3].startswith("QueueStats(") and "name='documents'" in lines[3]
    assert lines[4] == "cancelled"
    assert redis_client.hgetall("blueque_queue_config_documents") == {
        "max_attempts": "3", "result_ttl": "604800.0"}


def asyncio_blocks() -> list[str]:
    """The ```python blocks of the "asyncio" section, in order."""
    text = README.read_text("utf-8")
    section = text.split("\n## asyncio\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


@pytest.mark.slow
def test_the_asyncio_example_runs_as_written(redis_url: str, redis_client: redis.Redis,
                                             tmp_path: Path, started: list[Daemon]) -> None:
    program = asyncio_blocks()[0]
    assert program.count('"redis://localhost:6379/0"') == 1
    program = program.replace('"redis://localhost:6379/0"', repr(redis_url))
    project = tmp_path / "project"
    (project / "mypackage").mkdir(parents=True)
    (project / "mypackage" / "__init__.py").write_text("")
    (project / "mypackage" / "jobs.py").write_text(using_it_blocks()[1])
    listener = Daemon([sys.executable, str(ROOT / "bin" / "blueque"), "listen", "documents",
                       "mypackage.jobs:ocr_page", "--concurrency", "2", "--url", redis_url,
                       "--interval", "0.5", "--poll", "0.1"], tmp_path / "listen.log",
                      cwd=project)
    started.append(listener)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=environment(), cwd=project, timeout=120)
    assert listener.stop() == 0
    assert done.returncode == 0, done.stderr + listener.log()
    lines = done.stdout.splitlines()
    assert lines[0] == 'complete {"words": 1234}'
    updates = lines[1:-1]
    assert updates[-1] == "complete 0.9"  # the last progress the task reported, then its end
    assert all(line.split()[0] in ("pending", "reserved", "started", "complete")
               for line in updates)
    assert lines[-1] == "10"
    assert redis_client.llen("blueque_complete_tasks_documents") == 10


def test_python_requirement_matches_what_the_code_uses() -> None:
    """3.11: tomllib for cron files, fromisoformat with a "Z" for --eta; mypy and ruff
    target it too (one floor: the package's metadata is pyproject.toml's alone)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    assert pyproject["project"]["requires-python"] == ">=3.11"
    assert pyproject["tool"]["ruff"]["target-version"] == "py311"
    assert pyproject["tool"]["mypy"]["python_version"] == "3.11"
    assert not (ROOT / "setup.py").exists() and not (ROOT / "setup.cfg").exists()
    assert sys.version_info >= (3, 11)


def test_quick_start_names_every_debian_package_dev_installs() -> None:
    """A stranger reads what `./dev` will install on the machine before running it."""
    script = (ROOT / "dev").read_text("utf-8")
    packages = set(re.findall(r"packages\+=\(([^)]*)\)", script))
    names = {name for group in packages for name in group.split()
             if not name.startswith(("python3", '"'))}  # Python's own; the JRE is a variable
    assert {"redis-server", "redis-sentinel", "chromium", "procps", "openssl"} <= names
    text = README.read_text("utf-8")
    quick_start = " ".join(text.split("\n## Quick start", 1)[1].split("\n## ", 1)[0].split())
    assert [name for name in sorted(names) if f"`{name}`" not in quick_start] == []
    assert "a Java runtime" in quick_start
    assert ". .venv-ci/bin/activate" in quick_start  # where `blueque` is, then


def test_the_preemption_examples_pgrep_finds_the_listener(redis_url: str, tmp_path: Path,
                                                          started: list[Daemon]) -> None:
    """`pidof -s 'blueque listen'` found nothing (the listener is a python process whose
    title says `blueque listen QUEUES FUNCTION (ID)`), so `kill -USR1 $(...)` signalled none."""
    line = next(line for line in README.read_text("utf-8").splitlines()
                if line.startswith("kill -USR1 "))
    found = re.search(r"\$\(pgrep -f '([^']*)'\)", line)
    assert found is not None, line
    queue = f"readme-{uuid.uuid4().hex[:8]}"  # no other listener on this machine serves it
    pattern = found[1].replace("documents", queue)
    assert pattern == f"^blueque listen {queue} "
    listener = Daemon(listen_command(redis_url, queue, "tests.jobs:echo", "--interval", "0.5"),
                      tmp_path / "listen.log")
    started.append(listener)
    wait_until(lambda: "listening on" in listener.log(), what="the listener to start")
    pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    assert pids.split() == [str(listener.pid)]
