"""Staging a submission: regular files only, a renamed notebook found, the locked cells put back.

On a small fixture release (tests/fixtures/tiny_release.ipynb: two exercises, three test cells,
a locked markdown cell, a written answer), without nbgrader or a kernel.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import nbformat
import pytest

from autograder.course.settings import Grading
from autograder.engine import staging
from autograder.engine.notes import safe_tree
from autograder.engine.staging import normalize, stage

from ..notebook_code import ROOT, nbgrader_meta

A = "tiny"
RELEASE = Path(__file__).parents[1] / "fixtures" / "tiny_release.ipynb"
ANSWERS = {"double": "def double(x):\n    return 2 * x", "half": "def half(x):\n    return x / 2",
           "why_half": "0.5: true division."}


def release() -> nbformat.NotebookNode:
    return nbformat.read(RELEASE, as_version=4)


def answered() -> nbformat.NotebookNode:
    """The release with every answer cell written, as a student submits it."""
    notebook = release()
    for cell in notebook.cells:
        if nbgrader_meta(cell).get("solution"):
            cell.source = ANSWERS[nbgrader_meta(cell)["grade_id"]]
    return notebook


def index(notebook, grade_id: str) -> int:
    return next(i for i, c in enumerate(notebook.cells) if nbgrader_meta(c).get("grade_id") == grade_id)


def graded_ids(notebook) -> list[str]:
    return [nbgrader_meta(c)["grade_id"] for c in notebook.cells if nbgrader_meta(c)]


def course(tmp_path: Path) -> Path:
    """A course folder with the fixture as the release of assignment ``tiny``."""
    root = tmp_path / "course"
    (root / "build" / "release" / A).mkdir(parents=True)
    nbformat.write(release(), root / "build" / "release" / A / f"{A}.ipynb")
    return root


def submission(root: Path, student: str = "s") -> Path:
    folder = root / "submitted" / student / A
    folder.mkdir(parents=True)
    return folder


# -- normalize: the shape nbgrader grades ------------------------------------------------------


def test_an_honest_notebook_is_left_as_it_is():
    fixed, notes = normalize(answered(), release())
    assert notes == []
    assert [c.source for c in fixed.cells] == [c.source for c in answered().cells]
    assert [c.metadata for c in fixed.cells] == [c.metadata for c in answered().cells]


def test_normalize_puts_locked_cells_back():
    notebook = answered()
    cells = notebook.cells
    cells.pop(index(notebook, "test_double_hidden"))  # deleted
    moved = cells.pop(index(notebook, "test_half"))
    cells.insert(0, moved)  # moved before its exercise
    cells[index(notebook, "test_double")].source = "pass"  # edited
    nbgrader_meta(cells[index(notebook, "intro")])["points"] = 99  # metadata of a locked cell
    cells.append(nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {"grade": True, "grade_id": "bonus",
                                                                          "points": 9, "locked": True}}))
    fixed, notes = normalize(notebook, release())
    assert sorted({n.kind for n in notes}) == ["added", "deleted", "edited", "metadata", "moved"], notes
    assert graded_ids(fixed) == graded_ids(release())
    released = {nbgrader_meta(c)["grade_id"]: c for c in release().cells if nbgrader_meta(c)}
    for cell in fixed.cells:
        if nbgrader_meta(cell):
            reference = released[nbgrader_meta(cell)["grade_id"]]
            assert nbgrader_meta(cell) == nbgrader_meta(reference)
            if nbgrader_meta(cell).get("locked"):
                assert cell.source == reference.source
    assert fixed.cells[-1].source == "x = 1" and "nbgrader" not in fixed.cells[-1].metadata
    # each test cell right after its exercise
    ids = [nbgrader_meta(c).get("grade_id") for c in fixed.cells]
    assert ids.index("test_double") == ids.index("double") + 1 and ids.index("test_half") == ids.index("half") + 1


def test_a_test_cell_that_lost_its_metadata_is_recognised_by_its_source():
    notebook = answered()
    notebook.cells[index(notebook, "test_half")].metadata = {}
    fixed, notes = normalize(notebook, release())
    assert [n.kind for n in notes] == ["metadata"] and "test_half" in notes[0].message
    assert graded_ids(fixed) == graded_ids(release())
    assert len([c for c in fixed.cells if c.source == "assert half(4) == 2"]) == 1  # restored, not doubled


def test_a_renamed_grade_id_cannot_earn_points_twice():
    notebook = answered()
    nbgrader_meta(notebook.cells[index(notebook, "test_double")])["grade_id"] = "test_half"  # two cells claim it
    fixed, notes = normalize(notebook, release())
    assert graded_ids(fixed) == graded_ids(release())  # each test cell once, with its own source
    released = {nbgrader_meta(c)["grade_id"]: c.source for c in release().cells if nbgrader_meta(c)}
    assert all(c.source == released[nbgrader_meta(c)["grade_id"]] for c in fixed.cells if nbgrader_meta(c).get("locked"))
    assert {"edited", "deleted"} <= {n.kind for n in notes}


def test_answer_cells_keep_the_students_text_and_the_release_metadata():
    notebook = answered()
    answer = notebook.cells[index(notebook, "double")]
    nbgrader_meta(answer)["points"] = 5  # an answer cell given points
    written = notebook.cells[index(notebook, "why_half")]
    notebook.cells[index(notebook, "why_half")] = nbformat.v4.new_code_cell(written.source, metadata=written.metadata)
    fixed, notes = normalize(notebook, release())
    assert {n.kind for n in notes} == {"metadata"}
    assert fixed.cells[index(fixed, "double")].source == ANSWERS["double"]
    assert nbgrader_meta(fixed.cells[index(fixed, "double")]) == nbgrader_meta(release().cells[index(release(), "double")])
    why = fixed.cells[index(fixed, "why_half")]
    assert why.cell_type == "markdown" and why.source == ANSWERS["why_half"]  # the release's cell type


def test_outputs_ids_and_bulky_metadata_are_dropped():
    notebook = answered()
    cell = notebook.cells[index(notebook, "double")]
    cell.outputs = [nbformat.v4.new_output("stream", text="x" * 100)]
    cell.execution_count = 7
    cell.metadata.update({"junk": "y" * 1000, "tags": ["mine"]})
    cell["id"] = "chosen-by-student"
    fixed, _ = normalize(notebook, release())
    cleaned = fixed.cells[index(fixed, "double")]
    assert cleaned.outputs == [] and cleaned.execution_count is None
    assert set(cleaned.metadata) == {"nbgrader", "tags"}
    assert [c["id"] for c in fixed.cells] == [f"cell-{i:04d}" for i in range(len(fixed.cells))]
    assert fixed.metadata == release().metadata


# -- stage: the files nbgrader reads ------------------------------------------------------------


def test_stage_copies_regular_files_and_finds_a_renamed_notebook(tmp_path):
    root = course(tmp_path)
    folder = submission(root)
    nbformat.write(answered(), folder / "copy of my work.ipynb")
    (folder / "data.txt").write_text("mine")
    (folder / "secret").symlink_to(ROOT / "nbgrader_config.py")
    (folder / "linked").symlink_to(ROOT / "autograder", target_is_directory=True)
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / f"{A}-checkpoint.ipynb").write_text("{}")
    (folder / "timestamp.txt").write_text("2026-01-01 10:00:00")
    staged = stage(root, A, "s", tmp_path / "staging")
    assert staged.notebooks == [A]
    assert sorted(n.kind for n in staged.notes) == ["link", "link", "renamed"]
    target = tmp_path / "staging" / "s" / A
    assert sorted(p.name for p in target.iterdir()) == sorted([f"{A}.ipynb", "data.txt", "timestamp.txt"])
    assert not any(p.is_symlink() for p in target.iterdir())
    graded = nbformat.read(target / f"{A}.ipynb", as_version=4)
    assert graded.cells[index(graded, "half")].source == ANSWERS["half"]
    (folder / "copy of my work.ipynb").unlink()
    staged = stage(root, A, "s", tmp_path / "staging2")
    assert staged.notebooks == [] and [n.kind for n in staged.notes if n.kind != "link"] == ["missing"]


def test_two_notebooks_equally_like_the_release_are_not_guessed(tmp_path):
    root = course(tmp_path)
    folder = submission(root)
    nbformat.write(answered(), folder / "draft.ipynb")
    nbformat.write(answered(), folder / "final.ipynb")
    staged = stage(root, A, "s", tmp_path / "staging")
    assert staged.notebooks == []
    assert sorted(n.kind for n in staged.notes) == ["ignored", "ignored", "missing"]


def test_an_extra_or_unreadable_notebook_is_noted_and_the_right_one_graded(tmp_path):
    root = course(tmp_path)
    folder = submission(root)
    nbformat.write(answered(), folder / f"{A}.ipynb")
    nbformat.write(answered(), folder / "scratch.ipynb")
    (folder / "broken.ipynb").write_text("{not json")
    staged = stage(root, A, "s", tmp_path / "staging")
    assert staged.notebooks == [A]
    assert sorted(n.kind for n in staged.notes) == ["ignored", "unreadable"]


def test_an_unreadable_notebook_under_the_right_name_scores_nothing_but_is_said(tmp_path):
    root = course(tmp_path)
    (submission(root) / f"{A}.ipynb").write_bytes(b"\x00\x01 not a notebook")
    staged = stage(root, A, "s", tmp_path / "staging")
    assert staged.notebooks == [] and sorted(n.kind for n in staged.notes) == ["missing", "unreadable"]


def test_oversized_files_are_left_out(tmp_path):
    root = course(tmp_path)
    folder = submission(root)
    nbformat.write(answered(), folder / f"{A}.ipynb")
    (folder / "a_small.txt").write_text("ok")
    (folder / "y_big.bin").write_bytes(b"x" * (2 * 2**20 + 1))  # over the limit of one file
    (folder / "z_more.bin").write_bytes(b"x" * 2**20)  # within it, but past the limit of the whole submission
    staged = stage(root, A, "s", tmp_path / "staging", Grading(max_file_mb=1, max_submission_mb=3))
    assert staged.notebooks == [A]
    assert [(n.kind, n.message.split()[0]) for n in staged.notes] == [("size", "y_big.bin"), ("size", "z_more.bin")]
    assert sorted(p.name for p in (tmp_path / "staging" / "s" / A).iterdir()) == ["a_small.txt", f"{A}.ipynb"]


def test_the_release_is_read_from_notebooks_when_nbgrader_has_not_released(tmp_path):
    root = tmp_path / "course"
    (root / "notebooks").mkdir(parents=True)
    nbformat.write(release(), root / "notebooks" / f"{A}.ipynb")
    nbformat.write(answered(), submission(root) / f"{A}.ipynb")
    assert staging.release_folder(root, A) == root / "notebooks"
    assert stage(root, A, "s", tmp_path / "staging").notebooks == [A]


def test_staging_makes_every_string_valid_utf8_and_drops_bulky_metadata(tmp_path):
    """A lone surrogate in a cell or its metadata, or a non-UTF-8 file name, cannot break a later step."""
    root = course(tmp_path)
    notebook = answered()
    notebook.cells.append(nbformat.v4.new_code_cell("print('\\ud800')", metadata={
        "junk": "x" * 1000, "tags": ["mine"],
        "nbgrader": {"grade": True, "grade_id": "\ud800", "points": 5, "locked": True}}))
    notebook.cells[-1].source = "x = '\ud800'"
    folder = submission(root)
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


@pytest.mark.parametrize("assignment", ["01_soft_lookup", "09_decoding_and_training"])
def test_a_course_release_of_reference_answers_is_left_as_it_is(assignment):
    """The same on a real notebook, answered with its reference solution (no note, the same cells)."""
    from ..course_copy import reference_answers
    from ..notebook_code import source_notebook

    released = source_notebook(assignment)
    submitted = copy.deepcopy(released)
    for cell in submitted.cells:
        if nbgrader_meta(cell).get("grade_id") in reference_answers(assignment):
            cell.source = reference_answers(assignment)[nbgrader_meta(cell)["grade_id"]]
    fixed, notes = normalize(submitted, released)
    assert notes == [] and graded_ids(fixed) == graded_ids(released)


#: Where the deep value goes in a notebook's JSON (text, as no JSON encoder nests that deep).
DEEP = "@deep@"


@pytest.mark.parametrize("depth", [700, 100_000])
def test_a_notebook_whose_metadata_nests_deep_is_graded_on_its_answers(tmp_path, depth):
    """Deep values in the notebook's, a cell's and an output's metadata: left out, with a note; the answers kept."""
    root = course(tmp_path)
    notebook = answered()
    notebook.metadata["deep"] = DEEP
    code = next(c for c in notebook.cells if c.cell_type == "code")
    code.metadata["jupyter"] = DEEP  # a key a student's cell keeps
    code.outputs = [nbformat.v4.new_output("display_data", {"text/plain": '[{"x": ['}, metadata={"deep": DEEP})]
    deep = '{"x": ' * depth + "{}" + "}" * depth
    (submission(root) / f"{A}.ipynb").write_text(json.dumps(notebook).replace(json.dumps(DEEP), deep))
    staged = stage(root, A, "s", tmp_path / "staging")
    assert staged.notebooks == [A]
    assert [n.kind for n in staged.notes] == ["deep"] and "3 values" in staged.notes[0].message, staged.notes
    graded = nbformat.read(tmp_path / "staging" / "s" / A / f"{A}.ipynb", as_version=4)
    for exercise, answer in ANSWERS.items():
        assert graded.cells[index(graded, exercise)].source == answer


