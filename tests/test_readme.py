"""Every fenced block of README.md and of every page of the documentation site (docs/) is run,
or checked, by a test (issue 9 §4, issue 21 §8, issue 32): BLOCKS and DOC_BLOCKS say which, and
test_every_readme_block_has_its_test holds the lists to the README and the pages. The
blocks run as written, against the private redis-server, with real daemons, from the
directories the pages imply; where a line names what this machine cannot have (a host
redis.internal, port 8080 that someone may use, /etc/blueque/token), its test says what it
puts there instead."""

from __future__ import annotations

import ast
import configparser
import json
import os
import re
import signal
import subprocess
import sys
import threading
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import redis

import blueque
from blueque.testing import RedisServer, free_port, stop_process
from tests.daemons import Daemon, daemons, listen_command, wait_until
from tests.readme import DOCS, Shell, block, commands, doc_blocks, doc_pages, program, readme_blocks
from tests.test_cli import ROOT, environment

README = ROOT / "README.md"


def first_job() -> str:
    """The README's task function (Your first job), mypackage/jobs.py of every example."""
    function = block("Your first job").text
    assert function.startswith("# mypackage/jobs.py\n")
    return function


#: The tutorial's steps that make one producer program, in order (its other blocks are their
#: own tests').
TUTORIAL_PROGRAM = ("Enqueue, wait, read the result", "Ids that make an enqueue safe to repeat",
                    "Retries and time limits", "Later, and many at once",
                    "Watching, cancelling, cleaning up")


def tutorial_program() -> str:
    return "".join(block(section, 1, "tutorial.md").text for section in TUTORIAL_PROGRAM)


@pytest.mark.slow
def test_the_tutorial_runs_as_written(redis_url: str, redis_client: redis.Redis, tmp_path: Path,
                                      started: list[Daemon]) -> None:
    """The tutorial's job (the README's own function), its listener's line, and its steps one
    after the other as one producer program."""
    assert block("The job and its listener", 1, "tutorial.md").text == first_job()
    program = tutorial_program()
    assert program.count('"redis://localhost:6379/0"') == 1
    program = program.replace('"redis://localhost:6379/0"', repr(redis_url))
    project = tmp_path / "project"
    (project / "mypackage").mkdir(parents=True)
    (project / "mypackage" / "__init__.py").write_text("")
    (project / "mypackage" / "jobs.py").write_text(first_job())
    # the tutorial's command line, from the project directory (bin/blueque is the checkout's
    # `blueque`; its script directory, not the current one, is what Python puts on the path)
    (line,) = commands(block("The job and its listener", 2, "tutorial.md").text)
    words = line.split()
    assert words[:3] == ["blueque", "listen", "documents"]
    listener = Daemon([sys.executable, str(ROOT / "bin" / "blueque"), *words[1:], "--url",
                       redis_url, "--interval", "0.5", "--poll", "0.1"],
                      tmp_path / "listen.log", cwd=project)
    started.append(listener)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=environment(), cwd=project, timeout=120)
    assert listener.stop() == 0
    assert done.returncode == 0, done.stderr + listener.log()
    lines = done.stdout.splitlines()
    assert lines[0] == 'complete {"words": 1234} 1 None'
    assert lines[1] == "doc-42-page-7 False"
    assert lines[2] == "10000 0"
    assert lines[3].startswith("QueueStats(") and "name='documents'" in lines[3]
    assert lines[4] == "cancelled"
    assert redis_client.hgetall("blueque_queue_config_documents") == {
        "max_attempts": "3", "result_ttl": "604800.0"}


@pytest.mark.slow
def test_the_asyncio_example_runs_as_written(redis_url: str, redis_client: redis.Redis,
                                             tmp_path: Path, started: list[Daemon]) -> None:
    program = block("The asyncio client", 1, "how-to/asyncio.md").text
    assert program.count('"redis://localhost:6379/0"') == 1
    program = program.replace('"redis://localhost:6379/0"', repr(redis_url))
    project = tmp_path / "project"
    (project / "mypackage").mkdir(parents=True)
    (project / "mypackage" / "__init__.py").write_text("")
    (project / "mypackage" / "jobs.py").write_text(first_job())
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
    # setup.py is the argument-less shim (tests/test_package_layout.py): no floor of its own
    assert not (ROOT / "setup.cfg").exists() and "python_requires" not in (
        ROOT / "setup.py").read_text("utf-8")
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
    assert ". .venv/bin/activate" in quick_start  # where `blueque` is, then


def test_dev_installs_only_what_each_command_needs() -> None:
    """`./dev demo` pip-installed pyspark, playwright, fastapi and pytest into whatever Python
    was first on PATH and apt-installed chromium and faketime, to run a demo: every command
    now works in .venv, and the demo takes this package alone and redis-server."""
    script = (ROOT / "dev").read_text("utf-8")
    extras = dict(re.findall(r"^    (\w+)\) extras=([\w,]*)", script, re.MULTILINE))
    assert extras["demo"] == "" and "spark" not in extras["lint"] + extras["docs"]
    assert {"test", "spark", "web", "docs"} <= set(extras["test"].split(","))
    # the browser, the clock faker, jq and Java come only with the whole suite ($full)
    full_only = script.split('if [ -n "$full" ]; then', 1)[1].split("\nfi\n", 1)[0]
    for package in ("chromium", "faketime", "redis-sentinel", "jq"):
        assert f"packages+=({package})" in full_only, package
    assert 'if [ -n "$full" ] && ! have java; then' in script
    assert 'run "$PYTHON" -m venv .venv' in script and 'export VIRTUAL_ENV="$PWD/.venv"' in script
    assert "pip install --user" not in script and "--break-system-packages" not in script


