"""PROTOCOL.md is the twin of the code: its key table, script names and field table must agree
with blueque/keys.py, blueque/statuses.py and blueque/lua/*.lua."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from blueque import keys as k
from blueque.fields import LISTENER_FIELDS, TASK_FIELDS
from blueque.policy import OPTION_TYPES
from blueque.statuses import STATUSES
from blueque.store import load_script

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "PROTOCOL.md"
LUA = ROOT / "blueque" / "lua"

PLACEHOLDERS = {"queue": "[queue]", "listener_id": "[listener id]", "task_id": "[task id]",
                "minute": "[minute]", "hour": "[hour]", "node": "[node identity]",
                "node_name": "[node name]", "concurrency_key": "[key]"}


def _text() -> str:
    return PROTOCOL.read_text(encoding="utf-8")


def _table_after(heading: str) -> list[list[str]]:
    """Rows (cells stripped) of the first markdown table after the heading line."""
    lines = _text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and heading in line)
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) > 2, f"no table under {heading!r} in PROTOCOL.md"
    return rows[2:]  # skip the header and the |---| line


def documented_keys() -> set[str]:
    keys = set()
    for row in _table_after("Keys"):
        match = re.fullmatch(r"`([^`]+)`", row[0])
        assert match, f"first cell of a key table row must be one key in backticks: {row[0]!r}"
        keys.add(match.group(1))
    return keys


def built_keys() -> set[str]:
    layout = k.Keys()
    built = set()
    for name in k.KEY_BUILDERS:
        method = getattr(layout, name)
        params = inspect.signature(method).parameters
        built.add(method(*(PLACEHOLDERS[param] for param in params)))
    return built


def test_every_key_builder_is_in_the_key_table() -> None:
    missing = built_keys() - documented_keys()
    assert not missing, f"keys built by blueque/keys.py but absent from PROTOCOL.md: {missing}"


def test_every_documented_key_is_built_by_keys_py() -> None:
    extra = documented_keys() - built_keys()
    assert not extra, f"keys in PROTOCOL.md that blueque/keys.py does not build: {extra}"


def test_key_builders_list_every_public_builder() -> None:
    """KEY_BUILDERS is what the table is checked against, so it must not miss a method."""
    public = {
        name for name, member in inspect.getmembers(k.Keys, inspect.isfunction)
        if not name.startswith("_")
        and name not in ("finished", "new_task_id", "task_id_for", "keyed_names")
    }
    assert public == set(k.KEY_BUILDERS)


def test_the_default_layout_is_blueque_1_0_1s() -> None:
    layout = k.Keys()
    assert layout.pending("q") == "blueque_pending_tasks_q"
    assert layout.reserved("q", "h_1") == "blueque_reserved_tasks_q_h_1"
    assert layout.task("t") == "blueque_task_t"
    assert layout.started("q") == "blueque_started_tasks_q"
    assert layout.complete("q") == "blueque_complete_tasks_q"
    assert layout.failed("q") == "blueque_failed_tasks_q"
    assert layout.scheduled("q") == "blueque_scheduled_tasks_q"
    assert layout.listeners("q") == "blueque_listeners_q"
    assert layout.queues() == "blueque_queues"


SCRIPTS = sorted(LUA.glob("*.lua"))


def _header(path: Path) -> str:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_script_is_named_in_protocol_md(script: Path) -> None:
    assert f"`{script.name}`" in _text(), f"PROTOCOL.md does not name {script.name}"


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_script_has_a_header_listing_keys_argv_and_returns(script: Path) -> None:
    header = _header(script)
    assert "KEYS[1]" in header, f"{script.name}: header does not list KEYS"
    assert "ARGV[1]" in header, f"{script.name}: header does not list ARGV"
    assert "Returns" in header, f"{script.name}: header does not say what it returns"


def test_scripts_never_enumerate_keys() -> None:
    """KEYS/SCAN inside a script break Redis Cluster; every key comes in through KEYS[]."""
    for script in SCRIPTS:
        body = script.read_text(encoding="utf-8")
        for command in ("'KEYS'", "'SCAN'", '"KEYS"', '"SCAN"'):
            assert command not in body, f"{script.name} calls {command}"


# --- the fields the scripts write ----------------------------------------------------------
_CALL = re.compile(r"redis\.call\(\s*'(HSET|HINCRBY)'\s*,")
_STRING = re.compile(r"^'([^']*)'$")


def _call_args(body: str, start: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose '(' precedes ``start``."""
    depth, args, current, quote = 1, [], "", ""
    for char in body[start:]:
        if quote or char in "'\"":  # a string's brackets and commas are its own
            quote = "" if char == quote else quote or char
            current += char
            continue
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
            if depth == 0:
                args.append(current.strip())
                return args
        if char == "," and depth == 1:
            args.append(current.strip())
            current = ""
        else:
            current += char
    raise AssertionError("unbalanced call")


