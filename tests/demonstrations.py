"""The release of a notebook without its demonstrations, for the tests whose point is not them."""

from __future__ import annotations

import nbformat

from .course_copy import fill, reference_answers, without_demonstrations


def release_without_demonstrations(release: nbformat.NotebookNode, assignment: str) -> nbformat.NotebookNode:
    """``release``, the student version of ``assignment``, less the code cells that only demonstrate: those that
    neither a graded cell nor the reference's answers need (:func:`~tests.course_copy.without_demonstrations` of the
    notebook answered with the references; the release's own answer cells need less, not even the imports).

    A student may delete them; a test that grades many submissions of a notebook for what its answers or its
    checks do (a protection, a pool of kernels) then does not pay for the plots in each one. The class of every
    notebook (``tests/grading/test_grading_end_to_end.py``) and nbval still run every cell.
    """
    answered = fill(release, reference_answers(assignment))
    needed = {c.source for c in without_demonstrations(answered).cells}
    demonstrations = {c.source for c in answered.cells if c.cell_type == "code"} - needed
    short = nbformat.from_dict(release)
    short.cells = [c for c in release.cells if c.cell_type != "code" or c.source not in demonstrations]
    return short
