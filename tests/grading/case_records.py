"""Judged test cells as the grader leaves them, for the tests of what reads them (feedback, Gradescope, report).

A cell whose check ran named cases carries the grader's record of them (a ``display_data`` output whose
metadata holds :data:`autograder.engine.judge.CASES_KEY`), then its score through nbgrader's own
mechanism: nothing more at full points, an ``execute_result`` with the score for part of them, an error
for none (or when the whole cell was stopped). A cell judged without cases passes with no output or fails
with an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook

from autograder.course.settings import Settings
from autograder.engine.judge import CASES_KEY
from autograder.grading import grade


def error(message: str, ename: str = "CheckFailed") -> nbformat.NotebookNode:
    return nbformat.v4.new_output("error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"])


def case(name: str, message: str = "", mistakes: tuple[str, ...] = (), weight: float | None = None) -> dict:
    """A case of a record: passed when it has no ``message``."""
    return {"name": name, "weight": weight, "passed": not message, "message": message, "mistakes": list(mistakes)}


def judged(exercise: str, points: float, cases: list[dict], stopped: str = "",
           all_or_nothing: bool = False) -> tuple[list[nbformat.NotebookNode], float]:
    """The outputs the grader writes for a check that ran ``cases`` (even shares unless weighted), and the score."""
    cases = [dict(c, weight=points / len(cases) if c["weight"] is None else c["weight"]) for c in cases]
    earned = sum(c["weight"] for c in cases if c["passed"])
    every = all(c["passed"] for c in cases)
    score = 0.0 if stopped or (all_or_nothing and not every) else (points if every else earned)
    record = {"exercise": exercise, "points": points, "score": score, "all_or_nothing": all_or_nothing,
              "stopped": stopped, "cases": cases}
    listing = "\n".join([f"Cases of {exercise}: {score:g} of {points:g} points"]
                        + [f"  {'passed' if c['passed'] else 'FAILED'}  {c['name']}" for c in cases])
    outputs = [nbformat.v4.new_output("display_data", {"text/plain": listing}, metadata={CASES_KEY: record})]
    if stopped or score == 0:
        outputs.append(error(stopped or "none of the cases passed"))
    elif score < points:
        outputs.append(nbformat.v4.new_output("execute_result", {"text/plain": f"{score}"}, execution_count=1))
    return outputs, score


def place(course: Path, assignment: str, student: str, notebook: nbformat.NotebookNode,
          scores: dict[str, float]) -> Path:
    """Put ``notebook`` where nbgrader leaves it graded, with ``scores`` (grade id -> points; the rest full) in the gradebook."""
    folder = course / "autograded" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{assignment}.ipynb").write_text(json.dumps(notebook))
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        gb.update_or_create_student(student)
        gb.update_or_create_submission(assignment, student)
        for nb in gb.find_submission(assignment, student).notebooks:
            for g in nb.grades:
                g.auto_score = scores.get(g.name, g.max_score)
        gb.db.commit()
    return folder


# -- 01_soft_lookup graded right but for one case, with a stopped cell and a hostile message -------------------

ASSIGNMENT = "01_soft_lookup"
NO_SCALING = "soft_lookup/scaled_dot_product_attention/no-scaling"
#: What a student's exception can say: HTML that would run if it were written into a page as it is.
HOSTILE = "<img src=x onerror=\"window.pwned='case message'\"><script>window.pwned='case script'</script>"
SDPA_CASES = [case("float64, no mask"), case("float32 inputs"), case("a batch of 3 <heads>"),
              case("causal, n != m", "With the input Q = <shape (2, 5, 8)>, $n > m$: the output is not what it should be.",
                   (NO_SCALING,))]
SOFT_LOOKUP_CASES = [case("one query"), case("several queries"), case("the error for a bad <mask>", HOSTILE)]
#: Why the whole cell of soft_lookup's hidden checks scores nothing, though cases passed.
STOPPED = "soft_lookup calls torch.softmax, which this exercise forbids."
#: How the error output of that cell says it (the reason the page and the results show).
STOPPED_ERROR = f"CheckFailed: {STOPPED}"
#: hard_lookup's visible check (no record of cases) fails with what the student's own code raised.
RAISED = f"ValueError: {HOSTILE}"


def partly_right(notebook: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, dict[str, float]]:
    """``notebook`` (01_soft_lookup's release) graded: scaled_dot_product_attention right but for one hidden case,
    soft_lookup's hidden cell stopped, hard_lookup's visible check failing with :data:`RAISED`; the scores."""
    notebook = nbformat.from_dict(notebook)
    scores = {}
    for cell in notebook.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id == "test_scaled_dot_product_attention_hidden":
            cell.outputs, scores[grade_id] = judged("scaled_dot_product_attention", 3, SDPA_CASES)
            cell.outputs.insert(0, nbformat.v4.new_output("stream", name="stdout", text="printed by the answer\n"))
        elif grade_id == "test_soft_lookup_hidden":
            cell.outputs, scores[grade_id] = judged("soft_lookup", 2, SOFT_LOOKUP_CASES, stopped=STOPPED)
        elif grade_id == "test_hard_lookup":
            cell.outputs, scores[grade_id] = [error(HOSTILE, "ValueError")], 0.0
    return notebook, scores
