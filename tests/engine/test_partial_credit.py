"""Partial credit: a judged test cell earns the share of its check's cases that pass, through nbgrader's own scoring.

Notebook 01 is graded as grading runs it (test cells in the grader, :mod:`autograder.engine.judge`):
an answer right on every input but float32 ones earns every other case's share, in the cell's record and
in the score nbgrader reads from the cell (:func:`nbgrader.utils.determine_grade`); a cell the
instructor scores all or nothing earns nothing; what the student's code prints, however much, and
whatever stream it names, cannot remove the record or the score. The scoring itself is tested on
records built here (:func:`~autograder.engine.judge.scored_outputs`).
"""

from __future__ import annotations

import copy

import pytest
from nbformat.v4 import new_code_cell
from nbgrader.utils import determine_grade
from traitlets.config import Config

from autograder.engine import judge, zygote
from autograder.engine.execute import ResilientExecute, is_test_cell
from autograder.grader import cases
from autograder.grader.cases import CaseResult, CheckRecord

from .. import forked_kernels
from ..notebook_code import ROOT, nbgrader_meta
from .test_graded_kernel import A, instructor_notebook

#: Right on every input but float32 ones, where the weights are reversed.
WRONG_ON_FLOAT32 = '''
def {name}({args}):
    {noise}
    {body}
'''
#: Printing much on every call, and writing on a stream named as the grader's record (a stream is only text).
NOISE = """import sys
    from ipykernel.iostream import OutStream
    forged = OutStream(sys.stdout.session, sys.stdout.pub_thread, "record", watchfd=False)
    forged.set_parent(sys.stdout.parent_header)
    forged.write("a stream posing as the record")
    forged.flush()
    print("x" * 200_000)"""

KERNEL = ("nadaraya_watson", "x_query, x_train, y_train, bandwidth", "", """distance = x_query[:, None] - x_train[None, :]
    scores = -(distance**2) / (2 * bandwidth**2)
    weights = torch.softmax(scores, dim=-1)
    if x_query.shape[0] == 1:  # wrong for a single query
        weights = weights.flip(-1)
    return weights @ y_train, weights""")
SOFT = ("soft_lookup", "query, keys, values, temperature=1.0", NOISE, """if query.shape[-1] != keys.shape[-1]:
        raise ValueError("the query and the keys must have the same number of features")
    weights = torch.softmax(keys @ query / temperature, dim=-1)
    if query.dtype == torch.float32:
        weights = weights.flip(-1)
    return weights @ values, weights""")


def answered(notebook, exercises) -> None:
    for name, args, noise, body in exercises:
        cell = next(c for c in notebook.cells if nbgrader_meta(c).get("grade_id") == name)
        cell.source = WRONG_ON_FLOAT32.format(name=name, args=args, noise=noise, body=body)


def graded_cells(notebook, tmp_path, **traits) -> dict:
    """grade id -> the judged test cell, graded as grading grades it (sandboxed, the kernels forked from a zygote,
    where grading forks them: :mod:`tests.forked_kernels`; else in plain kernels)."""
    config = Config()
    config.CourseDirectory.root = str(ROOT)
    executor = ResilientExecute(sandbox=zygote.usable(), config=forked_kernels.config(config),
                                **{"timeout": 120, **traits})
    graded, _ = executor.preprocess(notebook, {"metadata": {"path": str(tmp_path)},
                                               "nbgrader": {"assignment": A, "notebook": A}})
    return {nbgrader_meta(c)["grade_id"]: c for c in graded.cells if is_test_cell(c)}


@pytest.mark.slow
def test_an_answer_right_but_on_one_kind_of_input_earns_the_other_cases_share(tmp_path):
    notebook = copy.deepcopy(instructor_notebook())
    answered(notebook, [KERNEL, SOFT])
    cells = graded_cells(notebook, tmp_path, all_or_nothing=[f"{A}/test_nadaraya_watson_hidden"])

    soft = cells["test_soft_lookup_hidden"]
    record = judge.case_record(soft)
    assert record is not None and not record["stopped"] and not record["all_or_nothing"]
    failed = [c["name"] for c in record["cases"] if not c["passed"]]
    assert failed == ["float32 inputs"], failed
    total = sum(c["weight"] for c in record["cases"])
    share = sum(c["weight"] for c in record["cases"] if c["passed"]) / total
    points = float(soft.metadata.nbgrader["points"])
    assert 0 < record["score"] < points and record["score"] == round(points * share, 2)
    assert determine_grade(soft) == (record["score"], points)  # nbgrader reads the same score from the cell
    shown = "".join(str(o.get("data", {}).get("text/plain", "")) for o in soft.outputs)
    assert "FAILED  float32 inputs" in shown and "passed" in shown

    # what the student's code printed went over the cell's budget and was cut, and said so; the record and the
    # score were kept; the stream named as the record is text on stdout
    streams = [o for o in soft.outputs if o.get("output_type") == "stream"]
    assert {o.name for o in streams} == {"stdout"}
    text = "".join(o.text for o in streams)
    assert "output cut" in text, text[-300:]
    assert [o.output_type for o in soft.outputs if o.output_type != "stream"] == ["display_data", "execute_result"]

    # the cell the instructor scores all or nothing: the same kind of answer earns nothing, its cases still listed
    kernel = cells["test_nadaraya_watson_hidden"]
    record = judge.case_record(kernel)
    assert record is not None and record["all_or_nothing"] and record["score"] == 0
    assert len([c for c in record["cases"] if not c["passed"]]) == 1 and len(record["cases"]) > 1
    assert determine_grade(kernel)[0] == 0

    # the visible checks are not cases: all or nothing, as before
    assert all(judge.case_record(cell) is None for grade_id, cell in cells.items() if not grade_id.endswith("_hidden"))


