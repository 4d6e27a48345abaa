"""A Python every user of the machine can run, with the course's packages (for tests that run as other users)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def runnable_by_all(path: Path) -> bool:
    """Whether every user may run ``path`` (itself and each folder above it open to others)."""
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in (real, *real.parents))


def user_python(folder: Path) -> Path:
    """A Python every user can run, with the course's packages: this one where it can, else a shim in ``folder``.

    The course's environment may be made from a Python only root can run (pyenv under /root):
    then a virtual environment of the system's Python of the same version reads its packages.
    """
    if runnable_by_all(Path(sys.executable)):
        return Path(sys.executable)
    return system_python_env(folder)


def system_python_env(folder: Path) -> Path:
    """A virtual environment in ``folder`` of the system's Python of this version, reading this environment's packages
    (skips where there is none); its Python."""
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        pytest.skip(f"{sys.executable} cannot be run by other users and there is no {system} to share its packages")
    done = subprocess.run([str(system), "-m", "venv", "--without-pip", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"{system} cannot make a virtual environment (Debian: apt-get install python3-venv): "
                    f"{done.stderr.strip()[-200:]}")
    site = next((folder / "lib").glob("python*/site-packages"))
    ours = next(Path(p) for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    (site / "course.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")
    return folder / "bin" / "python"
