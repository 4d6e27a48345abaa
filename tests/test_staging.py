"""Staging a submission: regular files only, a renamed notebook found, the locked cells put back."""

from __future__ import annotations

import re

import nbformat

from autograder.pipeline.notes import safe_tree
from autograder.pipeline.staging import normalize, stage

from .course_copy import fill, reference_answers
from .notebook_code import ROOT, nbgrader_meta, source_notebook

A = "01_soft_lookup"


def cell_index(notebook, grade_id: str) -> int:
    return next(i for i, c in enumerate(notebook.cells) if nbgrader_meta(c).get("grade_id") == grade_id)


def released_source() -> nbformat.NotebookNode:
    """The release of notebook 01 as nbgrader makes it, from the source (no nbgrader run)."""
    notebook = source_notebook(A)
    for cell in notebook.cells:
        meta = nbgrader_meta(cell)
        if meta.get("solution"):
            cell.source = re.sub(r"### BEGIN SOLUTION.*?### END SOLUTION", "raise NotImplementedError()", cell.source,
                                 flags=re.S)
        elif "BEGIN HIDDEN TESTS" in cell.source:
            cell.source = cell.source.split("### BEGIN HIDDEN TESTS")[0].rstrip()
    return notebook


def test_normalize_puts_locked_cells_back():
    release = released_source()
    notebook = fill(release, reference_answers(A))
    cells = notebook.cells
    cells.pop(cell_index(notebook, "test_nadaraya_watson_hidden"))  # deleted
    moved = cells.pop(cell_index(notebook, "test_hard_lookup"))
    cells.insert(0, moved)  # moved before its exercise
    cells[cell_index(notebook, "test_soft_lookup")].source = "pass"  # edited
    nbgrader_meta(cells[cell_index(notebook, "test_soft_lookup_hidden")])["points"] = 99  # metadata
    nbgrader_meta(cells[cell_index(notebook, "test_scaled_dot_product_attention")])["grade_id"] = "mine"  # renamed id
    cells.append(nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {"grade": True, "grade_id": "bonus",
                                                                          "points": 9, "locked": True}}))
    fixed, notes = normalize(notebook, release)
    kinds = sorted({n.kind for n in notes})
    assert kinds == ["added", "deleted", "edited", "metadata", "moved"], notes
    ids = [nbgrader_meta(c).get("grade_id") for c in fixed.cells if nbgrader_meta(c)]
    expected = [nbgrader_meta(c)["grade_id"] for c in release.cells if nbgrader_meta(c)]
    assert ids == expected
    by_id = {nbgrader_meta(c)["grade_id"]: c for c in fixed.cells if nbgrader_meta(c)}
    released_by_id = {nbgrader_meta(c)["grade_id"]: c for c in release.cells if nbgrader_meta(c)}
    for gid, cell in by_id.items():
        assert nbgrader_meta(cell) == nbgrader_meta(released_by_id[gid])
        if nbgrader_meta(cell).get("locked"):
            assert cell.source == released_by_id[gid].source
    assert fixed.cells[-1].source == "x = 1" and "nbgrader" not in fixed.cells[-1].metadata
    assert normalize(fill(release, reference_answers(A)), release)[1] == []


def test_stage_copies_regular_files_and_finds_a_renamed_notebook(tmp_path):
    root = tmp_path / "course"
    (root / "build" / "release" / A).mkdir(parents=True)
    release = released_source()
    nbformat.write(release, root / "build" / "release" / A / f"{A}.ipynb")
    folder = root / "submitted" / "s" / A
    folder.mkdir(parents=True)
    nbformat.write(fill(release, reference_answers(A)), folder / "copy of my work.ipynb")
    (folder / "data.txt").write_text("mine")
    (folder / "secret").symlink_to(ROOT / "nbgrader_config.py")
    (folder / "timestamp.txt").write_text("2026-01-01 10:00:00")
    staged = stage(root, A, "s", tmp_path / "staging")
    assert staged.notebooks == [A]
    assert {n.kind for n in staged.notes} == {"renamed", "link"}
    target = tmp_path / "staging" / "s" / A
    assert sorted(p.name for p in target.iterdir()) == sorted([f"{A}.ipynb", "data.txt", "timestamp.txt"])
    assert not any(p.is_symlink() for p in target.iterdir())
    (folder / "copy of my work.ipynb").unlink()
    staged = stage(root, A, "s", tmp_path / "staging2")
    assert staged.notebooks == [] and [n.kind for n in staged.notes if n.kind != "link"] == ["missing"]


def test_staging_makes_every_string_valid_utf8_and_drops_bulky_metadata(tmp_path):
    """A lone surrogate in a cell or its metadata, or a non-UTF-8 file name, cannot break a later step."""
    root = tmp_path / "course"
    (root / "build" / "release" / A).mkdir(parents=True)
    release = released_source()
    nbformat.write(release, root / "build" / "release" / A / f"{A}.ipynb")
    notebook = fill(release, reference_answers(A))
    notebook.cells.append(nbformat.v4.new_code_cell("print('\\ud800')", metadata={
        "junk": "x" * 1000, "tags": ["mine"],
        "nbgrader": {"grade": True, "grade_id": "\ud800", "points": 5, "locked": True}}))
    notebook.cells[-1].source = "x = '\ud800'"
    folder = root / "submitted" / "s" / A
    folder.mkdir(parents=True)
    (folder / f"{A}.ipynb").write_text(nbformat.writes(safe_tree(notebook)).replace("\\\\ud800", "\\ud800"))
    with open(bytes(folder) + b"/\xff\xfe.txt", "wb") as handle:
        handle.write(b"data")
    staged = stage(root, A, "s", tmp_path / "staging")
    assert staged.notebooks == [A]
    for note in staged.notes:
        note.message.encode("utf-8")
    graded = nbformat.read(tmp_path / "staging" / "s" / A / f"{A}.ipynb", as_version=4)
    assert graded.cells[-1].source == "x = '\\ud800'" and "nbgrader" not in graded.cells[-1].metadata
    assert graded.cells[-1].metadata == {"tags": ["mine"]}
