"""An MkDocs hook that writes the reference pages from the code itself, at every build:

- ``<!-- blueque:cli -->``: every ``blueque`` command, from its argparse parser (its help,
  usage and options, as ``blueque COMMAND --help`` prints them);
- ``<!-- blueque:exit-codes -->``: the exit codes (``blueque.cli.base``);
- ``<!-- blueque:task-options -->``: the task options, their types and defaults
  (``blueque.policy``);
- ``<!-- blueque:include FILE -->``: a file of the repository's top level (PROTOCOL.md, the
  specification, stays there and is shown in the site as it is).

So the reference cannot drift from the code: a new option, command or exit code is in the
next build. Named in mkdocs.yml (``hooks:``)."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- blueque:([a-z-]+)(?: ([^ ]+))? -->")


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(lambda found: WRITERS[found[1]](found[2]), markdown)


def cli_reference(_: str | None = None) -> str:
    from blueque.cli import build_parser

    parser = build_parser()
    commands = next(action for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction))
    parts = ["## blueque", "", _usage(parser)]
    for name, command in commands.choices.items():
        parts += [f"## blueque {name}", "", command.description or "", "", _usage(command)]
    return "\n".join(parts)


def _usage(parser: argparse.ArgumentParser) -> str:
    """What ``--help`` prints, less the epilog (the exit codes have a page of their own)."""
    epilog, parser.epilog = parser.epilog, None
    try:
        text = parser.format_help().replace("\t", " ")
    finally:
        parser.epilog = epilog
    return "```text\n" + text.rstrip() + "\n```\n"


def exit_codes(_: str | None = None) -> str:
    from blueque.cli.base import EXIT_CODES

    rows = ["| code | meaning |", "| --- | --- |"]
    for line in EXIT_CODES.splitlines()[1:]:
        code, _, meaning = line.strip().partition("  ")
        if code.isdigit():
            rows.append(f"| `{code}` | {meaning.strip()} |")
        else:  # a line that goes on
            rows[-1] = rows[-1][:-2] + " " + line.strip() + " |"
    return "\n".join(rows)


def task_options(_: str | None = None) -> str:
    from blueque.policy import FLAGS, OPTION_TYPES, Policy

    defaults = {option.name: option.default for option in fields(Policy)}
    rows = ["| option | type | default |", "| --- | --- | --- |"]
    for name, kind in OPTION_TYPES.items():
        default = defaults.get(name, "the client's, 1 MiB")
        kind_text = ("0 or 1" if name in FLAGS else
                     "seconds (a number, or 90, 15m, 4h, 7d)" if kind is float else "whole number")
        rows.append(f"| `{name}` | {kind_text} | `{default}` |")
    return "\n".join(rows)


def include(name: str | None) -> str:
    if not name or "/" in name or not (ROOT / name).is_file():
        raise ValueError(f"blueque:include names no file of the repository's top level: {name}")
    text = (ROOT / name).read_text("utf-8")
    return text.split("\n", 1)[1] if text.startswith("# ") else text  # the page has its title


WRITERS = {"cli": cli_reference, "exit-codes": exit_codes, "task-options": task_options,
           "include": include}
