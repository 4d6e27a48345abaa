"""``make grades``: nbgrader's grades.csv and the Canvas gradebook import, with assignments nobody submitted."""

from __future__ import annotations

import csv

import pytest
from nbgrader.api import Gradebook

from autograder.pipeline import export, grade

from .course_copy import make_course

pytestmark = pytest.mark.slow  # releases a course copy with nbgrader

ASSIGNMENT = "01_soft_lookup"


def score(course, student: str, fraction: float) -> None:
    """Give ``student`` a submission scoring ``fraction`` of every grade's points."""
    with Gradebook(grade.db_url(course)) as gb:
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
    with Gradebook(grade.db_url(course)) as gb:
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