def test_the_preemption_examples_pgrep_finds_the_listener(redis_url: str, tmp_path: Path,
                                                          started: list[Daemon]) -> None:
    """`pidof -s 'blueque listen'` found nothing (the listener is a python process whose
    title says `blueque listen QUEUES FUNCTION (ID)`), so `kill -USR1 $(...)` signalled none."""
    line = next(line for line in (DOCS / "tutorial.md").read_text("utf-8").splitlines()
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


# --- every block, and the test that holds it -----------------------------------------------
#: Each block of README.md (its section and its place there) and the test that runs it, or,
#: for what cannot run on this machine, checks it (said in the test).
BLOCKS = {
    ("Running a fleet", 1):
        "tests/test_fleet_docs.py::test_the_readme_fleet_commands_run_as_written",
    ("Quick start (two commands on a fresh machine)", 1):
        "tests/test_readme.py::test_the_quick_start_is_what_ci_runs",
    ("Quick start (two commands on a fresh machine)", 2):
        "tests/test_readme.py::test_the_demo_and_the_first_job_run_in_a_fresh_virtualenv",
    **{("Your first job", n):
       "tests/test_readme.py::test_the_demo_and_the_first_job_run_in_a_fresh_virtualenv"
       for n in (1, 2, 3, 4)},
}


#: Each block of each page of the documentation site (its path under docs/, its section and
#: its place there) and the test that runs it.
DOC_BLOCKS: dict[tuple[str, str, int], str] = {
    **{("tutorial.md", section, n): "tests/test_readme.py::test_the_tutorial_runs_as_written"
       for section, n in (("The job and its listener", 1), ("The job and its listener", 2),
                          *((section, 1) for section in TUTORIAL_PROGRAM))},
    ("tutorial.md", "Checkpoints", 1):
        "tests/test_checkpoint.py::test_the_readme_example_resumes_where_it_left_off",
    ("tutorial.md", "Checkpoints", 2):
        "tests/test_checkpoint.py::test_the_readme_example_resumes_where_it_left_off",
    ("tutorial.md", "Preemption with notice", 1):
        "tests/test_readme.py::test_the_preemption_commands_run_as_written",
    ("tutorial.md", "Preemption with notice", 2):
        "tests/test_preemption.py::test_the_readme_preemption_example_runs_as_written",
    ("tutorial.md", "Tasks that wait for other tasks", 1):
        "tests/test_dependencies_e2e.py::test_the_readme_dependency_example_runs_as_written",
    ("tutorial.md", "Tasks that wait for other tasks", 2):
        "tests/test_dependencies_e2e.py::test_the_readme_dependency_example_runs_as_written",
    ("tutorial.md", "Tasks that wait for other tasks", 3):
        "tests/test_dependencies_e2e.py::test_the_readme_dependency_commands_run_as_written",
    **{("tutorial.md", "Several jobs behind one listener", n):
       "tests/test_readme.py::test_the_jobs_example_runs_as_written" for n in (1, 2, 3)},
    ("how-to/systemd.md", "The unit", 1):
        "tests/test_readme.py::test_the_systemd_unit_runs_a_listener",
    ("how-to/fleet.md", "Listeners and queues", 1):
        "tests/test_readme.py::test_the_listen_and_scheduler_lines_run_as_written",
    ("how-to/fleet.md", "Nodes", 1):
        "tests/test_readme.py::test_the_listen_and_scheduler_lines_run_as_written",
    ("how-to/fleet.md", "Warm task processes (--reuse)", 1):
        "tests/test_readme.py::test_the_reuse_line_runs_as_written",
    ("how-to/persistence.md", "Memory: `maxmemory-policy noeviction`", 1):
        "tests/test_readme.py::test_the_eviction_refusal_reads_as_the_readme_shows",
    ("how-to/persistence.md", "Disk: the append-only file", 1):
        "tests/test_readme.py::test_the_persistence_settings_are_redis_config",
    ("how-to/high-availability.md", "Sentinel", 1):
        "tests/ha/test_sentinel.py::test_the_readmes_sentinel_lines_run_with_its_sentinels",
    ("how-to/high-availability.md", "Sentinel", 2):
        "tests/ha/test_sentinel.py::test_the_readmes_sentinel_lines_run_with_its_sentinels",
    ("how-to/high-availability.md", "Redis Cluster", 1):
        "tests/ha/test_cluster.py::test_the_readmes_cluster_line_runs",
    ("how-to/scheduler.md", "The scheduler", 1):
        "tests/test_readme.py::test_the_scheduler_command_runs_with_the_readmes_cron_file",
    ("how-to/scheduler.md", "The scheduler", 2):
        "tests/test_readme.py::test_the_scheduler_command_runs_with_the_readmes_cron_file",
    ("how-to/spark.md", "From a DataFrame to tasks and back", 1):
        "tests/test_spark.py::test_the_readme_spark_example_runs_as_written",
    ("how-to/spark.md", "From a DataFrame to tasks and back", 2):
        "tests/test_spark.py::test_the_readme_pipeline_commands",
    ("how-to/spark.md", "From a DataFrame to tasks and back", 3):
        "tests/test_spark.py::test_the_readme_pipeline_commands",
    ("how-to/asyncio.md", "The asyncio client", 1):
        "tests/test_readme.py::test_the_asyncio_example_runs_as_written",
    ("how-to/asyncio.md", "A FastAPI service", 1):
        "tests/test_readme.py::test_the_fastapi_service_commands_run_as_written",
    ("how-to/asyncio.md", "A FastAPI service", 2):
        "tests/test_readme.py::test_the_fastapi_excerpt_is_the_examples_code",
    ("how-to/observability.md", "Task logs", 1):
        "tests/test_readme.py::test_the_operator_session_runs_as_written",
    ("how-to/observability.md", "The listener's log", 1):
        "tests/test_readme.py::test_the_sample_log_lines_are_a_listeners",
    ("how-to/observability.md", "Metrics", 1): "tests/test_metrics.py::"
        "test_readme_documents_every_exported_metric_and_their_names_follow_conventions",
    ("how-to/operating.md", "An operator's session", 1):
        "tests/test_readme.py::test_the_operator_session_runs_as_written",
    ("how-to/operating.md", "JSON for scripts", 1):
        "tests/test_cli_output.py::test_the_readmes_jq_examples_count_right",
    ("how-to/dashboard.md", "Starting it", 1):
        "tests/test_readme.py::test_the_dashboard_commands_run_as_written",
    ("how-to/dashboard.md", "Mounting it in a service", 1):
        "tests/test_readme.py::test_the_dashboard_mounts_as_written",
    ("how-to/acl.md", "One user per role", 1):
        "tests/test_acl.py::test_the_docs_list_each_role_s_acl_line",
    ("how-to/redis-cli.md", "The keys to look at", 1):
        "tests/test_readme.py::test_the_operator_session_runs_as_written",
    ("performance.md", "How it is measured", 1):
        "tests/test_readme.py::test_the_benchmark_commands_parse_as_written",
    ("performance.md", "Targets not met, and why", 1):
        "tests/test_readme.py::test_the_drain_cpu_figures_are_the_tools_table",
    ("how-to/fleet-controls.md", "Concurrency limits per key", 1):
        "tests/test_fleet_docs.py::test_the_limits_code_runs_as_written",
    ("how-to/fleet-controls.md", "Concurrency limits per key", 2):
        "tests/test_fleet_docs.py::test_the_limit_commands_run_as_written",
    ("how-to/fleet-controls.md", "Placement by resources", 1):
        "tests/test_fleet_docs.py::test_the_placement_listener_and_code_run_as_written",
    ("how-to/fleet-controls.md", "Placement by resources", 2):
        "tests/test_fleet_docs.py::test_the_placement_listener_and_code_run_as_written",
    ("how-to/pause.md", "Pausing a queue", 1):
        "tests/test_pause.py::test_the_docs_pause_lines_run_as_written",
    ("how-to/pause.md", "Pausing a queue", 2):
        "tests/test_pause.py::test_the_docs_pause_example_runs_as_written",
    ("how-to/containers.md", "Running listeners in containers and on Kubernetes", 1):
        "tests/test_deploy.py::test_the_docs_listen_line_is_the_images",
    ("how-to/containers.md", "The image and the manifests", 1):
        "tests/test_deploy.py::test_the_docs_build_and_apply_lines_name_what_deploy_has",
}


def test_every_readme_block_has_its_test() -> None:
    """A block added to the README or to a page of the site without a test that runs it fails
    here; so does a test named here that does not exist."""
    assert {b.key for b in readme_blocks()} == set(BLOCKS)
    assert set(doc_blocks()) == set(DOC_BLOCKS)
    for node in {*BLOCKS.values(), *DOC_BLOCKS.values()}:
        path, name = node.split("::")
        tree = ast.parse((ROOT / path).read_text("utf-8"))
        assert name in {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}, node


# --- what cannot run in a test: CI runs it ---------------------------------------------------
def test_the_quick_start_is_what_ci_runs() -> None:
    """`./dev test` cannot run inside the suite it runs: CI (.ci/run, on a fresh machine) runs
    the Quick start's lines as written, in order, after `./dev lint`."""
    quick_start = [program(line) for line in commands(
        block("Quick start (two commands on a fresh machine)").text)]
    assert quick_start == ["./dev demo", "./dev test"]
    ci = [line for line in (ROOT / ".ci" / "run").read_text("utf-8").splitlines()
          if line.startswith("./dev")]
    assert ci == ["./dev lint", *quick_start]
    tests = README.read_text("utf-8").split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    assert tests.strip().startswith("`./dev test` runs every test")  # the test command


def test_the_readme_is_a_short_first_contact() -> None:
    """Issue 32: at most 250 lines, in the order a newcomer needs them (what it is, why for
    long jobs, install, a first job of one's own: task function, listener, enqueue, result;
    the tests; links into the site), and every link into the site goes to a page that is
    there, a "Running a fleet" one among them."""
    text = README.read_text("utf-8")
    assert len(text.splitlines()) <= 250
    sections = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert sections == ["Why it suits hours-long jobs",
                        "Quick start (two commands on a fresh machine)", "Your first job",
                        "Running a fleet", "Tests", "Documentation"]
    first_job = text.split("\n## Your first job\n", 1)[1].split("\n## ", 1)[0]
    steps = re.findall(r"^\*\*(\d)\. ([^*]+)\*\*", first_job, re.MULTILINE)
    assert steps == [("1", "The task function."), ("2", "The listener."), ("3", "Enqueue."),
                     ("4", "The result.")]
    links = re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]+)?\)", text)
    assert "docs/how-to/fleet.md" in links and "docs/tutorial.md" in links
    assert [link for link in links if not (ROOT / link).is_file()] == []
    assert "[Running a fleet](docs/how-to/fleet.md)" in text