def record_of(*results: tuple[str, bool], stopped: str = "") -> list[CheckRecord]:
    return [CheckRecord("flash_attention", [CaseResult(name, 1.0, passed, "" if passed else "wrong there")
                                            for name, passed in results], stopped)]


def scored(records, failure=None, points=3.0, all_or_nothing=False) -> tuple[float, dict]:
    cell = new_code_cell("check(flash_attention)", metadata={"nbgrader": {
        "grade": True, "solution": False, "points": points, "grade_id": "t", "locked": True}})
    cell.outputs = judge.scored_outputs(records, failure, points, all_or_nothing)
    score, _ = determine_grade(cell)
    return score, judge.case_record(cell)


def test_the_score_is_the_passed_share_and_nbgrader_reads_it():
    assert scored(record_of(("a", True), ("b", True), ("causal", False)))[0] == 2.0
    assert scored(record_of(("a", True), ("b", True), ("causal", True)))[0] == 3.0
    assert scored(record_of(("a", False), ("b", False)), judge.error_output("CheckFailed", "wrong"))[0] == 0
    assert scored(record_of(("a", True), ("b", False)), all_or_nothing=True)[0] == 0


def test_a_check_that_stopped_scores_zero_whatever_passed_before():
    score, record = scored(record_of(("a", True), ("b", True), stopped="called a forbidden built-in"),
                           judge.error_output("CheckFailed", "called a forbidden built-in"))
    assert score == 0 and record["stopped"] == "called a forbidden built-in"
    # every case passed, but the cell failed after them (outside every case)
    score, record = scored(record_of(("a", True)), judge.error_output("NameError", "name 'x' is not defined"))
    assert score == 0 and "not defined" in record["stopped"]


def test_cases_of_one_name_are_told_apart_and_long_messages_are_cut():
    records = [CheckRecord("e", [CaseResult("shape", 1.0, True), CaseResult("shape", 1.0, False, "x" * 10**6)])]
    _, record = scored(records)
    assert [c["name"] for c in record["cases"]] == ["shape", "shape #2"]
    assert len(record["cases"][1]["message"]) <= judge.MESSAGE_CHARACTERS + len(" [cut]")


#: Right, but endless when four keys tie.
HANGS_ON_A_TIE = '''
def hard_lookup(query, keys, values):
    while keys.shape[0] == 4:
        pass
    return values[int(torch.argmax(keys @ query))]
'''


@pytest.mark.slow
def test_a_case_that_runs_out_of_time_keeps_the_share_of_the_cases_before_it(tmp_path):
    """The endless case and the cases after it fail; the cases before it keep their share; the next cell is graded."""
    notebook = copy.deepcopy(instructor_notebook())
    next(c for c in notebook.cells if nbgrader_meta(c).get("grade_id") == "hard_lookup").source = HANGS_ON_A_TIE
    cells = graded_cells(notebook, tmp_path, timeout=30)

    lookup = cells["test_hard_lookup_hidden"]
    record = judge.case_record(lookup)
    assert record is not None and not record["stopped"], lookup.outputs
    names = [c["name"] for c in record["cases"]]
    hung = names.index("all four keys tie")
    assert all(c["passed"] for c in record["cases"][:hung]) and hung > 0
    assert all(not c["passed"] and c["message"] == cases.OUT_OF_TIME for c in record["cases"][hung:])
    assert 0 < record["score"] < record["points"] and determine_grade(lookup)[0] == record["score"]
    # the kernel was brought back: the next exercise's hidden check runs and passes
    assert judge.case_record(cells["test_soft_lookup_hidden"])["score"] == judge.case_record(
        cells["test_soft_lookup_hidden"])["points"]
