"""The sandboxed kernel imports the very `autograder` package that grades it, and only its public part."""

from __future__ import annotations

import sys

import pytest

from autograder.engine import sandbox

pytestmark = pytest.mark.skipif(sandbox.mode() == "limits only", reason=f"no sandbox here: {sandbox.why_not()}")

SHOW = "import autograder, os; print(autograder.__file__); print(os.listdir(os.path.dirname(autograder.__file__) + '/hidden'))"


def test_the_kernel_imports_the_graders_package():
    """Wherever the package is (an editable install, another checkout), the sandbox's Python finds that one."""
    code, out, err = sandbox.run([sys.executable, "-c", SHOW], stdin=b"", timeout=120)
    assert code == 0, err.decode(errors="replace")
    path, hidden = out.decode().splitlines()
    assert path == str(sandbox.PACKAGE / "__init__.py")
    assert hidden == "[]"  # the instructor-only part is an empty folder there



PROBED = """
import sys
from autograder.engine import sandbox
code, out, err = sandbox.run([sys.executable, "-c", "import autograder; print('imported')"], stdin=b"", timeout=120)
print(sandbox.mode(), code, out.decode().strip(), err.decode(errors="replace")[-300:], sandbox.PACKAGE, sep="|")
"""


def test_a_package_nobody_may_read_is_graded_in_a_sandbox_that_can(tmp_path):
    """A course in a folder only root may enter (pytest's own tmp folders are) is still graded in a sandbox.

    Where a root grader's Python is readable by ``nobody``, the mode probe would pick "bwrap as nobody", whose
    bubblewrap cannot bind such a package: every kernel died before its first cell. The probe reads the package too,
    so grading there falls back to bubblewrap started by root (the sandbox user is still ``nobody`` inside).
    """
    import os
    import shutil
    import subprocess

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    shutil.copytree(sandbox.PACKAGE, private / "autograder", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(private))
    done = subprocess.run([sys.executable, "-c", PROBED], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert str(private) in done.stdout, "the copy was not the package imported"
    mode, code, out, err, _ = (done.stdout.strip().split("|") + [""] * 5)[:5]
    assert mode != "limits only" and code == "0" and out == "imported", done.stdout + done.stderr[-1000:]
