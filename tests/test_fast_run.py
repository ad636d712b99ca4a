"""The plain `pytest` run stays fast and collects anywhere (issue 34 point 6): the slowest
durations are printed at the end of every run, the long scenarios are deselected by marker
(CI runs them with ``-m ''``), and no test module needs the spark extra to be collected."""

from __future__ import annotations

import ast
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DESELECTED = ("slow", "ha", "interop", "spark", "browser")


def addopts() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return shlex.split(config["tool"]["pytest"]["ini_options"]["addopts"])


def test_every_run_prints_its_slowest_15_durations() -> None:
    assert "--durations=15" in addopts()


def test_the_plain_run_deselects_the_long_scenarios() -> None:
    options = addopts()
    expression = options[options.index("-m") + 1]
    assert expression.startswith("not (")
    assert set(DESELECTED) <= set(expression.removeprefix("not (").rstrip(")").split(" or "))


def imports_spark_at_module_level(path: Path) -> bool:
    """Whether a test module imports pyspark (or blueque.spark, which imports it) at its top
    level before any ``pytest.importorskip("pyspark")``."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Expr) and "importorskip('pyspark')" in ast.unparse(node):
            return False
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module == "blueque":
                names += [f"blueque.{alias.name}" for alias in node.names]
        if any(name.split(".")[0] == "pyspark" or name.startswith("blueque.spark")
               for name in names):
            return True
    return False


def test_the_check_sees_a_module_level_spark_import(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text("import pytest\nfrom blueque.spark.read import list_task_ids\n")
    assert imports_spark_at_module_level(sample)
    sample.write_text("import pytest\nfrom blueque import spark\n")
    assert imports_spark_at_module_level(sample)
    sample.write_text("import pytest\npytest.importorskip('pyspark')\nimport pyspark\n")
    assert not imports_spark_at_module_level(sample)


def test_no_test_module_needs_pyspark_to_be_collected() -> None:
    offenders = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "tests").rglob("*.py"))
                 if imports_spark_at_module_level(path)]
    assert offenders == [], "import pyspark after pytest.importorskip('pyspark'), or in the test"


@pytest.mark.slow
def test_the_suite_collects_without_pyspark() -> None:
    """The whole suite, collected with pyspark unimportable (a virtualenv without the spark
    extra): only tests/test_spark.py is skipped, nothing fails to import."""
    program = ("import sys; sys.modules['pyspark'] = None; import pytest; "
               "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', "
               "'-m', '']))")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "tests collected" in done.stdout and "error" not in done.stdout.splitlines()[-1]
