"""Through nbgrader, end to end: one class of every notebook, graded in one parallel run.

Each notebook is submitted as its reference, untouched, and as the fewest submissions with mistakes that hold
a catalogued mistake of every exercise between them (:func:`graded_mistake_submissions`, taken from
:func:`~tests.course_copy.mistake_submissions`: one mistake per exercise at once). Every other catalogued
mistake is judged in-process as grading judges it, through the same proxies, the source read the same way and
the cases recorded (``tests/checks/test_catalogue.py``); what only nbgrader adds (the two kernels, the
gradebook, the feedback page) is the same for every mistake of an exercise, and each grading here costs
seconds of a machine's time. The submissions with mistakes answer right only the exercises their mistakes'
grading needs (:func:`~tests.course_copy.depends_on`), leave the others as released, and leave out the
demonstrations no graded cell needs, as a student may
(:func:`~tests.course_copy.without_demonstrations`): those grade nothing these submissions are for
and are most of the time a notebook takes; the reference submission answers and runs everything, the
untouched release, which answers nothing, leaves them out too (they grade nothing it is for), and nbval
runs every solution. Each mistake is judged on its own
exercise's hidden test cell, as the judge judges it, by its cases: that cell loses points (the cases
the mistake gets right keep their share), a failed case names the mistake, its section and its
catalogue id, and the check goes on past it (only a forbidden call stops a check, and the stop names
the mistake); the cell's output names it, and the feedback page too, showing no hidden test.
One test per notebook, each asserting on its part of the class; the class is graded in two runs, one per
half of the notebooks (:data:`HALVES`, of about the same CPU time), each on one pytest worker, so that both
workers share the class and each run starts its fork server, its zygote and its gradebook once; every problem
found is reported at the end.
"""

from __future__ import annotations

import html
import re
import types
from collections import Counter

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course.repository import assignments
from autograder.course.settings import Settings
from autograder.engine import judge
from autograder.grading import feedback, grade

from ..course_copy import (
    catalogue,
    depends_on,
    fill,
    grading_settings,
    make_course,
    mistake_source,
    mistake_submissions,
    reference_answers,
    released,
    submit,
    without_demonstrations,
)
from ..notebook_code import ROOT, nbgrader_meta

ASSIGNMENTS = assignments()
NOISY = "import sys; sys.stderr.write('UserWarning: this API is deprecated\\n')"


def feedback_text(course, student, assignment) -> str:
    path = course / "feedback" / student / assignment / f"{assignment}.html"
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def graded_cells(course, student, assignment) -> dict[str, nbformat.NotebookNode]:
    """grade_id -> the cell, in the autograded notebook."""
    graded = nbformat.read(course / "autograded" / student / assignment / f"{assignment}.ipynb", as_version=4)
    return {nbgrader_meta(cell).get("grade_id", ""): cell for cell in graded.cells}


def printed(cell) -> str:
    """Everything ``cell`` printed or raised."""
    parts = []
    for out in cell.get("outputs", []):
        parts += [out.get("text", ""), out.get("evalue", ""), *out.get("traceback", []),
                  str(out.get("data", {}).get("text/plain", ""))]
    return "\n".join(parts)


def judged_problems(where: str, cell, mistake) -> list[str]:
    """What is wrong in what the judge wrote for the hidden test ``cell`` of ``mistake``: the check goes on past it
    (only a forbidden call stops it, naming the mistake), and a failed case names it, its section and its catalogue
    id; or, where the source reader found a forbidden built-in before any case ran, the cell's failure does."""
    record = judge.case_record(cell)
    if record is None:
        named = [m["id"] for m in judge.named_mistakes(cell)]
        if mistake.id in named and mistake.section in printed(cell):
            return []
        return [f"{where}: no case ran, and the cell does not name it with its section and id: {named}"]
    if record["stopped"]:
        if f"'{mistake.name}'" in record["stopped"]:
            return []  # a forbidden call: the whole cell scores zero, and says why
        return [f"{where}: the check stopped outside its cases: {record['stopped'][:600]}"]
    failed = [c for c in record["cases"] if not c["passed"]]
    named = [c for c in failed if f"'{mistake.name}'" in c["message"] and mistake.section in c["message"]]
    if not named:
        return [f"{where}: no failed case names it with its section: {[c['message'][:300] for c in failed]}"]
    if not any(mistake.id in c["mistakes"] for c in named):
        return [f"{where}: the case that names it records {[c['mistakes'] for c in named]}, not {mistake.id}"]
    return []


