"""``nbgrader validate`` shows each failing check's whole message, without the kernel's TCP warning."""

from __future__ import annotations

import importlib
import subprocess
import sys
import zipfile

import nbformat
import pytest

from autograder.errors import CheckFailed
from autograder.pipeline.bundle import TOP, write_bundle
from autograder.pipeline.course import module_name

from .course_copy import fill, mistake_source, reference_answers


@pytest.mark.slow
def test_validate_shows_every_line_whole(tmp_path):
    """The bundle's `course.py validate` on a notebook with the no-scaling mistake: every line whole, no warning."""
    with zipfile.ZipFile(write_bundle(tmp_path / "bundle.zip")) as archive:
        archive.extractall(tmp_path)
    folder = tmp_path / TOP
    assignment = "01_soft_lookup"
    hidden = importlib.import_module(f"autograder.hidden.{module_name(assignment)}")
    mistake = next(m for m in hidden.MISTAKES["scaled_dot_product_attention"] if m.fn.__name__ == "sdpa_no_scaling")
    answers = dict(reference_answers(assignment), scaled_dot_product_attention=mistake_source(
        mistake, "scaled_dot_product_attention"))
    notebook = nbformat.read(folder / f"{assignment}.ipynb", as_version=4)
    nbformat.write(fill(notebook, answers), folder / f"{assignment}.ipynb")

    done = subprocess.run([sys.executable, "course.py", "--python", sys.executable, "validate", f"{assignment}.ipynb"],
                          cwd=folder, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert "VALIDATION FAILED ON 1 CELL(S)" in out, out
    visible = importlib.import_module(f"autograder.checks.{module_name(assignment)}")
    with pytest.raises(CheckFailed) as failure:
        visible.check_scaled_dot_product_attention(mistake.fn)
    for line in str(failure.value).splitlines():
        assert line in out, f"not shown whole: {line!r}"
    assert "without encryption" not in out, out