@pytest.mark.slow
def test_the_demo_and_the_first_job_run_in_a_fresh_virtualenv(tmp_path: Path,
                                                              redis_url: str) -> None:
    """The line without ./dev, as written, from the checkout: a virtualenv of its own (here
    in the test's directory, not the checkout's .venv), this package alone from the package
    index's dependencies, and the demo on its private redis-server. Then the README's first
    job with nothing but that virtualenv and the README: its two files in a project directory
    of their own, its listener's line, its program and its result's lines, with the
    virtualenv's `blueque` and `python` first on PATH and $BLUEQUE_URL the test's Redis."""
    (line,) = commands(block("Quick start (two commands on a fresh machine)", 2).text)
    assert line == ("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
                    "blueque demo")
    venv = tmp_path / "venv"
    shell = Shell(tmp_path, ROOT, redis_url, replace={".venv": str(venv)},
                  env={"BLUEQUE_URL": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    shell.env.pop("BLUEQUE_URL")  # the demo's own redis-server, as on a fresh machine
    shell.env.pop("VIRTUAL_ENV", None)
    try:
        done = shell.run(line, timeout=600)
    finally:
        shell.close()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "demo OK" in done.stdout
    assert (venv / "bin" / "blueque").exists()
    # the demo needs no browser, Java nor Spark: none of them came with it
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list"],
                            capture_output=True, text=True, check=True).stdout.lower()
    assert "blueque" in listed and not {"pyspark", "playwright", "pytest"} & set(
        word for line in listed.splitlines() for word in line.split()[:1])

    function, listen, producer, result = (block("Your first job", n) for n in (1, 2, 3, 4))
    project = tmp_path / "first-job"
    (project / "mypackage").mkdir(parents=True)
    (project / "mypackage" / "__init__.py").write_text("")  # "beside an empty __init__.py"
    assert function.text.startswith("# mypackage/jobs.py\n")
    (project / "mypackage" / "jobs.py").write_text(function.text)
    assert producer.text.startswith("# enqueue.py\n")
    assert producer.text.count('"redis://localhost:6379/0"') == 1
    (project / "enqueue.py").write_text(
        producer.text.replace('"redis://localhost:6379/0"', repr(redis_url)))
    (tmp_path / "first-job-shell").mkdir()
    job = Shell(tmp_path / "first-job-shell", project, redis_url,
                env={"PATH": os.pathsep.join((str(venv / "bin"), os.environ["PATH"])),
                     "VIRTUAL_ENV": str(venv)})
    try:
        (listen_line,) = commands(listen.text)
        listener = job.start(listen_line)
        listener.until("listening on")
        run, tasks, status = commands(result.text)
        ran = job.run(run, timeout=120)
        assert ran.returncode == 0, ran.stderr + listener.output()
        enqueued, outcome = ran.stdout.splitlines()
        task_id = enqueued.removeprefix("enqueued ")
        assert outcome == 'complete {"words": 1234}'
        listed_tasks = job.run(tasks)
        assert listed_tasks.returncode == 0 and task_id in listed_tasks.stdout, listed_tasks
        shown = job.run(status)
        assert shown.returncode == 0 and "documents" in shown.stdout, shown
        assert listener.stop() == 0, listener.output()
        assert "Traceback" not in listener.output()
    finally:
        job.close()


# --- the package's name and its extras -------------------------------------------------------
def test_every_pip_install_names_this_checkouts_extras() -> None:
    """`pip install 'blueque[test]'` outside the checkout installs the original blueque 1.0.1
    from the package index, which has no such extra. Every pip line installs the checkout
    (`-e '.[extra]'`, or a path), with extras pyproject.toml has."""
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"][
        "optional-dependencies"])
    text = "\n".join(page.read_text("utf-8") for page in (README, *doc_pages()))
    warning = "`pip install 'blueque[web]'` anywhere else fetches the original `blueque==1.0.1`"
    assert warning in " ".join(text.split())  # the one that says what not to do, and why
    installs = re.findall(r"pip install ([^`\n#&]*)", text.replace("pip install 'blueque[", ""))
    assert len(installs) >= 4
    for install in installs:
        spec = install.split()[-1].strip("'\"")
        if spec == ".":  # the checkout without extras: the plain quick start
            assert install.strip() == "-e .", install
            continue
        if spec.startswith("/") and "[" not in spec:  # the checkout, by its path
            continue
        assert re.fullmatch(r"(\.|/\S+)\[[a-z,]+\]", spec), install
        assert set(spec.split("[")[1].rstrip("]").split(",")) <= extras, install
    for path in ("blueque/cli/daemons.py", "blueque/web/__init__.py", "blueque/spark/__init__.py",
                 "examples/fastapi_service.py"):
        assert "pip install 'blueque[" not in (ROOT / path).read_text("utf-8"), path
        assert "pip install blueque[" not in (ROOT / path).read_text("utf-8"), path


