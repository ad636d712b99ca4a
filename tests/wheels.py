"""The package built as an install gets it: a wheel pip builds from a copy of the sources,
without network (tests/test_package_layout.py, and conftest's session-wide ``wheel``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "blueque"
#: The files of the tree besides blueque/ that a build reads.
SOURCE_FILES = ("pyproject.toml", "README.md", "setup.py")


def copy_source(directory: Path) -> Path:
    """A copy of SOURCE_FILES and blueque/ (no __pycache__) in ``directory/source``."""
    source = directory / "source"
    shutil.copytree(PACKAGE, source / "blueque",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in SOURCE_FILES:
        shutil.copy(ROOT / name, source / name)
    return source


def build_wheel(directory: Path) -> zipfile.ZipFile:
    """The wheel pip builds from a copy of SOURCE_FILES and blueque/ (so nothing
    else of the tree is needed, and no build directory lands in it), without network: no
    build isolation, the installed setuptools (the test extra's)."""
    source = copy_source(directory)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-index",
         "--no-build-isolation", "--disable-pip-version-check", "-q",
         "-w", str(directory / "dist")],
        capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (directory / "dist").glob("blueque-*.whl")
    return zipfile.ZipFile(wheel)