def graded_mistake_submissions(assignment: str) -> list[tuple[int, dict]]:
    """The fewest of :func:`~tests.course_copy.mistake_submissions`, each with its index, that hold a mistake of every
    exercise with a catalogue (in order: the first holds the most)."""
    left, chosen = set(catalogue(assignment)), []
    for k, mistakes in enumerate(mistake_submissions(assignment)):
        if left & set(mistakes):
            chosen.append((k, mistakes))
            left -= set(mistakes)
    return chosen


def submit_the_class(course, assignments: list[str]) -> dict[tuple[str, str], dict]:
    """Submit each notebook's reference, untouched release and mistakes; (assignment, student) -> its mistakes."""
    expected = {}
    for assignment in assignments:
        student_version = released(course, assignment)
        reference = reference_answers(assignment)
        submit(course, assignment, "reference", fill(student_version, reference))
        submit(course, assignment, "untouched", without_demonstrations(student_version))
        for k, mistakes in graded_mistake_submissions(assignment):
            # the exercises the mistakes' grading needs are answered right; the others are left as released
            needed = set().union(*(depends_on(assignment, e, m) for e, m in mistakes.items()))
            answers = {e: reference[e] for e in needed} | {e: mistake_source(m, e) for e, m in mistakes.items()}
            submit(course, assignment, f"mistakes_{k}", without_demonstrations(fill(student_version, answers)))
            expected[(assignment, f"mistakes_{k}")] = mistakes
    if ASSIGNMENTS[0] not in assignments:
        return expected
    # A correct answer whose library prints a warning to stderr keeps its points.
    first = ASSIGNMENTS[0]
    exercise, answer = next(iter(reference_answers(first).items()))
    noisy = answer.replace(":\n", f":\n    {NOISY}\n", 1)
    submit(course, first, "warns", fill(released(course, first), dict(reference_answers(first), **{exercise: noisy})))
    return expected


#: The notebooks graded in one run, on one pytest worker: two halves of about the same CPU time (measured per
#: notebook: 09 41 s, 08 30, 10 29, 07 22, 02 19, 05 and 11 19, 03 17, 04, 06 and 01 15); a notebook not named
#: here (a new one) is graded with the second.
FIRST_HALF = ("09_decoding_and_training", "07_complexity", "11_serving", "03_masking", "04_numerical_stability")
HALVES = (tuple(a for a in ASSIGNMENTS[::-1] if a in FIRST_HALF), tuple(a for a in ASSIGNMENTS[::-1] if a not in FIRST_HALF))
_graded: dict[tuple[str, ...], tuple] = {}


def graded_half(half: tuple[str, ...], folder) -> tuple:
    """The course of ``half``'s class, graded once in this process (the first test of the half grades it), and the
    mistakes each submission holds; or the failure of its grading, for every test of the half to report."""
    if half not in _graded:
        try:
            course = make_course(folder, list(half))
            expected = submit_the_class(course, list(half))
            summary = grade.autograde(list(half), grading_settings(course, {"Grading.workers": 2}), progress=False)
            assert not summary.failed, str(summary)
            run = feedback.feedback(list(half), root=course)
            assert not run.broken, run.broken
            _graded[half] = (course, expected, None)
        except Exception as error:  # noqa: BLE001 - each test of the half fails with it
            _graded[half] = (None, None, error)
    return _graded[half]


@pytest.mark.slow
@pytest.mark.parametrize("assignment", [pytest.param(a, marks=pytest.mark.xdist_group(f"class-{k}"))
                                        for k, half in enumerate(HALVES) for a in half])  # see tests/conftest.py