#: Host names of package registries (written in two parts, so that this file is no exception).
REGISTRY_HOSTS = ["pypi" + ".org", "pythonhosted" + ".org", "pypi.python" + ".org",
                  "npmjs" + ".org", "npmjs" + ".com", "crates" + ".io", "rubygems" + ".org",
                  "proxy.golang" + ".org", "repo.maven" + ".apache.org", "anaconda" + ".org"]


def test_no_registry_host_names_in_the_project() -> None:
    """The README linked the original on a package registry by its URL; it names it as
    `blueque==1.0.1`, and no file of the project names a registry's host."""
    found = []
    for directory, subdirectories, files in os.walk(ROOT):
        subdirectories[:] = [d for d in subdirectories if not d.startswith(".")
                             and d not in ("build", "dist", "__pycache__", "node_modules")
                             and not d.endswith(".egg-info")]
        for name in files:
            path = Path(directory, name)
            try:
                text = path.read_text("utf-8").lower()
            except (UnicodeDecodeError, OSError):
                continue  # images, parquet
            found += [f"{path.relative_to(ROOT)}: {host}" for host in REGISTRY_HOSTS
                      if host in text]
    assert found == []
    first = README.read_text("utf-8").split("\n## ", 1)[0]
    assert "`blueque==1.0.1`" in first


# --- daemons' command lines -----------------------------------------------------------------
def project(tmp_path: Path) -> Path:
    """The README's project directory: mypackage/jobs.py as "Your first job" has it."""
    root = tmp_path / "project"
    (root / "mypackage").mkdir(parents=True)
    (root / "mypackage" / "__init__.py").write_text("")
    (root / "mypackage" / "jobs.py").write_text(first_job())
    return root


