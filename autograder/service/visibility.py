"""What a student's feedback shows of the hidden checks before the due date (``GradingService.hidden_before_due``).

``messages``: everything, as ``make feedback`` shows it (the message of every failed check and the
list of its cases, never a hidden test's source). ``pass_fail``: a hidden check's cell says only
whether it passed (not which of its cases did). ``nothing``:
a hidden check's cell says only that it ran, and shows no points of its own. After the due date a
student sees everything. The graded notebook is never changed: the page is made from a copy.

What this does *not* hide: the notebook's total score on the page counts every check, the hidden
ones included (it is the official grade).
"""

from __future__ import annotations

import copy

from nbformat import NotebookNode, v4
from nbgrader.utils import determine_grade, is_grade, is_solution

MODES = ("messages", "pass_fail", "nothing")
#: The marker of the hidden part of a test cell (nbgrader's ``ClearHiddenTests``).
HIDDEN_MARKER = "BEGIN HIDDEN TESTS"
PASSED = "This hidden check passed."
FAILED = "This hidden check did not pass; its message is shown after the due date."
HIDDEN = "A hidden check ran here; its result is shown after the due date."


def is_hidden_check(cell: NotebookNode) -> bool:
    """Whether ``cell`` is a graded test cell with hidden tests."""
    return (cell.cell_type == "code" and is_grade(cell) and not is_solution(cell)
            and HIDDEN_MARKER in "".join(cell.source))


def shown(notebook: NotebookNode, mode: str) -> NotebookNode:
    """A copy of the graded ``notebook`` with its hidden checks' outputs as ``mode`` shows them."""
    if mode not in MODES:
        raise ValueError(f"hidden_before_due must be one of {', '.join(MODES)}, not {mode!r}")
    notebook = copy.deepcopy(notebook)
    if mode == "messages":
        return notebook
    for cell in notebook.cells:
        if not is_hidden_check(cell):
            continue
        if mode == "pass_fail":
            score, points = determine_grade(cell)
            if score is None or score < points:  # an error, so that every reader of the page sees it failed
                cell.outputs = [v4.new_output("error", ename="CheckFailed", evalue=FAILED,
                                              traceback=[f"CheckFailed: {FAILED}"])]
                continue
            text = PASSED
        else:
            text = HIDDEN
            cell.metadata.nbgrader["grade"] = False  # its points are not shown beside it
            source = "".join(cell.source)  # and nbgrader renders no hidden region outside a graded cell
            cell.source = source[:source.rfind("\n", 0, source.find(HIDDEN_MARKER)) + 1].rstrip()
        cell.outputs = [v4.new_output("stream", name="stdout", text=text + "\n")]
    return notebook