def test_a_class_of_every_notebook(tmp_path_factory, assignment):
    half = next(h for h in HALVES if assignment in h)
    course, expected_of_half, error = graded_half(half, tmp_path_factory.mktemp(f"class-{HALVES.index(half)}"))
    if error is not None:
        raise error
    expected = {key: mistakes for key, mistakes in expected_of_half.items() if key[0] == assignment}
    problems: list[str] = []

    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        ref = gb.find_submission(assignment, "reference")
        lost = [(g.name, g.score) for g in ref.notebooks[0].grades if g.score < g.max_score]
        if not ref.max_score > 0 or lost:
            problems.append(f"{assignment} reference: {ref.score}/{ref.max_score}, lost {lost}")
        if gb.find_submission(assignment, "untouched").score != 0:
            problems.append(f"{assignment} untouched release scores {gb.find_submission(assignment, 'untouched').score}")
        if assignment == ASSIGNMENTS[0]:
            warns = gb.find_submission(ASSIGNMENTS[0], "warns")
            if warns.score != warns.max_score:
                problems.append(f"a warning on stderr cost points: {warns.score}/{warns.max_score}")
        for (assignment, student), mistakes in expected.items():
            grades = gb.find_submission_notebook(assignment, assignment, student).grades
            scores, maxima = {g.name: g.score for g in grades}, {g.name: g.max_score for g in grades}
            cells = graded_cells(course, student, assignment)
            page = feedback_text(course, student, assignment)
            for exercise, mistake in mistakes.items():
                where = f"{assignment} {student} {exercise}: {mistake.name!r}"
                cell = f"test_{exercise}_hidden"
                if scores[cell] >= maxima[cell]:  # the cases it gets right may earn their share, never all
                    problems.append(f"{where} earned all {scores[cell]} points of {cell}")
                if mistake.name not in printed(cells[cell]):
                    problems.append(f"{where} is not named by {cell}: {printed(cells[cell])[-600:]}")
                problems += judged_problems(where, cells[cell], mistake)
                if mistake.name not in page:
                    problems.append(f"{where} is not named by the feedback page")
            if "BEGIN HIDDEN TESTS" in page or "autograder.hidden" in page:
                problems.append(f"{assignment} {student}: the feedback page shows hidden tests")

    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_mistake_goes_to_exactly_one_submission(assignment):
    submissions = mistake_submissions(assignment)
    placed = Counter((exercise, id(mistake)) for chosen in submissions for exercise, mistake in chosen.items())
    listed = Counter((exercise, id(mistake)) for exercise, mistakes in catalogue(assignment).items() for mistake in mistakes)
    assert placed == listed
    assert len(submissions) < sum(map(len, catalogue(assignment).values()))  # several mistakes per submission
    graded = graded_mistake_submissions(assignment)
    assert set().union(*(set(chosen) for _, chosen in graded)) == set(catalogue(assignment))
    assert all(submissions[k] is chosen for k, chosen in graded)
    for chosen in submissions:
        for exercise, mistake in chosen.items():
            assert not depends_on(assignment, exercise, mistake) & set(chosen), (exercise, mistake.name)


def calls_split_heads(x):
    return split_heads(x, 2)  # noqa: F821 (the student's own split_heads, defined in the notebook)


def test_what_a_mistake_depends_on():
    """The check of decode_step runs the student's own KVCache, that of generate the notebook's TinyDecoder (built on
    the student's DecoderBlock, decode_step and KVCache); a mistake that calls another exercise needs it right."""
    decoding = "09_decoding_and_training"
    assert all(depends_on(decoding, "decode_step", m) == {"KVCache"} for m in catalogue(decoding)["decode_step"])
    assert all(depends_on(decoding, "generate", m) == {"DecoderBlock", "decode_step", "KVCache"}
               for m in catalogue(decoding)["generate"])
    assert all(depends_on(decoding, "alibi_bias", m) == set() for m in catalogue(decoding)["alibi_bias"])
    assert depends_on("05_multi_head", "merge_heads", types.SimpleNamespace(fn=calls_split_heads)) == {"split_heads"}
    together = [set(chosen) for chosen in mistake_submissions(decoding)]
    assert not any({"KVCache", "decode_step"} <= names or {"generate", "DecoderBlock"} <= names for names in together)


def test_a_submission_without_demonstrations_keeps_what_graded_cells_need():
    """09's check of generate is handed the notebook's TinyDecoder; its training demonstration is needed by nothing."""
    decoding = "09_decoding_and_training"
    full = fill(nbformat.read(ROOT / "notebooks" / f"{decoding}.ipynb", as_version=4), reference_answers(decoding))
    short = without_demonstrations(full)
    sources = [c.source for c in short.cells if c.cell_type == "code"]
    graded = [c.source for c in full.cells if nbgrader_meta(c)]
    assert [s for s in sources if s in graded] == graded
    assert any(s.startswith("class TinyDecoder") for s in sources) and any("import torch" in s for s in sources)
    assert not any("training_seconds" in s for s in sources)
    assert len(sources) < len([c for c in full.cells if c.cell_type == "code"]) - 10
    magic = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%matplotlib inline\nimport torch"),
                                            nbformat.v4.new_code_cell("print(1)")])
    magic.cells.append(nbformat.v4.new_code_cell("torch.ones(1)", metadata={"nbgrader": {"grade": True}}))
    assert [c.source for c in without_demonstrations(magic).cells] == ["%matplotlib inline\nimport torch", "torch.ones(1)"]
