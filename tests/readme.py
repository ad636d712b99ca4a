"""The fenced blocks of README.md and of every page of the documentation site (docs/), and a
shell that runs their command lines as written, for the tests that hold every block to what
it says (tests/test_readme.py lists them all)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.daemons import KEEP_ENVIRON, OWNER, kill_session_children, owned_processes

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


@dataclass(frozen=True)
class Block:
    section: str  # the heading it is under, without its #s
    number: int  # its place among that section's blocks, from 1
    language: str  # after the opening ```, "" for none
    text: str
    line: int  # the line of its opening ```

    @property
    def key(self) -> tuple[str, int]:
        return self.section, self.number


def readme_blocks() -> list[Block]:
    """Every fenced block of README.md, in order."""
    return markdown_blocks(README)


def doc_pages() -> list[Path]:
    """Every page of the documentation site (docs/**/*.md)."""
    return sorted(DOCS.rglob("*.md"))


def doc_blocks() -> dict[tuple[str, str, int], Block]:
    """Every fenced block of every page of the site, by (page, section, number): the page's
    path under docs/."""
    return {(str(page.relative_to(DOCS)), *b.key): b
            for page in doc_pages() for b in markdown_blocks(page)}


def markdown_blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, in order, under the heading it follows."""
    lines = path.read_text("utf-8").split("\n")
    blocks: list[Block] = []
    section, counts, index = "", {}, 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        elif line.startswith("```"):
            end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
            counts[section] = counts.get(section, 0) + 1
            blocks.append(Block(section, counts[section], line[3:].strip(),
                                "\n".join(lines[index + 1:end]) + "\n", index + 1))
            index = end
        index += 1
    return blocks


def block(section: str, number: int = 1, page: str | None = None) -> Block:
    """A block of README.md, or of a page of the site (its path under docs/), by the heading
    it is under and its place there."""
    path = README if page is None else DOCS / page
    found = [b for b in markdown_blocks(path) if b.key == (section, number)]
    assert found, f"{path.relative_to(ROOT)} has no block {number} under {section!r}"
    return found[0]


def section_text(page: str, heading: str) -> str:
    """The text of a page of the site (its path under docs/) under a heading, up to the next
    heading of the same level or above (headings inside code blocks are not headings)."""
    lines = (DOCS / page).read_text("utf-8").split("\n")
    start = next(i for i, line in enumerate(lines) if line.lstrip("#").strip() == heading
                 and line.startswith("#"))
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    fenced, end = False, len(lines)
    for index in range(start + 1, len(lines)):
        line = lines[index]
        if line.startswith("```"):
            fenced = not fenced
        elif (not fenced and line.startswith("#")
              and len(line) - len(line.lstrip("#")) <= level):
            end = index
            break
    return "\n".join(lines[start + 1:end])


def commands(text: str) -> list[str]:
    """The command lines of a shell block: a line ending in a backslash goes on on the next;
    indented comment lines (notes under a command) are not commands."""
    found: list[str] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        found.append(pending + line)
        pending = ""
    return found


def program(line: str) -> str:
    """The command of a line, without its comment and its leading variable assignments."""
    words = line.split("#", 1)[0].split()
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words.pop(0)
    return " ".join(words)


@dataclass
class Started:
    """A command line started in the background (a daemon), its output in files."""

    line: str
    process: subprocess.Popen[bytes]
    out: Path
    err: Path

    def output(self) -> str:
        return (self.out.read_text(errors="replace") + self.err.read_text(errors="replace"))

    def until(self, wanted: str | Callable[[str], bool], timeout: float = 60) -> str:
        ready = wanted if callable(wanted) else (lambda text: wanted in text)
        deadline = time.monotonic() + timeout
        while not ready(self.output()):
            assert self.process.poll() is None, (
                f"{self.line!r} exited {self.process.returncode}: {self.output()}")
            assert time.monotonic() < deadline, f"{self.line!r} not ready: {self.output()}"
            time.sleep(0.05)
        return self.output()

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


class Shell:
    """bash, as a reader of the README types its lines: ``blueque`` is the checkout's
    bin/blueque (first on PATH), ``python`` this interpreter, $BLUEQUE_URL the test's Redis.
    ``replace`` maps text of the README's lines to what this machine has instead (a free port
    for 8080, a file of the test's for /etc/blueque/...): each test says which, and why."""

    def __init__(self, directory: Path, cwd: Path, url: str,
                 replace: Mapping[str, str] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.directory, self.cwd = directory, cwd
        self.replace = dict(replace or {})
        bins = directory / "shell-bin"
        bins.mkdir(exist_ok=True)
        python = bins / "python"
        if not python.exists():
            python.symlink_to(sys.executable)
        path = os.pathsep.join((str(ROOT / "bin"), str(bins), os.environ["PATH"]))
        self.env = {**os.environ, "BLUEQUE_URL": url, "PATH": path,
                    "XDG_STATE_HOME": str(directory / "state"), OWNER: str(os.getpid()),
                    **KEEP_ENVIRON, **(env or {})}
        self.env.pop("PYTHONPATH", None)  # bin/blueque finds its checkout by itself
        self.started: list[Started] = []

    def line(self, line: str) -> str:
        for old, new in self.replace.items():
            line = line.replace(old, new)
        return line

    def run(self, line: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-o", "pipefail", "-c", self.line(line)], cwd=self.cwd,
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self, line: str) -> Started:
        """The line as a process of its own (exec: the signals it is sent reach the command,
        not bash); a trailing ``&`` is the background it runs in anyway."""
        line = self.line(line).split(" #", 1)[0].rstrip().removesuffix("&").rstrip()
        *before, line = line.rsplit("; ", 1)  # "export X=...; command": the last one runs
        assignments = re.match(r"^((?:[A-Z_]+=\S*\s+)*)(.*)$", line)
        assert assignments is not None
        number = len(self.started)
        out, err = self.directory / f"started{number}.out", self.directory / f"started{number}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            process = subprocess.Popen(
                ["bash", "-c", "".join(f"{b}; " for b in before)
                 + f"{assignments[1]}exec {assignments[2]}"], cwd=self.cwd,
                env=self.env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
        started = Started(line, process, out, err)
        self.started.append(started)
        return started

    def close(self) -> None:
        """Stop what is still running, by pid, and the task processes the listeners started
        (in sessions of their own: a listener's death leaves them running)."""
        leftovers: list[int] = []
        for started in self.started:
            with contextlib.suppress(psutil.NoSuchProcess):
                leftovers += [child.pid for child in
                              psutil.Process(started.process.pid).children(recursive=True)]
            if started.process.poll() is None:
                started.process.kill()
                started.process.wait()
        kill_session_children(leftovers)
        kill_session_children([process.pid for process in owned_processes()])
