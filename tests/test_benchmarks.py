"""The benchmark runs end to end in its smallest mode and prints every row.

Speed is never asserted here (figures from a smoke run mean nothing): only that every scenario
ran in the interpreter of the system it measures and produced its figures, and that the table
and the JSON carry every row and every target.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.run import PROFILES, TARGETS, build_rows

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first run builds the peers' virtualenvs from PyPI
def test_smoke_run_prints_every_row(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--smoke", "--quiet", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=850,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    expected = build_rows(PROFILES["smoke"])
    rows = {row["key"]: row for row in report["rows"]}
    assert list(rows) == [row.key for row in expected]
    missing = {key: row.get("note") for key, row in rows.items()
               if "median" not in row and key != "recovery_default.blueque"}
    assert missing == {}, missing
    assert "skipped" in rows["recovery_default.blueque"]["note"]
    # original and RQ ran in their own virtualenvs, not in Blueque's
    assert report["environment"]["original_env"]["blueque"] == "1.0.1"
    assert report["environment"]["rq_env"]["rq"] != "-"
    table = result.stdout
    for row in expected:
        assert row.label in table and row.system in table
    for scenario in {row.scenario for row in expected}:
        assert scenario in table
    assert [t["text"] for t in report["targets"]] == [t.text for t in TARGETS]
    for target in TARGETS:
        assert target.text in table


@pytest.mark.slow  # a benchmark's smoke run: real listeners, seconds (CI runs it)
@pytest.mark.timeout(300)
def test_commands_per_task_prints_every_command_of_a_drained_task_with_its_reason() -> None:
    from benchmarks.commands_per_task import PER_TASK, WHY

    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.commands_per_task", "--n", "20", "--no-original"],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    for command in PER_TASK:
        row = [line for line in lines
               if line.startswith("blueque ") and line[10:].strip().startswith(command + " ")]
        assert row, f"no row for {command}:\n{result.stdout}"
        per_task = float(row[0][10:].strip()[len(command):].split()[0])
        assert per_task >= 1.0, row  # every task sends it at least once
        assert WHY[("blueque", command)] in row[0]
    assert "not explained" not in result.stdout  # every command measured has its reason
    totals = next(line for line in lines if line.startswith("blueque ") and
                  len(line.split()) == 5)
    sent, everything, commandstats, trips = map(float, totals.split()[1:])
    assert 0 < sent <= everything and trips <= sent and commandstats > 0


@pytest.mark.timeout(300)
def test_profile_enqueue_prints_the_client_and_the_redis_side_of_an_enqueue() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.profile_enqueue", "--n", "200"],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "Queue.enqueue, one task per call:" in out and "blueque" in out
    redis_side = out.split("Queue.enqueue, Redis' side")[1].splitlines()[1:]
    commands = {line.split()[0]: float(line.split()[1]) for line in redis_side if line.strip()}
    # one script call per enqueue, and the commands it runs: no ZINCRBY of a listed queue
    assert commands["EVALSHA"] == 1.0 and commands["HSET"] == 1.0 and commands["LPUSH"] == 1.0
    assert "ZINCRBY" not in commands and "ZADD" not in commands


def test_the_spark_pipeline_figures_give_each_stage_its_share_of_the_total() -> None:
    from benchmarks.spark_pipeline import STAGES, figures

    seconds = {"session": 5.0, "listeners": 1.0, "enqueue": 10.0, "drain": 30.0, "read": 4.0}
    assert list(seconds) == list(STAGES)
    out = figures(seconds, 2000)
    assert out["total_s"] == 50.0
    assert out["enqueue_share"] == 20.0 and out["drain_share"] == 60.0
    assert sum(out[f"{stage}_share"] for stage in STAGES) == 100.0
    assert out["rate"] == 2000 / 40.0  # from the start of the enqueue to the last task done


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fleet_smoke_prints_each_fleet_and_counts_round_trips_alike(tmp_path: Path) -> None:
    """benchmarks.fleet in its smallest mode: real and simulated fleets each measured, the
    simulated workers renewed and swept (a sweep's round trips the same at every size:
    counts, not times), and the views' section run or said skipped."""
    from benchmarks.fleet import PROFILES, VIEWS_MODULE

    out = tmp_path / "fleet.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.fleet", "--smoke", "--json",
                             str(out)], cwd=REPO, capture_output=True, text=True, timeout=580)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    smoke = PROFILES["smoke"]
    rows = report["rows"]
    assert [(row["kind"], row["listeners"]) for row in rows] == [
        *(("real", n) for n in smoke.real), *(("simulated", n) for n in smoke.simulated),
        ("mixed", max(smoke.simulated))]  # beside 1.0.1 listeners: a page of the set more
    assert all(row["cost"]["commands"] > 0 and row["cost"]["usec"] > 0 for row in rows)
    simulated = [row for row in rows if row["kind"] == "simulated"]
    assert len({row["trips_per_sweep"] for row in simulated}) == 1
    assert rows[-1]["trips_per_sweep"] == simulated[0]["trips_per_sweep"] + 1  # the page
    assert {row["trips_per_renewal"] for row in simulated} == {1.0}
    assert all(row["cadence"] is not None for row in simulated)
    assert report["views"] or VIEWS_MODULE in report["views_note"]
    for line in report["targets"]:
        assert line in result.stdout


@pytest.mark.slow  # a benchmark's smoke run: real listeners, seconds (CI runs it)
@pytest.mark.timeout(300)
def test_fleet_views_prints_each_view_of_a_fleet_it_filled() -> None:
    """python -m benchmarks.fleet_views (issue 29 item 3) in its smallest mode: every view
    timed, the status round trips and the metrics page's size said."""
    from benchmarks.fleet_views import TARGET_MS

    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.fleet_views", "--smoke"],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert f"40 listeners over 5 queues (target: each view under {TARGET_MS:.0f} ms)" in out
    for view in ("blueque status ", "blueque status --json", "dashboard overview (/)",
                 "dashboard nodes (/nodes)", "dashboard nodes, last page (1)", "/metrics "):
        row = next(line for line in out.splitlines() if line.startswith(view))
        assert len(row.split()) >= 5 and float(row.split()[-4]) > 0, row  # its median
    assert "Redis round trips" in out and "series" in out
