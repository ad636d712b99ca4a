"""ARCHITECTURE.md's layers are the package's: every module imports only from its own layer or
the ones under it, and every module is in a layer (issue 14: one rule in one place, imports
that flow one way)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "blueque"


def layers() -> dict[str, int]:
    """Module -> its layer (0 = the bottom), from the table under "## Layers" (top first)."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith(("| layer", "| ---"))]
    found: dict[str, int] = {}
    for height, row in enumerate(reversed(rows)):
        for module in re.findall(r"`([a-z_]+)`", row.split("|")[2]):
            assert module not in found, f"{module} is in two layers"
            found[module] = height
    return found


def top(dotted: str) -> str:
    """blueque.store.core -> store; blueque -> blueque (the package itself)."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "blueque"


def imported(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "blueque":
                modules |= {alias.name for alias in node.names}
            elif node.module.startswith("blueque."):
                modules.add(top(node.module))
        elif isinstance(node, ast.Import):
            modules |= {top(alias.name) for alias in node.names
                        if alias.name.split(".")[0] == "blueque"}
    return modules


def test_every_module_is_in_a_layer() -> None:
    known = layers()
    modules = {path.stem if path.parent == PACKAGE else path.relative_to(PACKAGE).parts[0]
               for path in PACKAGE.rglob("*.py")}
    modules = {"blueque" if module == "__init__" else module for module in modules}
    assert modules - set(known) == set(), "modules ARCHITECTURE.md does not place"
    assert set(known) - modules == set(), "ARCHITECTURE.md names modules that do not exist"


def test_imports_flow_one_way() -> None:
    known = layers()
    upward = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        me = "blueque" if relative.parts == ("__init__.py",) else (
            relative.parts[0].removesuffix(".py"))
        for other in imported(path) & set(known):
            if known[other] > known[me]:
                upward.append(f"{relative} ({me}) imports {other}")
    assert upward == [], "imports that flow upwards"


def inner_layers(section: str = "The listener daemon, in parts") -> dict[str, int]:
    """Module of a package's wing (blueque/daemon/, blueque/task_process/) -> its inner layer,
    from the table under its ARCHITECTURE.md ``section`` (top first)."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    part = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in part.splitlines()
            if line.startswith("| ") and not line.startswith(("| inner layer", "| ---"))]
    return {module: height for height, row in enumerate(reversed(rows))
            for module in re.findall(r"`([a-z_]+)`", row.split("|")[2])}


def daemon_layers() -> dict[str, int]:
    return inner_layers("The listener daemon, in parts")