def test_shallow_json_leaves_strings_and_a_shallow_notebook_alone():
    text = nbformat.writes(answered())
    assert staging.shallow_json(text) == (text, 0)
    tricky = '{"s": "\\"[[[[{{\\\\", "a": [[[1]], "]]"], "b": {"c": {"d": [2]}}}'  # an escaped quote, a backslash
    assert staging.shallow_json(tricky, 2) == ('{"s": "\\"[[[[{{\\\\", "a": [null, "]]"], "b": {"c": null}}', 2)
    assert json.loads(staging.shallow_json(tricky, 2)[0])["s"] == '"[[[[{{\\'
    assert staging.shallow_json('{"a": [[[', 1) == ('{"a": [[[', 0)  # malformed: the parser says so


def test_a_folder_named_like_the_notebook_is_not_taken_for_it(tmp_path):
    """A folder 01_soft_lookup.ipynb beside the notebook saved under another name: the notebook is graded."""
    root = course(tmp_path)
    folder = submission(root)
    nbformat.write(answered(), folder / f"{A} (1).ipynb")
    (folder / f"{A}.ipynb").mkdir()
    (folder / f"{A}.ipynb" / "inside.txt").write_text("x")
    (folder / "other.ipynb").mkdir()
    staged = stage(root, A, "s", tmp_path / "staging")
    assert staged.notebooks == [A]
    assert sorted(n.kind for n in staged.notes) == ["renamed", "unreadable", "unreadable"], staged.notes
    target = tmp_path / "staging" / "s" / A
    assert sorted(p.name for p in target.iterdir()) == [f"{A}.ipynb"] and (target / f"{A}.ipynb").is_file()
