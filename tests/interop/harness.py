"""Run the original blueque 1.0.1 next to this repository's Blueque, on one Redis.

``original_python()`` builds (once, then reuses) a virtualenv under ``.cache/interop-venv/``
holding blueque 1.0.1 and redis<6 from PyPI; ``Implementation`` runs ``driver.py`` with either
interpreter, as a one-shot command or as a background process the test stops by pid.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import venv
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

#: What the original's virtualenv holds. Changing it changes the cache directory's name.
ORIGINAL_REQUIREMENTS = ("blueque==1.0.1", "redis<6")
ORIGINAL_VERSION = "1.0.1"

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("driver.py")
CACHE = REPO / ".cache" / "interop-venv"


def _cache_key() -> str:
    pins = "_".join(r.replace("==", "-").replace("<", "-lt") for r in ORIGINAL_REQUIREMENTS)
    return f"{pins}_py{sys.version_info.major}.{sys.version_info.minor}"


def original_python(cache: Path = CACHE) -> Path:
    """The interpreter of a virtualenv with the original blueque 1.0.1 (built if missing).

    A ``.complete`` file written last marks a finished build, so an interrupted one is rebuilt;
    a file lock keeps two test runs from building the same directory at once."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / _cache_key()
    python = target / "bin" / "python"
    marker = target / ".complete"
    spec = "\n".join(ORIGINAL_REQUIREMENTS)
    with open(cache / f"{_cache_key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and python.exists() and marker.read_text() == spec:
            return python
        shutil.rmtree(target, ignore_errors=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(target)
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--no-input", *ORIGINAL_REQUIREMENTS],
            capture_output=True, text=True, timeout=900, env=_clean_env(), check=False,
        )
        if install.returncode != 0:
            raise RuntimeError(
                f"could not install {' '.join(ORIGINAL_REQUIREMENTS)} into {target} from PyPI "
                f"(needed by the interop tests):\n{install.stdout}\n{install.stderr}"
            )
        check = subprocess.run(
            [str(python), "-c",
             "import blueque, importlib.metadata as m; print(m.version('blueque'), "
             "blueque.__file__)"],
            capture_output=True, text=True, timeout=60, env=_clean_env(), cwd=target,
            check=True,
        )
        version, location = check.stdout.split()
        if version != ORIGINAL_VERSION or not location.startswith(str(target)):
            raise RuntimeError(f"the interop virtualenv imports blueque {version} from {location}")
        marker.write_text(spec)
        return python


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


@dataclass(frozen=True)
class Implementation:
    """One Blueque implementation: an interpreter whose ``import blueque`` finds it."""

    name: str  # "orig" or "ours", as driver.py reports it
    python: str
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def original(cls) -> Implementation:
        return cls("orig", str(original_python()), _clean_env())

    @classmethod
    def ours(cls) -> Implementation:
        return cls("ours", sys.executable, _clean_env(PYTHONPATH=str(REPO)))

    def _argv(self, url: str, command: str, args: tuple[str, ...]) -> list[str]:
        return [self.python, str(DRIVER), url, command, *args]

    def run(self, url: str, command: str, *args: str, timeout: float = 60) -> dict[str, Any]:
        """Run one driver command to completion; its JSON report."""
        done = subprocess.run(
            self._argv(url, command, args), capture_output=True, text=True, timeout=timeout,
            env=self.env, cwd=DRIVER.parent, check=False,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{self.name} driver {command} {args} exited {done.returncode}:\n"
                f"{done.stdout}\n{done.stderr}"
            )
        return self._report(done.stdout.splitlines()[-1])

    def start(self, url: str, command: str, *args: str) -> Running:
        """Start a long-running driver command (hold, runner); use as a context manager."""
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by Running.stop()
        process = subprocess.Popen(
            self._argv(url, command, args), stdout=subprocess.PIPE, stderr=stderr,
            stdin=subprocess.DEVNULL, env=self.env, cwd=DRIVER.parent,
        )
        return Running(self, process, stderr)

    def _report(self, line: str) -> dict[str, Any]:
        report: dict[str, Any] = json.loads(line)
        assert report["impl"] == self.name, f"expected {self.name}, driver imported {report}"
        return report


class Running:
    """A driver process started by a test; stopped (by pid) when the ``with`` block ends."""

    def __init__(self, impl: Implementation, process: subprocess.Popen[bytes], stderr: Any):
        self.impl = impl
        self.process = process
        self._stderr = stderr

    @property
    def pid(self) -> int:
        return self.process.pid

    def diagnostics(self) -> str:
        self._stderr.seek(0)
        text: str = self._stderr.read().decode("utf-8", "replace")
        return f"{self.impl.name} driver pid {self.pid} (exit {self.process.poll()}): {text}"

    def report(self, timeout: float = 30) -> dict[str, Any]:
        """The first JSON line the process prints, waiting for it up to ``timeout`` seconds."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no report within {timeout} s; {self.diagnostics()}")
            readable, _, _ = select.select([self.process.stdout], [], [], remaining)
            if readable:
                line = self.process.stdout.readline().decode("utf-8")
                if not line:
                    raise AssertionError(f"exited without a report; {self.diagnostics()}")
                return self.impl._report(line)

    def kill(self) -> None:
        """SIGKILL (a crash) and reap, so the pid is really gone when this returns."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, grace: float = 10) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``grace`` seconds."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()

    def __enter__(self) -> Running:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
