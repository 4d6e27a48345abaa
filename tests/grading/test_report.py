"""``make report``: scores per exercise, named mistakes (by id) with their section, other failures by message, ungraded."""

from __future__ import annotations

import json
import re

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course.settings import Settings
from autograder.diagnosis import by_id
from autograder.engine.judge import mistakes_record
from autograder.engine.notes import Note, write_notes
from autograder.grading import grade, report
from autograder.hidden.soft_lookup import MISTAKES

from ..course_copy import make_course, released

pytestmark = pytest.mark.slow  # releases a course copy with nbgrader

ASSIGNMENT = "01_soft_lookup"
EXERCISE = "scaled_dot_product_attention"
NO_SCALING = by_id(MISTAKES[EXERCISE], "soft_lookup/scaled_dot_product_attention/no-scaling")
WRONG_AXIS = by_id(MISTAKES[EXERCISE], "soft_lookup/scaled_dot_product_attention/softmax-over-the-wrong-axis")
NAMED = f"With the input Q = <shape (2, 5, 8)>:\nThe output is not what it should be.\n{NO_SCALING.message()}"


def error(message: str):
    return nbformat.v4.new_output("error", ename="CheckFailed", evalue=message, traceback=[f"CheckFailed: {message}"])


def graded(course, student: str, failing: dict[str, str | tuple]) -> None:
    """A graded notebook whose test cells ``failing`` failed and score 0; the rest pass.

    ``failing`` maps a grade id to the cell's message, or to ``(message, mistakes)`` for a failure whose
    check named mistakes (the grader's record of them comes first, as the judge writes it).
    """
    notebook = released(course, ASSIGNMENT)
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in failing:
            message, mistakes = failing[grade_id] if isinstance(failing[grade_id], tuple) else (failing[grade_id], ())
            cell.outputs = ([mistakes_record(mistakes)] if mistakes else []) + [error(message)]
    folder = course / "autograded" / student / ASSIGNMENT
    folder.mkdir(parents=True)
    (folder / f"{ASSIGNMENT}.ipynb").write_text(json.dumps(notebook))
    write_notes(folder, [])
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        gb.update_or_create_student(student)
        gb.update_or_create_submission(ASSIGNMENT, student)
        for nb in gb.find_submission(ASSIGNMENT, student).notebooks:
            for g in nb.grades:
                g.auto_score = 0.0 if g.name in failing else g.max_score
        gb.db.commit()


def test_class_report(tmp_path):
    course = make_course(tmp_path, [ASSIGNMENT])
    visible = "With the input Q = <shape (3, 4)>: the largest error is {} at index [{}, 1]."
    named = (NAMED, [NO_SCALING])
    graded(course, "ann", {f"test_{EXERCISE}": visible.format("0.133", 0), f"test_{EXERCISE}_hidden": named})
    graded(course, "ben", {f"test_{EXERCISE}": visible.format("0.244", 2), f"test_{EXERCISE}_hidden": named})
    graded(course, "gus", {f"test_{EXERCISE}_hidden": (f"{NAMED}\n{WRONG_AXIS.message()}", [NO_SCALING, WRONG_AXIS])})
    graded(course, "fay", {f"test_{EXERCISE}": visible.format("0.5", 3)})  # a failure no mistake explains
    # A mistake's words in a message (a student's code can print them) without the grader's record of it.
    forged = NAMED.replace("(2, 5, 8)", "(1, 1)")
    graded(course, "hal", {f"test_{EXERCISE}": forged})
    graded(course, "cat", {"test_hard_lookup": "<script>alert('x')</script> hard_lookup is not written yet"})
    failed = course / "autograded" / "dan" / ASSIGNMENT
    failed.mkdir(parents=True)
    write_notes(failed, [Note("failed", "This submission could not be graded (the kernel died).")])
    (course / "submitted" / "eve" / ASSIGNMENT).mkdir(parents=True)
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        cells = {c.name: c.max_score for nb in gb.find_assignment(ASSIGNMENT).notebooks for c in nb.grade_cells}
    sdpa_max = cells[f"test_{EXERCISE}"] + cells[f"test_{EXERCISE}_hidden"]

    result = report.write_report([ASSIGNMENT], root=course)

    assert str(result) == ("report: report/index.html: 6 graded submissions of 1 assignments; "
                           "4 named mistakes, 3 other failures, 2 could not be graded")
    (assignment,) = result.assignments
    sdpa = assignment.exercises[EXERCISE]
    assert sdpa.max_points == sdpa_max
    assert sdpa.points == {"ann": 0.0, "ben": 0.0, "cat": sdpa_max, "fay": sdpa_max - cells[f"test_{EXERCISE}"],
                           "gus": sdpa_max - cells[f"test_{EXERCISE}_hidden"], "hal": sdpa_max - cells[f"test_{EXERCISE}"]}
    assert dict(sdpa.mistakes) == {NO_SCALING.id: {"ann", "ben", "gus"}, WRONG_AXIS.id: {"gus"}}
    assert sdpa.names == {NO_SCALING.id: "no scaling", WRONG_AXIS.id: "softmax over the wrong axis"}
    assert sdpa.sections == {NO_SCALING.id: "6. Scaled dot-product attention", WRONG_AXIS.id: "6. Scaled dot-product attention"}
    # The same failure on other numbers is one message; ann's and ben's are symptoms of their named mistake.
    # hal's message has a mistake's words but no record of the grader's: not a named mistake.
    assert dict(sdpa.failures) == {
        "CheckFailed: With the input Q = <shape (#, #)>: the largest error is # at index [#, #].": {"fay"},
        report.uncatalogued(f"CheckFailed: {forged}"): {"hal"}}
    assert list(assignment.exercises)[:2] == ["hard_lookup", "soft_lookup"]
    assert result.ungraded == [(ASSIGNMENT, "dan", "This submission could not be graded (the kernel died)."),
                               (ASSIGNMENT, "eve", "submitted, but no graded copy in autograded/ (run make autograde)")]

    page = (course / "report" / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<td>no scaling</td><td>3</td><td>6\. Scaled dot-product attention</td>", page)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert f"1 of 6 students have full marks ({sdpa_max:g} points)" in page
    png = course / "report" / f"{ASSIGNMENT}-scores.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"src='{ASSIGNMENT}-scores.png'" in page


def test_the_report_runs_no_script_and_loads_nothing_from_elsewhere():
    from .test_feedback import assert_inert_policy, policy_of

    failure = report.ClassReport(ungraded=[(ASSIGNMENT, "eve", "<img src=x onerror=alert(1)>")])
    assert_inert_policy(policy_of(report.page(failure)), ["'none'"])
