"""``nbgrader validate`` shows each failing check's whole message, without the kernel's TCP warning."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import zipfile

import nbformat
import pytest

from autograder.errors import CheckFailed
from autograder.pipeline.bundle import TOP, write_bundle
from autograder.pipeline.course import assignments, module_name
from autograder.pipeline.feedback import load_config

from .course_copy import fill, mistake_source, reference_answers
from .notebook_code import ROOT

INDENT = "    "  # nbgrader's Validator.indent


def required(function) -> list[str]:
    """The parameters ``function`` must be given."""
    return [p.name for p in inspect.signature(function).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def width() -> int:
    return int(load_config(ROOT).Validator.width)


@pytest.mark.slow
def test_every_catalogued_message_fits_the_validator_width():
    """nbgrader cuts a line at Validator.width - 3 characters: no line of a visible check's message is that long.

    Each catalogued mistake is fed to its exercise's visible check, as Validate runs it.
    """
    too_long = []
    for assignment in assignments():
        hidden = importlib.import_module(f"autograder.hidden.{module_name(assignment)}")
        visible = importlib.import_module(f"autograder.checks.{module_name(assignment)}")
        for exercise, catalogue in hidden.MISTAKES.items():
            check = getattr(visible, f"check_{exercise}", None)
            if check is None or len(required(check)) != 1:
                continue  # a check that needs more than the student's function is fed by the notebook
            for mistake in catalogue:
                try:
                    check(mistake.fn)
                except CheckFailed as failure:
                    lines = f"{type(failure).__name__}: {failure}".splitlines()
                    too_long += [(mistake.name, len(line)) for line in lines if len(INDENT + line) > width() - 3]
    assert not too_long, f"lines nbgrader validate would cut at {width() - 3} characters: {too_long[:5]}"


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