@pytest.fixture
def shell(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Iterator[Shell]:
    """bash in the README's project directory, on the emptied private Redis."""
    sh = Shell(tmp_path, project(tmp_path), redis_url)
    yield sh
    sh.close()


@pytest.mark.slow
def test_the_listen_and_scheduler_lines_run_as_written(shell: Shell,
                                                       client: blueque.Client) -> None:
    """The fleet page's daemons (a listener, weighted queues, a scheduler with a cron entry)
    and its nodes' (a node name): each starts as written and stops with SIGTERM (0)."""
    lines = commands(block("Listeners and queues", 1, "how-to/fleet.md").text) + commands(
        block("Nodes", 1, "how-to/fleet.md").text)
    assert len(lines) == 5
    ready = {"listen": "listening on", "scheduler": "scheduler started"}
    for line in lines:
        started = shell.start(line)
        started.until(ready[program(line).split()[1]])
        if "--cron 'nightly=" in line:
            started.until("cron entry nightly registered")
        if "--node-name gpu-7" in line and " listen " in f" {line}":
            assert [i.listener for i in client.listeners(["documents"])] == [
                f"gpu-7_{started.process.pid}"]
        assert started.stop() == 0, started.output()
        assert "Traceback" not in started.output()


@pytest.mark.slow
def test_the_jobs_example_runs_as_written(shell: Shell, redis_url: str,
                                          client: blueque.Client) -> None:
    """"Several jobs behind one listener": the registry module, its listener's line and the
    producer, as written; then a task naming an unknown job fails, not retried."""
    registry, listen, producer = (block("Several jobs behind one listener", n, "tutorial.md")
                                  for n in (1, 2, 3))
    assert registry.text.startswith("# mypackage/images.py\n")
    (shell.cwd / "mypackage" / "images.py").write_text(registry.text)
    (line,) = commands(listen.text)
    listener = shell.start(line)
    listener.until("is a registry of 2 job(s): resize, images.thumbnail")
    program = producer.text.replace('"redis://localhost:6379/0"', repr(redis_url))
    assert program != producer.text
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=environment(), cwd=shell.cwd, timeout=120)
    assert done.returncode == 0, done.stderr + listener.output()
    assert done.stdout == '{"width": 10, "height": 10}\n'
    queue = client.get_queue("images")
    unknown = queue.enqueue(blueque.job_parameters("resise", width=1), max_attempts=3)
    task = client.get_task(unknown).wait(30)
    assert (task.status, task.attempts) == ("failed", 1)
    assert task.error.startswith("not run: unknown job 'resise'; did you mean 'resize'?")
    assert listener.stop() == 0, listener.output()


@pytest.mark.slow
def test_the_reuse_line_runs_as_written(shell: Shell, client: blueque.Client) -> None:
    """"Warm task processes"' listener starts as written, runs tasks, and stops with SIGTERM
    (0)."""
    (line,) = commands(block("Warm task processes (--reuse)", 1, "how-to/fleet.md").text)
    started = shell.start(line)
    started.until("listening on")
    ids = [client.get_queue("documents").enqueue(json.dumps({"page": n})) for n in range(3)]
    assert [client.get_task(i).wait(30).status for i in ids] == ["complete"] * 3
    assert started.stop() == 0, started.output()
    assert "Traceback" not in started.output()


@pytest.mark.slow
def test_the_scheduler_command_runs_with_the_readmes_cron_file(shell: Shell,
                                                               client: blueque.Client) -> None:
    """The scheduler's example with the README's own cron file refused to start ("two cron
    entries are named 'nightly'"). /etc/blueque/cron.toml is the README's toml block, in a
    file of the test's. Every entry is registered and the 10-second one fires."""
    cron = shell.directory / "cron.toml"
    cron.write_text(block("The scheduler", 2, "how-to/scheduler.md").text)
    shell.replace["/etc/blueque/cron.toml"] = str(cron)
    (line,) = commands(block("The scheduler", 1, "how-to/scheduler.md").text)
    started = shell.start(line)
    for name in ("nightly", "beat", "monthly"):
        started.until(f"cron entry {name} registered")
    started.until("cron entry beat fired tick", timeout=30)
    assert started.stop() == 0, started.output()
    assert client.get_queue("health").stats().pending >= 1


@pytest.mark.slow
def test_the_systemd_unit_runs_a_listener(shell: Shell, redis_url: str) -> None:
    """systemd is not here: the unit is read as systemd reads it (KillMode=process, the one
    setting adoption needs), and its ExecStart runs with its Environment, the checkout's
    bin/blueque for /usr/local/bin/blueque and a log directory of the test's."""
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(block("The unit", 1, "how-to/systemd.md").text)
    service = unit["Service"]
    assert (service["KillMode"].split()[0], service["Restart"]) == ("process", "always")
    variable, value = service["Environment"].split("=", 1)
    assert variable == "BLUEQUE_URL" and value.startswith("redis://")
    shell.replace.update({"/usr/local/bin/blueque": str(ROOT / "bin" / "blueque"),
                          "/var/log/blueque": str(shell.directory / "task-logs")})
    started = shell.start(service["ExecStart"])
    started.until("listening on")
    assert started.stop() == 0, started.output()


# --- the operator's session -----------------------------------------------------------------
#: Command lines of the Operator CLI block that run until stopped: what says they are ready,
#: the signal that stops them, and how they end then (uvicorn, serving the dashboard, stops
#: serving and then ends by the signal it caught, as it was asked to).
DAEMONS = {"status --watch": ("QUEUE", signal.SIGINT, (0,)),
           "listen": ("listening on", signal.SIGTERM, (0,)),
           "scheduler": ("scheduler started", signal.SIGTERM, (0,)),
           "dashboard": ("dashboard on http", signal.SIGTERM, (0, -signal.SIGTERM)),
           "metrics": ("metrics of every queue on", signal.SIGTERM, (0,))}


