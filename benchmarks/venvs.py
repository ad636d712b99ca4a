"""Virtualenvs for the peers, built once under .cache/bench-venvs/ (gitignored) and reused.

Each peer gets its own environment so its dependencies (blueque 1.0.1 wants redis<6) never
meet Blueque's. A marker file records what was installed; a changed requirement rebuilds it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "bench-venvs"


@dataclass(frozen=True)
class Peer:
    name: str
    requirements: tuple[str, ...]
    import_name: str


#: The systems Blueque is measured against. Pinned so reruns compare like with like.
PEERS = {
    "original": Peer("original", ("blueque==1.0.1", "redis<6"), "blueque"),
    "rq": Peer("rq", ("rq==3.0.0",), "rq"),
}


def _python(target: Path) -> Path:
    return target / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment a peer script runs in: nothing of Blueque's own on its import path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update(extra)
    return env


def ensure(peer: Peer, cache: Path = CACHE, log: TextIO = sys.stderr) -> Path:
    """The interpreter of ``peer``'s virtualenv, creating it (pip install) when missing."""
    target = cache / peer.name
    marker = target / "bench-requirements.txt"
    wanted = "\n".join([f"python {sys.version_info[0]}.{sys.version_info[1]}",
                        *peer.requirements]) + "\n"
    python = _python(target)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"benchmarks: creating {target} ({', '.join(peer.requirements)})", file=log)
    shutil.rmtree(target, ignore_errors=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(target)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         *peer.requirements],
        check=True, env=clean_env(), stdout=subprocess.DEVNULL,
    )
    marker.write_text(wanted)
    return python


def versions(python: Path, modules: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of distributions in an interpreter's environment."""
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: out[name] = '-'\n"
            "print(json.dumps(out))\n")
    # run outside the work tree: from it, ``-c`` would see Blueque's own blueque.egg-info
    result = subprocess.run([str(python), "-c", code, *modules], capture_output=True,
                            text=True, env=clean_env(), check=True, cwd=str(python.parent))
    return dict(json.loads(result.stdout))