def _table_literals(body: str, name: str) -> list[str]:
    """Items of ``local name = {...}`` then of every ``name[#name + 1] = item``, in order."""
    items: list[str] = []
    constructor = re.search(rf"local {name}\s*=\s*{{", body)
    if constructor:
        items += _call_args(body, constructor.end())
    items += re.findall(rf"{name}\[#{name} \+ 1\]\s*=\s*([^\n]+)", body)
    return [item.strip() for item in items]


def hset_fields_by_key(body: str) -> dict[str, set[str]]:
    """Fields written by HSET/HINCRBY, per key argument as written (``KEYS[2]``, ``key``)."""
    fields: dict[str, set[str]] = {}
    for match in _CALL.finditer(body):
        key, *args = _call_args(body, match.end())
        if match.group(1) == "HINCRBY":
            args = args[:1]
        elif len(args) == 1 and args[0].startswith("unpack("):
            args = _table_literals(body, args[0][len("unpack("):-1])
        for name in args[::2]:
            literal = _STRING.match(name)
            if literal:
                fields.setdefault(key, set()).add(literal.group(1))
    return fields


def hset_fields(body: str) -> set[str]:
    return set().union(*hset_fields_by_key(body).values())


def checkpoint_keys(script: Path) -> set[str]:
    """The KEYS[n] a script's header names as blueque_checkpoint_[id] (its own hash)."""
    return {f"KEYS[{n}]" for n in re.findall(r"KEYS\[(\d+)\][^\n]*\bblueque_checkpoint_",
                                             _header(script))}


def test_field_parser_sees_fields_built_in_a_table() -> None:
    body = (
        "local fields = {'status', 'x', 'queue', ARGV[1]}\n"
        "fields[#fields + 1] = 'eta'\nfields[#fields + 1] = ARGV[2]\n"
        "redis.call('HSET', KEYS[1], unpack(fields))\n"
        "redis.call('HSET', KEYS[1], 'a', ARGV[3],\n  'b', 'c')\n"
        "redis.call('HINCRBY', KEYS[1], 'n', 1)\n"
    )
    assert hset_fields(body) == {"status", "queue", "eta", "a", "b", "n"}


def documented_fields(heading: str = "The task hash") -> set[str]:
    fields = set()
    for row in _table_after(heading):
        match = re.fullmatch(r"`([^`]+)`", row[0])
        assert match, f"first cell of a field table row must be one field in backticks: {row[0]!r}"
        fields.add(match.group(1))
    return fields


def test_every_field_the_scripts_write_is_in_the_field_table() -> None:
    """Fields written to a task hash are in section 3's table, those written to a checkpoint
    hash in the checkpoint's table."""
    written: dict[str, set[str]] = {}
    checkpoint: dict[str, set[str]] = {}
    for script in SCRIPTS:
        ours = checkpoint_keys(script)
        # with the libraries it uses (lua/lib: lib/stamp writes stamp.lua's and take.lua's)
        for key, names in hset_fields_by_key(load_script(script.stem)).items():
            for name in names:
                (checkpoint if key in ours else written).setdefault(name, set()).add(
                    script.name)
    assert {"status", "attempts", "updated"} <= set(written)  # the parser works here
    assert {"state", "attempt"} <= set(checkpoint)
    missing = {name: scripts for name, scripts in written.items()
               if name not in documented_fields()}
    assert not missing, f"fields written by scripts but absent from PROTOCOL.md: {missing}"
    missing = {name: scripts for name, scripts in checkpoint.items()
               if name not in documented_fields("The checkpoint hash")}
    assert not missing, f"checkpoint fields absent from PROTOCOL.md: {missing}"


#: PROTOCOL.md's type column, in the words of blueque/fields.py.
DOCUMENTED_KINDS = {"string": "text", "status string": "text", "listener id": "text",
                    "int": "int", "int ≥ 0": "int", "int ≥ 1": "int", "float, Unix s": "time",
                    "float, s": "number", "float 0..1": "number", "0 or 1": "int",
                    "JSON list": "json", "JSON object": "json"}


@pytest.mark.parametrize(("heading", "kinds"), [("The task hash", TASK_FIELDS),
                                                ("The listener info hash", LISTENER_FIELDS)])
def test_field_types_are_the_protocols(heading: str, kinds: dict[str, str]) -> None:
    """blueque/fields.py, which --json reads to type each value, knows every field of the
    table and gives it the table's type: a field added to PROTOCOL.md must be added there."""
    documented = {}
    for row in _table_after(heading):
        name = row[0].strip("`")
        assert row[1] in DOCUMENTED_KINDS, f"{name}: unknown type {row[1]!r} in PROTOCOL.md"
        documented[name] = DOCUMENTED_KINDS[row[1]]
    assert kinds == documented


def test_option_fields_are_documented() -> None:
    assert set(OPTION_TYPES) <= documented_fields()


def test_every_status_is_documented() -> None:
    text = _text()
    for status in STATUSES:
        assert f"`{status}`" in text
