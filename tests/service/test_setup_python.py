"""``make setup PYTHON=...`` for an environment made with another Python of the same version says so; a Python whose
regular expressions break nbconvert's pages is refused; once the environment is made, every target uses its Python.

The hub's guide makes the course's environment with a Python every user can run (``/usr/bin/python3``);
an environment already made from another 3.11 (pyenv's, under ``/root``) was kept, silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..frontdoor import user
from ..notebook_code import ROOT

SYSTEM = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")


def _base(python: str) -> str:
    if not os.path.exists(python):
        return ""
    return subprocess.run([python, "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.skipif(not SYSTEM.exists() or not shutil.which("make") or _base(str(SYSTEM)) == sys.base_prefix,
                    reason=f"needs make and a {SYSTEM} other than this environment's Python")
def test_make_setup_with_another_python_than_the_environments_refuses_and_says_what_to_do(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    (venv / f".installed-{version}").touch()  # installed: make setup has nothing to install
    env = user.user_env()  # without the PYTHON= and VENV= that `make test PYTHON=...` exports to its recipes

    def setup(python: str) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "--no-print-directory", "setup", f"PYTHON={python}", f"VENV={venv}"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)

    refused = setup(str(SYSTEM))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"was made with the Python of {sys.base_prefix}, not {SYSTEM}" in refused.stdout
    assert f"rm -rf {venv}" in refused.stdout
    kept = setup(sys.executable)  # the environment's own Python: nothing to say
    assert kept.returncode == 0 and f"in {venv}" in kept.stdout, kept.stdout + kept.stderr


def _broken_regular_expressions() -> Path | None:
    """A Python 3.11.0-3.11.4 on this machine (Debian 12's is 3.11.2), if there is one."""
    for candidate in (SYSTEM, Path("/usr/bin/python3")):
        done = subprocess.run([str(candidate), "-c", "import sys; print((3, 11) <= sys.version_info[:3] < (3, 11, 5))"],
                              capture_output=True, text=True) if candidate.exists() else None
        if done is not None and done.stdout.strip() == "True":
            return candidate
    return None


@pytest.mark.skipif(_broken_regular_expressions() is None or not shutil.which("make"),
                    reason="needs make and a Python 3.11.0-3.11.4 (Debian 12's python3) to see it refused")
def test_make_setup_refuses_a_python_whose_regular_expressions_break_nbconvert(tmp_path):
    python = _broken_regular_expressions()
    venv = tmp_path / "venv"
    env = user.user_env()
    done = subprocess.run(["make", "--no-print-directory", "setup", f"PYTHON={python}", f"VENV={venv}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "use 3.11.5 or newer" in done.stdout, done.stdout + done.stderr
    assert not venv.exists()  # refused before anything is made


def _another_version() -> Path | None:
    """A supported Python (3.11 to 3.14) of another minor version than this one, on PATH or pyenv's, if any."""
    for minor in (14, 13, 12, 11):
        if minor == sys.version_info.minor:
            continue
        found = shutil.which(f"python3.{minor}")
        candidates = [Path(found)] if found else []
        candidates += sorted(Path.home().glob(f".pyenv/versions/3.{minor}.*/bin/python3.{minor}"))
        for candidate in candidates:
            if subprocess.run([str(candidate), "-c", "import sys"], capture_output=True).returncode == 0:
                return candidate
    return None


@pytest.mark.skipif(_another_version() is None or not shutil.which("make"),
                    reason="needs make and a Python 3.11-3.14 of another version than this one")
def test_after_setup_with_a_named_python_a_target_without_one_uses_the_environments(tmp_path):
    """The hub's guide runs ``make setup PYTHON=<a Python every user can run>`` and then ``make release`` without
    naming it again. Where the newest Python on PATH is another version (Debian 12: its python3.11 is 3.11.2, the
    guide's Python a newer one), ``make release`` set up an environment again with that one, and stopped."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / f".installed-{sys.version_info.major}.{sys.version_info.minor}").touch()  # made with this Python
    newer = tmp_path / "bin"
    newer.mkdir()
    other = _another_version()
    (newer / other.name).symlink_to(other)  # the Python that make finds first without PYTHON=
    env = user.user_env()
    env["PATH"] = f"{newer}:{env['PATH']}"
    done = subprocess.run(["make", "--no-print-directory", "setup", f"VENV={venv}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert done.returncode == 0 and f"make: Python {version} ({venv}/bin/python" in done.stdout, done.stdout + done.stderr
