"""``make setup PYTHON=...`` for an environment made with another Python of the same version says so.

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
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}

    def setup(python: str) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "--no-print-directory", "setup", f"PYTHON={python}", f"VENV={venv}"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)

    refused = setup(str(SYSTEM))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"was made with the Python of {sys.base_prefix}, not {SYSTEM}" in refused.stdout
    assert f"rm -rf {venv}" in refused.stdout
    kept = setup(sys.executable)  # the environment's own Python: nothing to say
    assert kept.returncode == 0 and f"in {venv}" in kept.stdout, kept.stdout + kept.stderr
