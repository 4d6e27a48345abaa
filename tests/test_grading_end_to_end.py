"""Through nbgrader, end to end: reference, untouched release, and every catalogued mistake."""

from __future__ import annotations

import html
import importlib
import re

import pytest
from nbgrader.api import Gradebook

from autograder.pipeline import feedback, grade
from autograder.pipeline.course import assignments, module_name

from .course_copy import fill, grading_options, make_course, mistake_source, reference_answers, released, submit

ASSIGNMENTS = assignments()


def feedback_text(course, student, assignment) -> str:
    path = course / "feedback" / student / assignment / f"{assignment}.html"
    text = html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))
    return text


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_grading(tmp_path, assignment):
    course = make_course(tmp_path, [assignment])
    student_version = released(course, assignment)
    reference = reference_answers(assignment)
    submit(course, assignment, "reference", fill(student_version, reference))
    submit(course, assignment, "untouched", student_version)
    if assignment == ASSIGNMENTS[0]:
        # A correct answer whose library prints a warning to stderr keeps its points.
        exercise, answer = next(iter(reference.items()))
        noisy = answer.replace(":\n", ":\n    import sys; sys.stderr.write('UserWarning: this API is deprecated\\n')\n", 1)
        submit(course, assignment, "warns", fill(student_version, dict(reference, **{exercise: noisy})))
    mistakes = importlib.import_module(f"autograder.hidden.{module_name(assignment)}").MISTAKES
    expected = {}
    for exercise, catalogue in mistakes.items():
        for i, mistake in enumerate(catalogue):
            student = f"mistake_{exercise}_{i}"
            answers = dict(reference, **{exercise: mistake_source(mistake, exercise)})
            submit(course, assignment, student, fill(student_version, answers))
            expected[student] = (exercise, mistake)

    summary = grade.autograde([assignment], workers=2, root=course, progress=False, options=grading_options())
    assert not summary.failed, str(summary)
    feedback.feedback([assignment], root=course)

    with Gradebook(grade.db_url(course)) as gb:
        ref = gb.find_submission(assignment, "reference")
        assert ref.max_score > 0
        assert ref.score == ref.max_score, [(g.name, g.score) for g in ref.notebooks[0].grades if g.score < g.max_score]
        assert gb.find_submission(assignment, "untouched").score == 0
        if assignment == ASSIGNMENTS[0]:
            assert gb.find_submission(assignment, "warns").score == ref.max_score
        for student, (exercise, mistake) in expected.items():
            notebook = gb.find_submission_notebook(assignment, assignment, student)
            hidden = {g.name: g for g in notebook.grades}[f"test_{exercise}_hidden"]
            assert hidden.score == 0, f"{mistake.name!r} earned points in test_{exercise}_hidden"
            text = feedback_text(course, student, assignment)
            assert mistake.name in text, f"the feedback for {mistake.name!r} does not name it"
            assert "BEGIN HIDDEN TESTS" not in text and "autograder.hidden" not in text
