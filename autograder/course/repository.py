"""Where things are in the course repository, and how nbgrader is run on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: The repository root: the folder that holds nbgrader_config.py.
ROOT = Path(__file__).resolve().parents[2]


def assignments(root: Path = ROOT) -> list[str]:
    """The assignment names (``NN_name``), from ``source/``, in order."""
    return sorted(p.name for p in (root / "source").iterdir() if (p / f"{p.name}.ipynb").is_file())


def module_name(assignment: str) -> str:
    """The checks module of an assignment: ``01_soft_lookup`` -> ``soft_lookup``."""
    return assignment.split("_", 1)[1]


def tool_env() -> dict[str, str]:
    """The environment for nbgrader: this interpreter's ``bin`` first on PATH.

    nbgrader calls ``jupyter`` and ``alembic`` by name, and the kernel it starts must be
    this environment's Python.
    """
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def nbgrader(*args: str, root: Path = ROOT, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``nbgrader ARGS`` in the course at ``root`` and return the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=root,
        env=tool_env(),
        check=check,
        text=True,
        capture_output=True,
    )


def pins(root: Path = ROOT) -> dict[str, str]:
    """The course's pinned dependencies (``pyproject.toml``): package name -> ``name==version``."""
    import tomllib

    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    return {d.split("==")[0]: d for d in deps}


def distribution_files(root: Path = ROOT) -> dict[str, bytes]:
    """The course's distribution metadata (name, version, entry points), as a ``.dist-info`` folder's files.

    Where the package is put on ``sys.path`` instead of being installed (Gradescope, a Dask worker),
    these files beside it make its entry points (the kernel provisioner of grading) known to
    ``importlib.metadata``, as ``pip install`` does.
    """
    import tomllib

    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    folder = f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    entry_points = "".join(f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items()) + "\n"
                           for group, entries in project.get("entry-points", {}).items())
    return {f"{folder}/METADATA": f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n".encode(),
            f"{folder}/entry_points.txt": entry_points.encode()}
