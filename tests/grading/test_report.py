"""``make report``: scores per exercise, named mistakes (by id) with their section, other failures by message, ungraded."""

from __future__ import annotations

import html
import json
import re

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course.settings import Settings
from autograder.engine.judge import mistakes_record
from autograder.engine.notes import Note, write_notes
from autograder.grader.diagnosis import by_id
from autograder.grading import grade, report
from autograder.hidden.soft_lookup import MISTAKES

from ..course_copy import make_course, released
from . import case_records

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
                           "8 failed cases, 4 named mistakes, 3 other failures, 2 could not be graded")
    (assignment,) = result.assignments
    sdpa = assignment.exercises[EXERCISE]
    assert sdpa.max_points == sdpa_max
    assert sdpa.points == {"ann": 0.0, "ben": 0.0, "cat": sdpa_max, "fay": sdpa_max - cells[f"test_{EXERCISE}"],
                           "gus": sdpa_max - cells[f"test_{EXERCISE}_hidden"], "hal": sdpa_max - cells[f"test_{EXERCISE}"]}
    assert dict(sdpa.mistakes) == {NO_SCALING.id: {"ann", "ben", "gus"}, WRONG_AXIS.id: {"gus"}}
    # a test cell without a record of its cases is one case
    assert dict(sdpa.cases) == {("visible", "visible checks"): {"ann", "ben", "fay", "hal"},
                                ("hidden", "hidden checks"): {"ann", "ben", "gus"}}
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


def test_the_cases_that_fail_most_often(tmp_path):
    """Counted per case from the grader's record, with the mistake a case names; a stopped cell's reason by message."""
    course = make_course(tmp_path, [ASSIGNMENT])
    release = released(course, ASSIGNMENT)
    notebook, scores = case_records.partly_right(release)
    write_notes(case_records.place(course, ASSIGNMENT, "ann", notebook, scores), [])
    failing = [dict(c, passed=False, message="wrong") if c["name"] in ("float32 inputs", "causal, n != m") else c
               for c in case_records.SDPA_CASES]
    for cell in release.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == f"test_{EXERCISE}_hidden":
            cell.outputs, score = case_records.judged(EXERCISE, 3, [dict(c, mistakes=[]) for c in failing])
    write_notes(case_records.place(course, ASSIGNMENT, "ben", release, {f"test_{EXERCISE}_hidden": score}), [])
    write_notes(case_records.place(course, ASSIGNMENT, "cal", released(course, ASSIGNMENT), {}), [])

    result = report.write_report([ASSIGNMENT], root=course)

    exercises = result.assignments[0].exercises
    sdpa = exercises[EXERCISE]
    assert dict(sdpa.cases) == {("hidden", "causal, n != m"): {"ann", "ben"}, ("hidden", "float32 inputs"): {"ben"}}
    assert sdpa.points == {"ann": 4.25, "ben": 3.5, "cal": 5.0}
    assert dict(sdpa.mistakes) == {NO_SCALING.id: {"ann"}}  # named by the case, in the record alone
    assert sdpa.names == {NO_SCALING.id: "no scaling"} and sdpa.sections == {NO_SCALING.id: NO_SCALING.section}
    assert not sdpa.failures  # the cases say what failed: no message counted again
    assert dict(exercises["soft_lookup"].cases) == {("hidden", "the error for a bad <mask>"): {"ann"}}
    assert dict(exercises["soft_lookup"].failures) == {report.uncatalogued(case_records.STOPPED_ERROR): {"ann"}}
    assert dict(exercises["hard_lookup"].cases) == {("visible", "visible checks"): {"ann"}}
    assert str(result).endswith("3 graded submissions of 1 assignments; 5 failed cases, 1 named mistakes, "
                                "2 other failures, 0 could not be graded")

    page = (course / "report" / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<h4>Cases that fail most often</h4><table><thead><tr><th>case</th><th>checks</th>"
                     r"<th>students who failed it</th></tr></thead><tbody><tr><td>causal, n != m</td><td>hidden</td>"
                     r"<td>2</td></tr><tr><td>float32 inputs</td><td>hidden</td><td>1</td></tr></tbody></table>", page)
    assert "<td>the error for a bad &lt;mask&gt;</td>" in page and "<mask>" not in page
    from .test_feedback import Elements

    tags = Elements()
    tags.feed(page)  # hard_lookup's message (a student's exception's HTML) is text in the page
    assert f"<td>{html.escape(report.uncatalogued(case_records.RAISED))}</td>" in page
    assert not [name for _, attrs in tags.tags for name in attrs if name.startswith("on")]
