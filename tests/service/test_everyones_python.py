"""Grading with a Python every user can run (the hub's way): the sandbox then runs as ``nobody`` from outside.

bubblewrap itself is started as ``nobody`` there, so it must reach the kernel's private folder, which is
made in the grading run's temporary folder (:mod:`autograder.grading.runs`); and no other user may enter
that folder, which holds the copies of the submissions being graded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .user_env import runnable_by_all, system_python_env

GRADE_IN_A_RUN = """
import os, sys, tempfile
from pathlib import Path
from autograder.engine import sandbox
from autograder.grading import runs
run = runs.start(Path(sys.argv[1]))
os.environ["TMPDIR"] = str(run.folder)
tempfile.tempdir = None  # every folder of the run's processes is made in the run's, as grading's are
try:
    code, out, err = sandbox.run([sys.executable, "-c", "print('inside')"], stdin=b"", timeout=120)
    print(sandbox.mode(), code, out.decode().strip(), run.folder, err.decode(errors="replace")[-400:], sep="|")
    sys.stdout.flush()
    input()  # the run lives while the test looks at its folder
finally:
    run.close()
"""


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the sandbox runs as nobody only for a root grader"
    if not shutil.which("bwrap") or not shutil.which("setpriv"):
        return "no bwrap or setpriv here (Debian: apt-get install bubblewrap)"
    return None


@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_a_sandbox_started_as_nobody_reaches_its_folder_in_the_run_and_nothing_else(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="everyones-python-", dir="/tmp"))
    try:
        base.chmod(0o755)
        python = Path(os.sys.executable) if runnable_by_all(Path(os.sys.executable)) else system_python_env(base / "env")
        course = tmp_path / "course"
        course.mkdir()
        grader = subprocess.Popen([str(python), "-c", GRADE_IN_A_RUN, str(course)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = grader.stdout.readline()
            mode, code, out, folder, err = (line.rstrip("\n").split("|", 4) + [""] * 5)[:5]
            if mode != "bwrap as nobody":
                pytest.skip(f"the sandbox does not start as nobody here ({mode}): {grader.stderr.read()[-300:]}")
            assert (code, out) == ("0", "inside"), f"the sandboxed code did not run: {err}"
            # The sandbox user may pass through the run's folder, not list it; another user may not even enter it.
            nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
            other = ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", "--"]
            assert subprocess.run([*nobody, "ls", folder], capture_output=True).returncode != 0
            assert subprocess.run([*other, "ls", folder], capture_output=True).returncode != 0
            assert subprocess.run([*other, "test", "-x", folder]).returncode != 0
        finally:
            grader.communicate("\n", timeout=60)
    finally:
        shutil.rmtree(base, ignore_errors=True)