@pytest.mark.slow
def test_the_operator_session_runs_as_written(shell: Shell, client: blueque.Client,
                                              redis_url: str, redis_server: RedisServer,
                                              tmp_path: Path) -> None:
    """The Operator CLI block top to bottom, then Task logs' and redis-cli's, with a listener
    serving documents (tests.jobs:page: prints, saves a checkpoint, fails a page that is not a
    number). Every line exits 0 (a daemon once stopped); ports 8080 and 9309 are free ones,
    and the queue imports-2025 is there, empty, as the line that forgets it says."""
    shell.replace.update({"--port 8080": f"--port {free_port()}",
                          "--port 9309": f"--port {free_port()}"})
    client.get_queue("imports-2025").configure(max_attempts=1)
    with daemons(tmp_path) as started:
        started.append(Daemon(listen_command(redis_url, "documents", "tests.jobs:page",
                                             "--interval", "0.5", "--poll", "0.1"),
                              tmp_path / "listener.log"))
        outputs = {}
        for line in commands(block("An operator's session", 1, "how-to/operating.md").text):
            kind = next((k for k in DAEMONS if program(line).startswith(f"blueque {k}")), None)
            if kind is None:
                done = shell.run(line)
                assert done.returncode == 0, (line, done.stdout, done.stderr)
                assert "Traceback" not in done.stderr and "warning" not in done.stderr, line
                outputs[line] = done.stdout
                continue
            ready, signum, ends = DAEMONS[kind]
            daemon = shell.start(line)
            daemon.until(ready)
            assert daemon.stop(signum) in ends, (line, daemon.output())
            assert "Traceback" not in daemon.output(), line
        said = dict(zip([program(line) for line in outputs], outputs.values(), strict=True))
        assert said["echo '{\"page\": 9}' | blueque enqueue documents - --wait --timeout 2h"
                    ] == '{"words": 1234}\n'
        again = "blueque --json enqueue documents '{\"page\": 7}' --task-id doc-42-page-7"
        assert json.loads(said[again])["created"] is False
        assert json.loads(said["blueque show doc-42-page-7 --checkpoint"]) == {
            "page": 7, "done": True}
        assert said["blueque logs doc-42-page-7 --attempt 1 --follow"] == "reading page 7\n"
        daily = client.get_task(next(i for i in client.get_queue("reports").task_ids(
            "scheduled", 0, -1) if i != "weekly-48"))
        tomorrow = datetime.now().astimezone().replace(hour=6, minute=0, second=0,
                                                        microsecond=0) + timedelta(days=1)
        assert daily.eta == tomorrow.timestamp()
        assert client.get_task("weekly-48").data.get("cancelled")
        assert "imports-2025" not in client.queue_names()

        for line in commands(block("Task logs", 1, "how-to/observability.md").text):
            done = shell.run(line)
            assert done.returncode == 0 and "reading page 7" in done.stdout, (line, done)
        shell.replace["redis-cli "] = f"redis-cli -p {redis_server.port} "
        for line in commands(block("The keys to look at", 1, "how-to/redis-cli.md").text):
            if " SUBSCRIBE " in line:
                subscriber = shell.start(line)
                subscriber.until("blueque_done_documents")
                subscriber.stop()
                continue
            done = shell.run(line)
            assert done.returncode == 0 and "ERR" not in done.stdout, (line, done)
        hashed = shell.run("redis-cli HGETALL blueque_task_doc-42-page-7").stdout.split()
        assert hashed[hashed.index("status") + 1] == "complete"
        tails = shell.run("redis-cli GET blueque_output_doc-42-page-7").stdout
        assert "reading page 7" in tails  # its attempt ended: its tail is there (5.19)


@pytest.mark.slow
def test_the_sample_log_lines_are_a_listeners(redis_url: str, client: blueque.Client,
                                              tmp_path: Path) -> None:
    """The two lines Task logs shows are what a listener writes for an attempt that fails
    and is retried, then one that completes: the same words, with this run's values."""
    samples = [line for line in block("The listener's log", 1,
                                      "how-to/observability.md").text.splitlines() if line]
    with daemons(tmp_path) as started:
        listener = Daemon(listen_command(redis_url, "documents", "tests.jobs:acts", "--interval",
                                         "0.5", "--poll", "0.1"), tmp_path / "listener.log")
        started.append(listener)
        task_id = client.get_queue("documents").enqueue(
            json.dumps({"fail": "bad page", "fail_until": 2}), max_attempts=2,
            retry_backoff=0.2)
        assert client.get_task(task_id).wait(30).status == "complete"
        wait_until(lambda: "attempt 2 complete in" in listener.log(), what="the second line")
    written = [line.split("blueque.daemon: ", 1)[1] for line in listener.log().splitlines()
               if "blueque.daemon: task " in line]
    # the sample's values, and what this run's may be
    values = {"5f0c...": r"\S+", "3h12m": r"\S+", "2h58m": r"\S+", "30s": r"\S+",
              "ValueError: bad page": r".+", "4242": r"\d+", "5150": r"\d+",
              "ocr-7:1c2d3e4f5a6b": r"\S+"}
    assert all(any(value in sample for sample in samples) for value in values)

    def shape(sample: str) -> str:
        for number, value in enumerate(values):
            sample = sample.replace(value, f"@@{number}@@")
        pattern = re.escape(sample)
        for number, value in enumerate(values):
            pattern = pattern.replace(f"@@{number}@@", values[value])
        return pattern

    assert len(samples) == 2
    for sample in samples:
        assert any(re.fullmatch(shape(sample), line) for line in written), (sample, written)


