"""What the package is made of: the test helpers (blueque.testing) are not part of the runtime (no
runtime module imports them, statically or when it is loaded), and the wheel built from
pyproject.toml ships every module, Lua script, template and static file, the console script and
the metadata."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

from tests.test_cli import ROOT, environment
from tests.wheels import SOURCE_FILES, copy_source

PACKAGE = ROOT / "blueque"
HELPERS = "blueque.testing"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, package: str) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in ``source`` names (function-local
    ones too), relative imports resolved against ``package``; ``from a import b`` names both a
    and a.b."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def imported_modules(path: Path) -> set[str]:
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imports_in(path.read_text("utf-8"), package)


def runtime_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not p.is_relative_to(PACKAGE / "testing"))


def is_helper(module: str) -> bool:
    return module == HELPERS or module.startswith(HELPERS + ".")


def test_the_scanner_sees_every_way_of_importing_the_helpers() -> None:
    """The check below is not vacuous: it finds absolute, relative and function-local imports
    of the helpers, and the helpers' imports of each other."""
    source = (
        "import blueque.testing\n"
        "from . import testing\n"
        "def f():\n"
        "    from .testing.topology import ClusterTopology\n"
    )
    found = imports_in(source, "blueque")
    assert {"blueque.testing", "blueque.testing.topology",
            "blueque.testing.topology.ClusterTopology"} <= found
    assert {m for m in found if is_helper(m)} >= {"blueque.testing"}
    assert imports_in("from .spark import enqueue\nimport json\n", "blueque") == {
        "blueque.spark", "blueque.spark.enqueue", "json"}
    assert not is_helper("blueque.testing_tools") and is_helper("blueque.testing.polling")
    topology = imported_modules(PACKAGE / "testing" / "topology.py")
    assert "blueque.testing.polling" in topology and "blueque.private_redis" in topology


def test_no_runtime_module_imports_the_test_helpers() -> None:
    files = runtime_files()
    assert PACKAGE / "demo.py" in files and PACKAGE / "spark" / "session.py" in files
    offenders = {
        module_name(path): sorted(m for m in imported_modules(path) if is_helper(m))
        for path in files
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_loading_every_runtime_module_loads_no_test_helpers() -> None:
    """In a fresh interpreter: import each runtime module (those whose optional third-party
    dependency is missing are listed, not imported), then look at sys.modules."""
    names = [module_name(path) for path in runtime_files()]
    program = (
        "import importlib, json, sys\n"
        "loaded, missing = [], []\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as error:\n"
        "        if (error.name or '').startswith('blueque'):\n"
        "            raise\n"
        "        missing.append(name)\n"
        "    else:\n"
        "        loaded.append(name)\n"
        "helpers = sorted(m for m in sys.modules if m == 'blueque.testing'"
        " or m.startswith('blueque.testing.'))\n"
        "print(json.dumps({'loaded': loaded, 'missing': missing, 'helpers': helpers}))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=environment(), cwd=ROOT, timeout=120, check=True)
    report = json.loads(done.stdout)
    # the demo and the local Spark session used to import the test helpers
    assert "blueque.demo" in report["loaded"] and "blueque.cli" in report["loaded"]
    assert len(report["loaded"]) + len(report["missing"]) == len(names)
    assert report["helpers"] == []


#: What a build starts from besides blueque/: the metadata, its README, the setup.py shim.
def test_the_wheel_ships_the_package_its_data_and_its_metadata(wheel: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    with zipfile.ZipFile(wheel) as built:
        names = set(built.namelist())
        info = f"blueque-{project['version']}.dist-info"
        metadata = built.read(f"{info}/METADATA").decode()
        entry_points = built.read(f"{info}/entry_points.txt").decode()
    sources = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert any(name.endswith(".lua") for name in sources)
    assert "blueque/py.typed" in sources and "blueque/testing/topology.py" in sources
    assert sorted(sources - names) == []
    assert sorted(n for n in names - sources if not n.startswith(info + "/")) == []
    assert "[console_scripts]\nblueque = blueque.cli:main" in entry_points
    assert f"Requires-Python: {project['requires-python']}\n" in metadata
    assert "License-Expression: Apache-2.0\n" in metadata
    for dependency in project["dependencies"]:
        assert f"Requires-Dist: {dependency}\n" in metadata
    for extra in project["optional-dependencies"]:
        assert f"Provides-Extra: {extra}\n" in metadata
    assert "# Blueque" in metadata  # the README is the long description


def test_setup_py_is_the_thin_shim_and_an_sdist_builds_from_it(tmp_path: Path) -> None:
    """setup.py (the layout the project was specified with) carries no metadata of its own:
    one argument-less setup() call, so pyproject.toml stays the only place the metadata is
    written; and an sdist built through it, as a PEP 517 frontend calls setuptools, holds
    the shim, the metadata and every file of the package."""
    tree = ast.parse((ROOT / "setup.py").read_text("utf-8"))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert [(call.func.id, call.args, call.keywords) for call in calls
            if isinstance(call.func, ast.Name)] == [("setup", [], [])]
    source = copy_source(tmp_path)
    program = ("import setuptools.build_meta as backend\n"
               "print(backend.build_sdist('dist'))\n")
    built = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                           cwd=source, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    name = built.stdout.strip().splitlines()[-1]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["version"]
    assert name == f"blueque-{version}.tar.gz"
    with tarfile.open(source / "dist" / name) as sdist:
        members = {m.split("/", 1)[1] for m in sdist.getnames() if "/" in m}
    sources = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert set(SOURCE_FILES) <= members
    assert sorted(sources - members) == []
