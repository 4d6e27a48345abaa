"""notebooks/ and solutions/ are exactly what `make release` generates from source/."""

from __future__ import annotations

import shutil

import pytest

from autograder.pipeline.course import ROOT, assignments
from autograder.pipeline.release import release_one


@pytest.mark.slow
@pytest.mark.parametrize("assignment", assignments())
def test_release_is_committed(tmp_path, assignment):
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path)
    shutil.copytree(ROOT / "source" / assignment, tmp_path / "source" / assignment)
    release_one(assignment, root=tmp_path)
    generated = [tmp_path / "notebooks" / f"{assignment}.ipynb"]
    generated += sorted((tmp_path / "solutions" / assignment).iterdir())
    for path in generated:
        committed = ROOT / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed.relative_to(ROOT)} is missing: run `make release`"
        assert path.read_bytes() == committed.read_bytes(), (
            f"{committed.relative_to(ROOT)} differs from what `make release` generates: run `make release`"
        )
    committed_solutions = {p.name for p in (ROOT / "solutions" / assignment).iterdir()}
    assert committed_solutions == {p.name for p in (tmp_path / "solutions" / assignment).iterdir()}


def test_every_assignment_is_released():
    released = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert released == set(assignments()), "notebooks/ and source/ list different assignments"