# --- the FastAPI service --------------------------------------------------------------------
@pytest.mark.slow
def test_the_fastapi_service_commands_run_as_written(shell: Shell, redis_url: str) -> None:
    """The listener and uvicorn lines from the checkout (examples/ is a path of it), the
    curl lines against them: port 8000 is a free port (uvicorn is told it), and <task id>
    the id the POST answered. The pip line is test_every_pip_install_names_this_checkouts_
    extras's."""
    shell.cwd = ROOT
    port = free_port()
    shell.replace.update({"localhost:8000": f"localhost:{port}",
                          "uvicorn fastapi_service:app": f"uvicorn fastapi_service:app "
                                                         f"--port {port}"})
    pip, listen, serve, post, events = commands(block("A FastAPI service", 1,
                                                      "how-to/asyncio.md").text)
    assert program(pip).startswith("pip install -e '.[test]'")
    shell.start(listen).until("listening on")
    shell.start(serve).until("Application startup complete")
    created = shell.run(post)
    assert created.returncode == 0, created
    task_id = json.loads(created.stdout)["task_id"]
    shell.replace["<task id>"] = task_id
    streamed = shell.run(events, timeout=120)
    assert streamed.returncode == 0 and "event: end" in streamed.stdout, streamed
    end = streamed.stdout.split("event: end\ndata: ", 1)[1].splitlines()[0]
    assert json.loads(end)["status"] == "complete"


def test_the_fastapi_excerpt_is_the_examples_code() -> None:
    """"The heart of it" is examples/fastapi_service.py's own code, not a paraphrase."""
    excerpt = block("A FastAPI service", 2, "how-to/asyncio.md").text
    assert excerpt in (ROOT / "examples" / "fastapi_service.py").read_text("utf-8")


# --- the dashboard --------------------------------------------------------------------------
def http_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status, answer.read().decode()


@pytest.mark.slow
def test_the_dashboard_commands_run_as_written(shell: Shell, redis_url: str) -> None:
    """Each dashboard line serves its pages: redis.internal is the test's Redis, port 8080
    (the default) a free port, /etc/blueque/token and cron.toml files of the test's (the
    README's cron file)."""
    token, cron = shell.directory / "token", shell.directory / "cron.toml"
    token.write_text("s3cret\n")
    cron.write_text(block("The scheduler", 2, "how-to/scheduler.md").text)
    shell.replace.update({"redis://redis.internal:6379/0": redis_url,
                          "/etc/blueque/token": str(token), "/etc/blueque/cron.toml": str(cron)})
    pip, *lines = commands(block("Starting it", 1, "how-to/dashboard.md").text)
    assert program(pip).startswith("pip install -e '.[web]'")
    assert len(lines) == 3
    for line in lines:
        port = free_port()
        shell.replace["--port 8080"] = f"--port {port}"
        command = line.split("  #", 1)[0].rstrip()
        started = shell.start(command if "--port" in command else f"{command} --port 8080")
        said = started.until("dashboard on http")
        assert f"http://127.0.0.1:{port}/" in said
        assert ("actions enabled" in said) == ("TOKEN" in line)
        assert http_get(f"http://127.0.0.1:{port}/")[0] == 200
        if "--cron-file" in line:
            assert "monthly" in http_get(f"http://127.0.0.1:{port}/schedule")[1]
        assert started.stop() in DAEMONS["dashboard"][2], started.output()
        assert "Traceback" not in started.output()


def test_the_dashboard_mounts_as_written(redis_url: str, client: blueque.Client) -> None:
    """The mount line in a Starlette service (``app``), served by uvicorn; redis.internal is
    the test's Redis."""
    import uvicorn
    from starlette.applications import Starlette

    client.get_queue("jobs").enqueue("{}", task_id="one")
    code = block("Mounting it in a service", 1, "how-to/dashboard.md").text.replace(
        "redis://redis.internal:6379/0", redis_url)
    namespace: dict[str, object] = {"app": Starlette()}
    exec(code, namespace)  # the README's own lines
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(namespace["app"], host="127.0.0.1",  # type: ignore[arg-type]
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, what="uvicorn serving")
        status, page = http_get(f"http://127.0.0.1:{port}/blueque/queue?name=jobs")
        assert status == 200 and 'href="/blueque/task?id=one"' in page
    finally:
        server.should_exit = True
        thread.join(20)


# --- Persistence, Performance ---------------------------------------------------------------
def test_the_eviction_refusal_reads_as_the_readme_shows() -> None:
    """The listener's refusal of an evicting Redis is the README's, word for word but for the
    server's address and the listener's id (the README's "...")."""
    shown = block("Memory: `maxmemory-policy noeviction`", 1,
                  "how-to/persistence.md").text.splitlines()
    assert shown[0] == "$ blueque listen documents mypackage.jobs:ocr_page"
    with RedisServer(extra_args=("--maxmemory", "4gb", "--maxmemory-policy", "allkeys-lru")
                     ) as server:
        done = subprocess.run(
            [sys.executable, "-m", "blueque.cli", "listen", "documents", "tests.jobs:text",
             "--url", server.url], capture_output=True, text=True, timeout=60, cwd=ROOT,
            env=environment())
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.replace(f"127.0.0.1:{server.port}", "10.0.0.5:6379").split())
    for part in " ".join(shown[1:]).split("..."):
        assert " ".join(part.split()) in said, (part, said)


