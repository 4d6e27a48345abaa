"""A throwaway copy of the course in which the tests release, submit and grade."""

from __future__ import annotations

import inspect
import re
import shutil
from pathlib import Path

import nbformat

from autograder.diagnosis import Mistake
from autograder.pipeline import grade, sandbox
from autograder.pipeline.course import nbgrader

from .notebook_code import ROOT, nbgrader_meta

SOLUTION_MARKERS = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*\n", re.M)


def make_course(tmp: Path, assignments: list[str]) -> Path:
    """Copy the config and the sources of ``assignments`` to ``tmp`` and generate them there."""
    shutil.copy(ROOT / "nbgrader_config.py", tmp / "nbgrader_config.py")
    for name in assignments:
        shutil.copytree(ROOT / "source" / name, tmp / "source" / name)
        nbgrader("generate_assignment", name, "--force", "--log-level=WARN", root=tmp)
    return tmp


def released(course: Path, assignment: str) -> nbformat.NotebookNode:
    """The student version nbgrader generated in ``course``."""
    return nbformat.read(course / "build" / "release" / assignment / f"{assignment}.ipynb", as_version=4)


def reference_answers(assignment: str) -> dict[str, str]:
    """grade_id -> the reference answer cell as a student would submit it (markers removed)."""
    notebook = nbformat.read(ROOT / "source" / assignment / f"{assignment}.ipynb", as_version=4)
    return {
        nbgrader_meta(c)["grade_id"]: SOLUTION_MARKERS.sub("", c.source)
        for c in notebook.cells
        if nbgrader_meta(c).get("solution")
    }


def mistake_source(mistake: Mistake, exercise: str) -> str:
    """The mistake's code, renamed to the exercise, as a student would write it."""
    source = inspect.getsource(mistake.fn)
    return re.sub(rf"^(def|class) {mistake.fn.__name__}\b", rf"\1 {exercise}", source, count=1, flags=re.M)


def fill(notebook: nbformat.NotebookNode, answers: dict[str, str]) -> nbformat.NotebookNode:
    """A copy of ``notebook`` whose answer cells ``answers`` names are replaced."""
    notebook = nbformat.from_dict(notebook)
    for cell in notebook.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        if nbgrader_meta(cell).get("solution") and grade_id in answers:
            cell.source = answers[grade_id]
    return notebook


def submit(course: Path, assignment: str, student: str, notebook: nbformat.NotebookNode) -> Path:
    """Place ``notebook`` as ``student``'s submission of ``assignment``."""
    folder = course / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{assignment}.ipynb"
    nbformat.write(notebook, path)
    return path


def grading_options(**kwargs) -> grade.Options:
    """How the tests grade their own (trusted) submissions: in the sandbox where there is one, else without.

    The hostile submissions are never graded without the sandbox: their test skips instead.
    """
    return grade.Options(sandbox=sandbox.mode() != "limits only", **kwargs)