def upward_inside(package: str, known: dict[str, int]) -> list[str]:
    """Imports between modules of ``blueque/<package>/`` that flow upwards."""
    modules = {path.stem for path in (PACKAGE / package).glob("*.py")} - {"__init__"}
    assert modules == set(known), f"blueque/{package}/ and ARCHITECTURE.md's table differ"
    upward = []
    for module in modules:
        tree = ast.parse((PACKAGE / package / f"{module}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    f"blueque.{package}."):
                names = [(node.module or "").split(".")[2]]
            elif isinstance(node, ast.ImportFrom) and node.module == f"blueque.{package}":
                names = [alias.name for alias in node.names]
            for other in names:
                if known[other] > known[module]:
                    upward.append(f"{package}/{module}.py imports {package}/{other}.py")
    return upward


def test_the_daemon_package_is_layered_inside() -> None:
    """Inside blueque/daemon/ too: every module is in an inner layer, and imports flow down."""
    known = daemon_layers()
    assert upward_inside("daemon", known) == [], "imports that flow upwards in the daemon"
    assert known["loop"] > known["supervisor"] > known["recorder"]  # not vacuous


def test_the_task_process_package_is_layered_inside() -> None:
    """Issue 34 point 4: the task process has its wing (blueque/task_process/), layered inside
    as the daemon's is, and it imports nothing of the daemon (the daemon imports it)."""
    known = inner_layers("The task process, in parts")
    assert upward_inside("task_process", known) == [], "imports that flow upwards"
    assert known["forkserver"] > known["warm"] > known["child"] > known["calling"]
    daemon = [f"task_process/{path.name}" for path in (PACKAGE / "task_process").glob("*.py")
              if "daemon" in imported(path)]
    assert daemon == []
    assert "task_process" in imported(PACKAGE / "daemon" / "forking.py")  # not vacuous


def test_the_check_sees_imports() -> None:
    """Not vacuous: the daemon is found importing the store, the CLI the daemon."""
    assert "store" in imported(PACKAGE / "daemon" / "step.py")
    assert "daemon" in imported(PACKAGE / "cli" / "listen.py")
    assert layers()["cli"] > layers()["daemon"] > layers()["store"] > layers()["keys"]



def test_no_module_or_class_outgrows_a_reading() -> None:
    """Issue 23's bounds: no module of the package over 400 lines, no class over 250 (a
    module that grows past them is split along its seams, as the daemon package was)."""
    long_modules, long_classes = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = str(path.relative_to(PACKAGE))
        if len(text.splitlines()) > 400:
            long_modules.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > 250:
                    long_classes.append(f"{name} {node.name}: {length} lines")
    assert long_modules == [] and long_classes == []



#: Where the package may call os.kill or os.killpg itself: the one place that signals
#: (blueque.process: signal_pid, signal_group, and its own children), a failpoint killing its
#: own process, and the signal-0 probe of whether a group still has members.
SIGNALLERS = ("process.py:", "failpoints.py:", "leftovers.py:_group_alive")


def signalling_functions() -> set[str]:
    """``module.py:function`` of every function of the package that calls os.kill/killpg."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(function, ast.FunctionDef) and any(
                    isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.kill",
                                                                              "os.killpg")
                    for node in ast.walk(function)):
                found.add(f"{name}:{function.name}")
    return found


def test_processes_are_signalled_through_blueque_process() -> None:
    """``os.kill`` + suppress(ProcessLookupError) was written inline four times and
    signal_group copied into the exclusive guard (issue 34 point 5): a process or a group is
    signalled with blueque.process.signal_pid or signal_group."""
    found = signalling_functions()
    assert {"process.py:signal_pid", "process.py:signal_group"} <= found  # not vacuous
    assert sorted(f for f in found if not f.startswith(SIGNALLERS)) == []


def written_from_outside(tree: ast.AST) -> list[str]:
    """Assignments to a part's attribute through another object (``self.part.x = ...``,
    ``self.part.x[k] = ...``, ``part.x = ...``), a Running record's fields aside (its thread
    contract: blueque.daemon.running)."""
    found = []
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
        for target in targets:
            for one in target.elts if isinstance(target, ast.Tuple) else [target]:
                while isinstance(one, ast.Subscript):
                    one = one.value
                if not isinstance(one, ast.Attribute):
                    continue
                owner = one.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls", "running"):
                    continue
                found.append(f"{node.lineno}: {ast.unparse(one)}")
    return found


def test_no_part_of_the_daemon_is_written_from_outside() -> None:
    """Issue 34 point 1: the loop wrote into its parts after building them (``ahead.queues``,
    ``supervisor.owner``, ``membership.info[...]``, ``preemption.heard``); each part has the
    verb instead (Ahead.take_from, Supervisor.registered, Membership.note,
    NodePreemption.hear)."""
    assert written_from_outside(ast.parse("self.a.b = 1\nx.y[2] = 3\nself.c = 4")) == [
        "1: self.a.b", "2: x.y"]  # not vacuous
    found = [f"{path.relative_to(PACKAGE)}:{line}"
             for path in sorted([*(PACKAGE / "daemon").glob("*.py"), PACKAGE / "preemption.py"])
             for line in written_from_outside(ast.parse(path.read_text(encoding="utf-8")))]
    assert found == []


def supervisor_parts() -> set[str]:
    """The attributes a Supervisor makes in its __init__, its runs (``children``, a dict the
    loop, the guard and the resources read) aside."""
    tree = ast.parse((PACKAGE / "daemon" / "supervisor.py").read_text(encoding="utf-8"))
    init = next(node for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    return {target.attr for node in ast.walk(init) if isinstance(node, ast.Assign | ast.AnnAssign)
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Attribute)} - {"children"}


def test_nothing_reaches_through_the_supervisor() -> None:
    """Issue 34 point 1: no ``supervisor.<part>.<anything>`` in the package: the Supervisor
    has the verbs its callers need (give_back, make_spare, seen...), or hands the part."""
    parts = supervisor_parts()
    assert {"stopper", "recorder", "ahead", "starter", "leftovers"} <= parts  # not vacuous
    chained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr in parts and isinstance(node.value.value,
                                                                ast.Attribute | ast.Name)
                    and ast.unparse(node.value.value).split(".")[-1] == "supervisor"):
                chained.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: "
                               f"{ast.unparse(node)}")
    assert chained == []


def test_the_daemon_composes_its_parts() -> None:
    """Issue 34 point 2: ``ListenerDaemon(ListenerStep)`` split one object across two files; the
    loop has a step (``ListenerDaemon.step``), and no class of blueque/daemon/ inherits from a
    class of the package."""
    ours = {node.name for path in PACKAGE.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ClassDef)}
    assert {"ListenerDaemon", "ListenerStep", "Supervisor"} <= ours  # not vacuous
    inherited = [f"{path.name}: {node.name}({ast.unparse(base)})"
                 for path in sorted((PACKAGE / "daemon").glob("*.py"))
                 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.ClassDef) for base in node.bases
                 if ast.unparse(base).split(".")[-1] in ours]
    assert inherited == []


def test_a_starting_run_is_made_by_its_constructor() -> None:
    """Issue 34 point 3: a starting run was built positionally with placeholders, twice; the
    daemon makes one with ``Running.starting``, and Running's docstring says which fields the
    exclusive guard's thread may write."""
    from blueque.daemon.running import Running

    made = [f"{path.name}:{node.lineno}" for path in sorted((PACKAGE / "daemon").glob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "Running"]
    assert made == []
    run = Running.starting("t", "work", 42, 5.0)
    assert (run.state, run.attempt, run.pid, run.started) == ("starting", None, 42, 5.0)
    contract = " ".join((Running.__doc__ or "").split())
    assert "the exclusive guard's" in contract and "writes ``reason`` alone" in contract
