"""notebooks/ and solutions/ are exactly what `make release` generates from source/.

The solutions' cells are compared here, generated without running them; their outputs are
nbval's to check (``make test`` runs every solution with nbval, figures compared too:
tests/conftest.py), so that no test runs a solution twice.
"""

from __future__ import annotations

import shutil

import nbformat
import pytest
from nbgrader.converters import GenerateSolution

from autograder.course.release import UNEXECUTED, VOLATILE_TAG, release_one
from autograder.course.repository import ROOT, assignments


def cells_only(notebook: nbformat.NotebookNode) -> str:
    """``notebook`` without what running it writes: outputs, execution counts, the kernel's language_info."""
    notebook = nbformat.from_dict(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    notebook.metadata.pop("language_info", None)
    return nbformat.writes(notebook)


@pytest.mark.slow
@pytest.mark.parametrize("assignment", assignments())
def test_release_is_committed(tmp_path, assignment):
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path)
    shutil.copytree(ROOT / "source" / assignment, tmp_path / "source" / assignment)
    release_one(assignment, root=tmp_path, execute=False)
    student = tmp_path / "notebooks" / f"{assignment}.ipynb"
    committed = ROOT / student.relative_to(tmp_path)
    assert committed.exists(), f"{committed.relative_to(ROOT)} is missing: run `make release`"
    assert student.read_bytes() == committed.read_bytes(), (
        f"{committed.relative_to(ROOT)} differs from what `make release` generates: run `make release`")
    generated = sorted((tmp_path / "solutions" / assignment).iterdir())
    committed_solutions = {p.name for p in (ROOT / "solutions" / assignment).iterdir()}
    assert committed_solutions == {p.name for p in generated}, "run `make release`"
    for path in generated:
        committed = ROOT / path.relative_to(tmp_path)
        if path.suffix != ".ipynb":
            assert path.read_bytes() == committed.read_bytes(), f"{committed.relative_to(ROOT)}: run `make release`"
            continue
        solution = nbformat.read(committed, as_version=4)
        assert cells_only(nbformat.read(path, as_version=4)) == cells_only(solution), (
            f"{committed.relative_to(ROOT)} differs from what `make release` generates: run `make release`")
        # what release.normalise strips, so that releasing twice leaves git status clean
        assert "version" not in solution.metadata.get("language_info", {"version": None}), committed
        for cell in solution.cells:
            assert "execution" not in cell.metadata, committed
            if VOLATILE_TAG in cell.metadata.get("tags", []):
                assert not cell.outputs, f"{committed.relative_to(ROOT)}: a {VOLATILE_TAG} cell keeps its outputs"


def test_the_unexecuted_solution_runs_every_step_of_nbgraders_but_execute():
    steps = [f"--GenerateSolution.preprocessors=nbgrader.preprocessors.{p.__name__}"
             for p in GenerateSolution.class_traits()["preprocessors"].default()]
    assert UNEXECUTED == [s for s in steps if not s.endswith(".Execute")] and len(steps) == len(UNEXECUTED) + 1


def test_every_assignment_is_released():
    released = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert released == set(assignments()), "notebooks/ and source/ list different assignments"
