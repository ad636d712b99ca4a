"""The documentation site (mkdocs.yml, docs/): it builds with --strict (a broken link, a page
left out of the navigation, an API name mkdocstrings cannot find all fail), and its reference
pages are written from the code: every command, option and exit code is there. Every code
block of every page is run by a test (tests/test_readme.py, DOC_BLOCKS)."""

from __future__ import annotations

import argparse
import html
import re
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from blueque.cli import build_parser
from blueque.cli.base import EXIT_CODES
from blueque.policy import OPTION_TYPES
from tests.readme import DOCS, ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The site, built once with `mkdocs build --strict` (the docs extra: ./dev test has it)."""
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(target)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    yield target


def text_of(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text("utf-8")))


def test_the_site_builds_strict_with_every_page_in_its_navigation(site: Path) -> None:
    built = {str(p.relative_to(site).parent) for p in site.rglob("index.html")}
    wanted = {str(p.relative_to(DOCS).with_suffix("")).removesuffix("/index")
              .replace("index", ".") for p in DOCS.rglob("*.md")}
    assert wanted <= built | {"."}


def test_the_cli_reference_has_every_command_and_option(site: Path) -> None:
    """Written from the parsers at every build: a new option is in the next one."""
    page = text_of(site / "reference" / "cli" / "index.html")
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        assert f"blueque {name}" in page, name
        for action in command._actions:
            if action.help == argparse.SUPPRESS:
                continue  # hidden from --help: hidden here
            for option in action.option_strings:
                assert option in page, (name, option)


def test_the_exit_codes_and_task_options_are_the_codes(site: Path) -> None:
    codes = text_of(site / "reference" / "exit-codes" / "index.html")
    for line in EXIT_CODES.splitlines()[1:]:
        code = line.split()[0]
        if code.isdigit():
            assert f"\n{code}\n" in codes, code
    options = text_of(site / "reference" / "configuration" / "index.html")
    for name in OPTION_TYPES:
        assert name in options, name


def test_the_protocol_page_is_protocol_md_and_the_api_is_documented(site: Path) -> None:
    protocol = text_of(site / "reference" / "protocol" / "index.html")
    assert "blueque_pending_tasks_[queue]" in protocol and "A job's parameters" in protocol
    api = text_of(site / "reference" / "api" / "index.html")
    for name in ("blueque.client.Client", "enqueue_async", "check_result", "InvalidJob",
                 "MissingTaskWarning", "blueque.aio.client.Client"):
        assert name in api, name


def test_the_dashboard_page_shows_the_tours_pictures(site: Path) -> None:
    page = (site / "how-to" / "dashboard" / "index.html").read_text("utf-8")
    pictures = re.findall(r'src="\.\./\.\./images/dashboard/([^"]+)"', page)
    assert len(pictures) >= 8
    for name in pictures:
        assert (site / "images" / "dashboard" / name).is_file(), name


def test_every_page_the_code_and_the_specification_name_exists() -> None:
    """Error messages, docstrings and PROTOCOL.md send readers to pages of the site (the ACL
    refusal to docs/how-to/acl.md, the eviction refusal to docs/how-to/persistence.md...): each
    one named is there, and no reader is sent to a README section that moved."""
    named: dict[str, str] = {}
    sources = [*(ROOT / "blueque").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
               *(ROOT / "examples").glob("*.py"), ROOT / "PROTOCOL.md",
               ROOT / "ARCHITECTURE.md"]
    for source in sources:
        text = source.read_text("utf-8")
        for page in re.findall(r"docs/[a-z0-9/_-]+\.md", text):
            named[page] = str(source.relative_to(ROOT))
        assert not re.search(r"README[.md]*,? [\"'(]", text), source
    assert {"docs/how-to/acl.md", "docs/how-to/persistence.md",
            "docs/how-to/observability.md"} <= set(named)
    missing = {page: source for page, source in named.items() if not (ROOT / page).is_file()}
    assert missing == {}


def test_the_log_outcomes_table_is_the_listeners() -> None:
    """The observability page's table of the "outcome" field lists every outcome the listener
    logs, each at the level it is logged at."""
    from blueque.daemon.running import WARNING_OUTCOMES, LogOutcome

    page = (DOCS / "how-to" / "observability.md").read_text("utf-8")
    rows = dict(re.findall(r"^\| `([a-z]+)` \| [^|]+ \| (info|warning) \|$", page, re.MULTILINE))
    assert set(rows) == set(typing.get_args(LogOutcome))
    assert {name for name, level in rows.items() if level == "warning"} == WARNING_OUTCOMES
