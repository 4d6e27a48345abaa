"""Every notebook's mistake catalogue, fed to its hidden checks in-process (fast).

The end-to-end test repeats this through nbgrader; this one runs in seconds and says
exactly which mistake slipped through.
"""

from __future__ import annotations

import importlib
import re

import pytest

from autograder.errors import CheckFailed
from autograder.pipeline.course import assignments, module_name

from .notebook_code import answer_cells, nbgrader_meta, solution_namespace, source_notebook


def hidden_module(assignment):
    return importlib.import_module(f"autograder.hidden.{module_name(assignment)}")


def catalogue():
    for assignment in assignments():
        for exercise, mistakes in hidden_module(assignment).MISTAKES.items():
            for i, mistake in enumerate(mistakes):
                yield pytest.param(assignment, exercise, i, id=f"{assignment}-{exercise}-{mistake.name}")


def headings(assignment):
    return {
        line.lstrip("#").strip()
        for cell in source_notebook(assignment).cells
        if cell.cell_type == "markdown"
        for line in cell.source.splitlines()
        if re.match(r"^##\s", line)
    }


@pytest.mark.parametrize("assignment", assignments())
def test_reference_passes_every_hidden_check(assignment):
    module = hidden_module(assignment)
    reference = solution_namespace(assignment)
    exercises = [e for e in answer_cells(assignment) if hasattr(module, f"check_{e}")]
    assert exercises, f"autograder.hidden.{module_name(assignment)} checks no exercise"
    for exercise in exercises:
        getattr(module, f"check_{exercise}")(getattr(reference, exercise))


@pytest.mark.parametrize("assignment", assignments())
def test_every_exercise_has_a_visible_and_a_hidden_test_cell(assignment):
    ids = [nbgrader_meta(c).get("grade_id") for c in source_notebook(assignment).cells]
    for exercise in hidden_module(assignment).MISTAKES:
        assert exercise in ids
        assert f"test_{exercise}" in ids and f"test_{exercise}_hidden" in ids, exercise


@pytest.mark.parametrize(("assignment", "exercise", "index"), list(catalogue()))
def test_mistake_is_caught_and_named(assignment, exercise, index):
    mistake = hidden_module(assignment).MISTAKES[exercise][index]
    assert mistake.section in headings(assignment), f"section {mistake.section!r} is not a heading of {assignment}"
    with pytest.raises(CheckFailed) as failure:
        getattr(hidden_module(assignment), f"check_{exercise}")(mistake.fn)
    assert mistake.name in str(failure.value)
