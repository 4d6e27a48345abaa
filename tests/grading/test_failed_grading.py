"""A grading that fails changes nothing in the gradebook: the summary, the feedback and the gradebook agree.

nbgrader saves the scores before it writes the graded notebook; a grading that failed after that (its
process out of memory, a full disk) left full marks in the gradebook while the run's summary said that
no score was recorded.
"""

from __future__ import annotations

import pytest

from autograder.grading import grade

from ..course_copy import fill, grading_settings, make_course, reference_answers, released, submit

A = "01_soft_lookup"


class FailsAfterSaving(grade.Runner):
    """nbgrader grades and saves the scores, then the grading fails, as a process killed at its end would."""

    def __call__(self, *args, **kwargs) -> str:
        assert super().__call__(*args, **kwargs) is None, "the grading itself should have worked"
        return "the grading process was killed after it saved the scores"


@pytest.mark.slow
def test_a_grading_that_fails_after_saving_leaves_the_gradebook_as_it_was(tmp_path):
    root = make_course(tmp_path, [A])
    submit(root, A, "kim", fill(released(root, A), reference_answers(A)))
    settings = grading_settings(root)
    grade.prepare_gradebook([(A, "kim")], settings)

    failed = grade.grade_one(A, "kim", settings, FailsAfterSaving())
    assert failed.error == "the grading process was killed after it saved the scores"
    assert grade.scores_of(settings, A, "kim") is None  # never graded before: no score at all, not full marks

    assert grade.grade_one(A, "kim", settings).error is None
    graded = grade.scores_of(settings, A, "kim")
    assert graded and all(auto is not None for auto, *_ in graded.values())

    submit(root, A, "kim", released(root, A))  # then a submission that answers nothing, whose grading fails
    again = grade.grade_one(A, "kim", settings, FailsAfterSaving())
    assert again.error is not None
    assert grade.scores_of(settings, A, "kim") == graded  # the earlier grading's scores are kept, unchanged


BWRAP_FAILED = """\
[AutogradeApp | ERROR] There was an error processing assignment: /tmp/autograder-grading-x/01_soft_lookup
Traceback (most recent call last):
  File "/srv/course/.venv/lib/python3.11/site-packages/nbgrader/apps/autogradeapp.py", line 1, in start
jupyter_client.kernelspec.KernelError: the sandboxed kernel did not start
bwrap: Can't find source path /tmp/autograder-grading-x/autograder-kernel-y: Permission denied
[AutogradeApp | ERROR] Please see the the above traceback for details on the specific errors on the above failures.
nbgrader.auth.NbGraderException: Please see the the above traceback for details
"""


def test_the_reason_of_a_failure_is_its_cause_not_nbgraders_closing_words():
    assert grade.failure_reason(BWRAP_FAILED, 1).startswith("bwrap: Can't find source path")
    without_bwrap = "\n".join(line for line in BWRAP_FAILED.splitlines() if not line.startswith("bwrap"))
    assert grade.failure_reason(without_bwrap, 1).startswith("jupyter_client.kernelspec.KernelError")
    assert grade.failure_reason("", 3) == "nbgrader exited with 3"
