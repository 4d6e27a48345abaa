"""The sandboxed kernel imports the very `autograder` package that grades it, and only its public part."""

from __future__ import annotations

import sys

import pytest

from autograder.pipeline import sandbox

pytestmark = pytest.mark.skipif(sandbox.mode() == "limits only", reason=f"no sandbox here: {sandbox.why_not()}")

SHOW = "import autograder, os; print(autograder.__file__); print(os.listdir(os.path.dirname(autograder.__file__) + '/hidden'))"


def test_the_kernel_imports_the_graders_package():
    """Wherever the package is (an editable install, another checkout), the sandbox's Python finds that one."""
    code, out, err = sandbox.run([sys.executable, "-c", SHOW], stdin=b"", timeout=120)
    assert code == 0, err.decode(errors="replace")
    path, hidden = out.decode().splitlines()
    assert path == str(sandbox.PACKAGE / "__init__.py")
    assert hidden == "[]"  # the instructor-only part is an empty folder there