def test_the_persistence_settings_are_redis_config(tmp_path: Path) -> None:
    """The two lines are a redis.conf that redis-server takes as it is (here with a port and
    a directory of the test's after them)."""
    config = tmp_path / "redis.conf"
    config.write_text(block("Disk: the append-only file", 1, "how-to/persistence.md").text)
    port = free_port()
    server = subprocess.Popen(["redis-server", str(config), "--port", str(port), "--bind",
                               "127.0.0.1", "--dir", str(tmp_path), "--save", ""],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        settings = redis.Redis(port=port, decode_responses=True)
        wait_until(lambda: _answers(settings), what="redis-server with the README's settings")
        assert settings.config_get("appendonly") == {"appendonly": "yes"}
        assert settings.config_get("appendfsync") == {"appendfsync": "everysec"}
        settings.close()
    finally:
        stop_process(server)


def _answers(server: redis.Redis) -> bool:
    try:
        return bool(server.ping())
    except redis.ConnectionError:
        return False


#: Runs a command line's module or script up to its argument parsing, and exits 0 if its
#: own parser accepted the arguments (2 with argparse's message if not): a check of lines
#: that take minutes (the full benchmark) or a machine this is not (spark-submit on YARN).
PARSES = """
import argparse, runpy, sys
class Parsed(Exception):
    pass
parse_args = argparse.ArgumentParser.parse_args
def parsed(self, args=None, namespace=None):
    parse_args(self, args, namespace)
    raise Parsed
argparse.ArgumentParser.parse_args = parsed
target, sys.argv = sys.argv[1], sys.argv[1:]
try:
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
except Parsed:
    sys.exit(0)
sys.exit("ran without parsing its arguments")
"""


def parses(words: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` or ``python SCRIPT ARGS`` parsed, not run."""
    target = words[2:] if words[1] == "-m" else words[1:]
    return subprocess.run([sys.executable, "-c", PARSES, *target], capture_output=True,
                          text=True, env=environment(), cwd=ROOT, timeout=120)


#: PARSES for many command lines in one process (one Python start, its imports shared): argv
#: the lines as JSON; prints, last, a JSON list of [exit code, stderr] for each.
PARSES_MANY = PARSES.split("target, sys.argv")[0] + """
import contextlib, io, json
results = []
for target, *arguments in json.loads(sys.argv[1]):
    sys.argv, code, err = [target, *arguments], "ran without parsing its arguments", io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        except Parsed:
            code = 0
        except SystemExit as exit:
            code = exit.code
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def parse_many(lines: list[list[str]]) -> list[tuple[int | str, str]]:
    """``python -m MODULE ARGS`` lines parsed, not run, in one process: exit code and stderr
    of each (as ``parses``)."""
    done = subprocess.run([sys.executable, "-c", PARSES_MANY,
                           json.dumps([words[2:] for words in lines])],
                          capture_output=True, text=True, env=environment(), cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0 and all(words[1] == "-m" for words in lines), done.stderr
    return [(code, err) for code, err in json.loads(done.stdout.splitlines()[-1])]


def test_the_benchmark_commands_parse_as_written() -> None:
    """The full run takes 23 minutes: tests/test_benchmarks.py runs --smoke; here every line
    of the block is accepted by its tool's own parser, as written."""
    lines = [program(line).split() for line in commands(
        block("How it is measured", 1, "performance.md").text)]
    assert len(lines) == 9 and all(words[:2] == ["python", "-m"] for words in lines)
    *written, wrong = parse_many([*lines, ["python", "-m", "benchmarks.run", "--quick",
                                           "--smoke"]])
    for words, (code, err) in zip(lines, written, strict=True):
        assert code == 0, (words, err)
    assert wrong[0] == 2


def test_the_drain_cpu_figures_are_the_tools_table() -> None:
    """The figures block of the performance page is benchmarks.drain_cpu's output: its heading
    and columns are the ones the tool prints, and its rows are the run's JSON."""
    source = (ROOT / "benchmarks" / "drain_cpu.py").read_text("utf-8")
    figures = block("Targets not met, and why", 1, "performance.md").text.splitlines()
    assert figures[0].split(" (")[0] in source, figures[0]
    for column in re.split(r"\s{2,}", figures[1].strip()):
        assert column.split()[0] in source, column
    kept = json.loads((ROOT / "benchmarks" / "results" / "drain-cpu-2026-11-26d.json").read_text())
    assert [row["system"] for row in kept["drain"]["rows"]] == [
        re.split(r"\s{2,}", line)[0] for line in figures[2:]]
    for line, row in zip(figures[2:], kept["drain"]["rows"], strict=True):
        assert [float(v) for v in line.split()[-8:]] == [v for k, v in row.items()
                                                          if k != "system"], line


def test_every_full_run_s_figures_are_kept_as_json() -> None:
    """The performance page shows the latest full run; the earlier runs' figures live in
    benchmarks/results (their prose left the README): every run file the page names is
    there, and every full run's JSON has its rows and targets."""
    page = (DOCS / "performance.md").read_text("utf-8")
    named = set(re.findall(r"(?:full|drain-cpu|memory|fleet[a-z-]*)-2026-[0-9-]+[a-z]?\.json",
                           page))
    results = ROOT / "benchmarks" / "results"
    assert {"full-2026-11-28.json", "full-2026-11-26d.json", "full-2026-11-22.json",
            "full-2026-11-26c.json"} <= named
    for name in named:
        assert (results / name).is_file(), name
    for run in results.glob("full-*.json"):
        figures = json.loads(run.read_text("utf-8"))
        assert figures["rows"] and figures["targets"], run.name


# --- preemption -----------------------------------------------------------------------------
@pytest.mark.slow
def test_the_preemption_commands_run_as_written(shell: Shell, client: blueque.Client,
                                                redis_url: str) -> None:
    """`blueque preempt --node spot-7 --grace 90s` to a listener of that node name: it stops
    taking tasks, says so in status, and (running nothing) leaves; `--withdraw` takes the
    request back. The kill line is test_the_preemption_examples_pgrep_finds_the_listener's."""
    preempt, kill, withdraw = commands(block("Preemption with notice", 1, "tutorial.md").text)
    assert kill.startswith("kill -USR1 ")
    listener = shell.start("blueque listen documents mypackage.jobs:ocr_page --node-name "
                           "spot-7 --interval 0.5")
    listener.until("listening on")
    done = shell.run(preempt)
    assert done.returncode == 0 and "node spot-7 goes away in 1m30s" in done.stdout, done
    assert listener.process.wait(30) == 0
    assert "preempted" in listener.output()
    withdrawn = shell.run(withdraw)
    assert withdrawn.returncode == 0 and "withdrawn" in withdrawn.stdout, withdrawn
    assert shell.run(withdraw).returncode == 4  # nothing left to withdraw
