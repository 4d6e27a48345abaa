"""What a user has: a fresh clone of the course, their shell's environment, and ``make`` typed in it.

The clone holds the files git would give them (tracked, and new ones not ignored: the working tree
as it would be committed), none of the ignored ones (no gradebook, no ``build/``, no ``.venv``).
It reuses the environment ``make setup`` made for these tests (``VENV=``, ``PYTHON=`` the Python it
was made with), as a user with a second clone would, rather than installing it again; so that
``make setup`` finds it up to date, the clone's ``Makefile`` and ``pyproject.toml`` are dated
before its stamp. Nothing else differs from a user's shell: no ``PYTHONPATH``, no pytest variables.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from ..notebook_code import ROOT

#: The environment ``make setup`` made, which runs these tests.
VENV = Path(sys.prefix)
#: The Python it was made with.
PYTHON = Path(getattr(sys, "_base_executable", sys.executable))
VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"
#: ``make setup``'s stamp of that environment (its name: the Makefile's STAMP).
STAMP = VENV / f".installed-{VERSION}"
#: What pins the clone's make to this environment, as a user with two environments types it.
CHOSEN = [f"VENV={VENV}", f"PYTHON={PYTHON}"]
#: Generous, only so that a hung command fails the test instead of hanging the suite: no verdict is about time.
HANG = 3600


def why_not() -> str:
    """Why the front doors cannot be tried here ("" when they can)."""
    if sys.prefix == sys.base_prefix:
        return "the tests do not run in an environment made by `make setup` (run them with `make test`)"
    if not STAMP.is_file():
        return f"{STAMP} is missing: `make setup` did not make {VENV} for Python {VERSION}"
    if shutil.which("make") is None:
        return "`make` is not installed"
    return ""


def user_env(**extra: str) -> dict[str, str]:
    """The environment of the user's shell: this one without what pytest, xdist or a venv's activation put in."""
    # make exports the variables set on its command line (`make test VENV=.venv-3.13`) to its recipes: they
    # are make's, not the user's shell's
    overrides = {word.split("=", 1)[0] for word in (" " + os.environ.get("MAKEFLAGS", "")).partition(" -- ")[2].split()
                 if "=" in word}
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", *overrides)
           and not k.startswith(("PYTEST_", "COV_CORE_"))}
    bins = str(VENV / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != bins)  # make puts it first
    return env | extra


def clone(into: Path | None = None) -> Path:
    """A fresh clone of the course: the files git tracks (or would), in a folder every user can read."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    # /tmp, readable: the sandbox's user (nobody) reads the clone's package, as it reads a course's.
    target = Path(tempfile.mkdtemp(prefix="course-clone-", dir=into))
    target.chmod(0o755)
    for name in filter(None, listed):
        source = ROOT / name
        if not source.is_file():  # deleted in the working tree, not yet in git
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name)
    before = STAMP.stat().st_mtime - 1
    for name in ("Makefile", "pyproject.toml"):
        os.utime(target / name, (before, before))
    for folder, dirs, _ in os.walk(target):
        for d in dirs:
            path = Path(folder) / d
            path.chmod(path.stat().st_mode | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return target


def remove(folder: Path) -> None:
    """Remove a clone (its files may have been made read-only by grading)."""
    shutil.rmtree(folder, ignore_errors=True)


def make(course: Path, *args: str, env: dict[str, str] | None = None, pinned: bool = True
         ) -> subprocess.CompletedProcess:
    """``make ARGS`` typed in ``course`` (with the environment of these tests chosen unless ``pinned`` is False)."""
    return subprocess.run(["make", *args, *(CHOSEN if pinned else [])], cwd=course, env=env or user_env(),
                          capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL)


def said(done: subprocess.CompletedProcess) -> str:
    """Everything a command printed, for an assertion's message."""
    return f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
