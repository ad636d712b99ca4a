"""Cron entries: the command-line form, TOML and JSON files, due ticks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blueque.cron import CronEntry, load_file, parse_spec
from blueque.errors import ConfigurationError


def test_command_line_form_keeps_colons_in_parameters() -> None:
    entry = parse_spec('report=0 3 * * *:reports:{"kind": "daily", "at": "03:00"}')
    assert (entry.name, entry.cron, entry.queue) == ("report", "0 3 * * *", "reports")
    assert json.loads(entry.parameters) == {"kind": "daily", "at": "03:00"}
    assert parse_spec("beat=* * * * * */5:q").parameters == "{}"
    assert parse_spec("beat=* * * * *:q", "Europe/Paris").timezone == "Europe/Paris"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-equals", "NAME=CRON:QUEUE"),
        ("name=* * * * *", "NAME=CRON:QUEUE"),
        ("bad name=* * * * *:q", "letters, digits"),
        ("n=61 * * * *:q", "not a cron expression"),
        ("n=* * * * *:", "give the queue"),
    ],
)
def test_bad_command_line_entries_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_spec(spec)


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "cron.toml"
    path.write_text(
        '[[cron]]\nname = "nightly"\ncron = "0 3 * * *"\nqueue = "reports"\n'
        'parameters = { kind = "nightly" }\ntimezone = "Europe/Paris"\n'
        "options = { max_attempts = 3, time_limit = 7200 }\ncatch_up = 1\n"
        '[[cron]]\nname = "beat"\ncron = "*/5 * * * *"\nqueue = "q"\nparameters = "raw"\n'
    )
    nightly, beat = load_file(path)
    assert json.loads(nightly.parameters) == {"kind": "nightly"}
    assert nightly.options == {"max_attempts": 3, "time_limit": 7200}
    assert (nightly.timezone, nightly.catch_up) == ("Europe/Paris", 1)
    assert (beat.parameters, beat.catch_up) == ("raw", 10)


def test_json_file_as_object_or_list(tmp_path: Path) -> None:
    entry = {"name": "beat", "cron": "* * * * *", "queue": "q"}
    for name, data in (("a.json", {"cron": [entry]}), ("b.json", [entry])):
        (tmp_path / name).write_text(json.dumps(data))
        assert load_file(tmp_path / name) == [CronEntry("beat", "* * * * *", "q")]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("x.json", "{not json", "does not parse"),
        ("x.yaml", "", "use a .toml or .json"),
        ("x.json", '[{"name": "a", "cron": "* * * * *"}]', "missing queue"),
        ("x.json", '[{"name": "a", "cron": "* * * * *", "queue": "q", "when": 1}]',
         "unknown field"),
        ("x.json", '[{"name": "a", "cron": "* * * * *", "queue": "q", '
                   '"options": {"retries": 2}}]', "unknown task option"),
        ("x.json", '[{"name": "a", "cron": "* * * * *", "queue": "q", '
                   '"timezone": "Mars/Olympus"}]', "unknown time zone"),
        ("x.json", '{"cron": 3}', "expected a list"),
    ],
)
def test_bad_files_say_what_is_wrong(tmp_path: Path, name: str, text: str,
                                     message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigurationError, match=message):
        load_file(tmp_path / name)


def test_missing_file() -> None:
    with pytest.raises(ConfigurationError, match="cannot read cron file"):
        load_file("/nonexistent/cron.toml")


def test_due_ticks_are_after_the_last_and_up_to_now_inclusive() -> None:
    entry = CronEntry("five", "*/5 * * * *", "q")
    assert entry.due_ticks(900, 1200.0) == ([1200], False)
    assert entry.due_ticks(900, 1199.9) == ([], False)
    assert entry.due_ticks(0, 1200.0) == ([300, 600, 900, 1200], False)
    capped = CronEntry("five", "*/5 * * * *", "q", catch_up=2)
    assert capped.due_ticks(0, 1200.0) == ([900, 1200], True)
    assert entry.next_tick(1200.0) == 1500
