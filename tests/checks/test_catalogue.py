"""Every notebook's checks and mistake catalogue, in-process (seconds, no nbgrader).

For every notebook: the reference passes its visible and hidden checks quietly; the catalogue
covers every answer cell and points to headings of the notebook; every catalogued mistake, pasted
alone into a notebook as the end-to-end test submits it, keeps the reference's interface, fails
the visible check (in lines ``nbgrader validate`` shows whole) and is named by the hidden one,
with its section, judged through the proxies grading uses (:mod:`autograder.grader.remote`). What is
specific to one notebook (its interface, the mistakes its issue asks for, its probes) is in
``test_notebook_NN_*.py``; the same mistakes through nbgrader are in ``test_grading_end_to_end.py``.
"""

from __future__ import annotations

import inspect
import re
import warnings

import nbformat
import pytest
import torch

from autograder.course.repository import assignments
from autograder.course.settings import course_config
from autograder.engine import graded_cells, source_check
from autograder.grader import cases
from autograder.grader.diagnosis import Mistake, MistakeFound
from autograder.grader.local_channel import LocalChannel
from autograder.grader.remote import lookup
from autograder.grader.variation import variant
from autograder.shared.errors import CheckFailed

from ..course_copy import catalogue, depends_on, fill, mistake_source, reference_answers, without_demonstrations
from ..notebook_code import ROOT, answer_cells, cell_arguments, nbgrader_meta, source_notebook
from .catalogue_record import message_of, recorded
from .pasted_answers import module, partners, pasted, solution

#: Mistakes a visible check cannot see, with why; the test asserts they still pass it (so the list cannot go stale).
VISIBLE_MISSES: set[tuple[str, str, str]] = set()
#: How ``nbgrader validate`` shows a failing check (nbgrader_config.py's Validator.width, its indent).
VALIDATE_WIDTH = int(course_config(ROOT).Validator.width)
VALIDATE_INDENT = "    "
def headings(assignment: str) -> set[str]:
    return {
        line.lstrip("#").strip()
        for cell in source_notebook(assignment).cells
        if cell.cell_type == "markdown"
        for line in cell.source.splitlines()
        if re.match(r"^##\s", line)
    }


def interface(obj, methods: set[str] | None = None) -> dict[str, str]:
    """The signature of a function, or of a class and of its public ``methods`` (default: those it defines)."""
    def text(fn) -> str:
        return re.sub(r"<class '(torch\.\w+)'>", r"\1", str(inspect.signature(fn)))  # dtype defaults as written

    found = {"": text(obj)}
    if inspect.isclass(obj):
        if methods is None:
            methods = {name for name, member in vars(obj).items() if not name.startswith("_")
                       and (inspect.isfunction(member) or isinstance(member, (staticmethod, classmethod)))}
            if issubclass(obj, torch.autograd.Function):
                methods.discard("backward")  # autograd passes one gradient per output of forward: it follows forward
        found |= {name: text(getattr(obj, name)) for name in methods}
    return found


def exercises():
    for assignment in assignments():
        for exercise in answer_cells(assignment):
            yield pytest.param(assignment, exercise, id=f"{assignment}-{exercise}")


def mistakes():
    for assignment in assignments():
        for exercise, listed in catalogue(assignment).items():
            for i, mistake in enumerate(listed):
                yield pytest.param(assignment, exercise, i, id=f"{assignment}-{exercise}-{i}-{mistake.name}")


@pytest.mark.parametrize(("assignment", "exercise"), list(exercises()))
def test_reference_passes_visible_and_hidden(assignment, exercise, capsys):
    answer = getattr(solution(assignment), exercise)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a check that warns would zero the test cell (stderr)
        getattr(module(assignment, "checks"), f"check_{exercise}")(answer, *partners(assignment, exercise, False))
        getattr(module(assignment), f"check_{exercise}")(answer, *partners(assignment, exercise, True))
    out = capsys.readouterr()
    # A number's visible check only says it is plausible (a tighter one would give the answer away).
    assert f"{exercise} passes the visible checks" in out.out or not callable(answer), out.out
    assert f"{exercise} passes the hidden checks" in out.out, out.out
    assert out.err == ""


def varied_references():
    """Every reference whose declared decisions make catalogued mistakes (:mod:`autograder.grader.variation`)."""
    for assignment in assignments():
        for exercise, listed in catalogue(assignment).items():
            references = {id(v.reference): v.reference for m in listed if (v := getattr(m.fn, "__variation__", None))}
            for reference in references.values():
                yield pytest.param(assignment, exercise, reference, id=f"{assignment}-{exercise}-{reference.__name__}")


@pytest.mark.parametrize(("assignment", "exercise", "reference"), list(varied_references()))
def test_a_reference_with_no_decision_changed_passes_its_hidden_check(assignment, exercise, reference, capsys):
    """The mistakes are variations of a right answer: with no decision changed, it passes (pasted, as a student's)."""
    answer = pasted(Mistake("the reference", "", "", variant(reference)), exercise)
    getattr(module(assignment), f"check_{exercise}")(answer, *partners(assignment, exercise, True))
    assert f"{exercise} passes the hidden checks" in capsys.readouterr().out


@pytest.mark.parametrize("assignment", assignments())
def test_catalogue_covers_every_answer_cell(assignment):
    """A mistake catalogue per function or class, wrong answers per number (02), nothing else."""
    hidden = module(assignment)
    answers = {name: callable(getattr(solution(assignment), name)) for name in answer_cells(assignment)}
    assert set(hidden.MISTAKES) == {name for name, is_callable in answers.items() if is_callable}
    assert set(getattr(hidden, "WRONG_ANSWERS", {})) == {name for name, is_callable in answers.items() if not is_callable}
    sections = headings(assignment)
    for listed in [*hidden.MISTAKES.values(), *getattr(hidden, "WRONG_ANSWERS", {}).values()]:
        for mistake in listed:
            assert mistake.section in sections, f"{mistake.name!r}: {mistake.section!r} is not a heading of {assignment}"


@pytest.mark.parametrize("assignment", assignments())
def test_every_exercise_has_a_visible_and_a_hidden_test_cell(assignment):
    ids = [nbgrader_meta(c).get("grade_id") for c in source_notebook(assignment).cells]
    for exercise in answer_cells(assignment):
        assert f"test_{exercise}" in ids and f"test_{exercise}_hidden" in ids, exercise


class ReadingChannel(LocalChannel):
    """A channel that reads the student's source for forbidden built-ins as the grader does, before it runs an exercise
    that forbids some (:mod:`autograder.engine.source_check`): ``sources`` are what the graded kernel would hold."""

    def __init__(self, namespace: dict, sources: list[str]) -> None:
        super().__init__(namespace)
        self.sources = sources
        self.read: dict[tuple, str | None] = {}

    def forbidden_use(self, name, rules, exercise):
        """Read once per question, as the grader reads it (``ResilientExecute.forbidden_use``): within one test cell
        the sources do not change, and a check asks before every call of the student's code."""
        key = (name, tuple(rules), exercise)
        if key not in self.read:
            self.read[key] = source_check.forbidden_use(self.sources, name, rules, exercise)
        return self.read[key]


def graded_sources(assignment: str, exercise: str, mistake) -> list[str]:
    """What the graded kernel loads before the exercise's hidden test cell, when the mistake is submitted as the
    end-to-end test submits it (the release, the right answers its grading needs, the mistake; no demonstration)."""
    release = nbformat.read(ROOT / "notebooks" / f"{assignment}.ipynb", as_version=4)
    reference = reference_answers(assignment)
    answers = {e: reference[e] for e in depends_on(assignment, exercise, mistake)}
    submission = without_demonstrations(fill(release, answers | {exercise: mistake_source(mistake, exercise)}))
    test_cell = next(i for i, c in enumerate(submission.cells) if nbgrader_meta(c).get("grade_id") == f"test_{exercise}_hidden")
    return [s.source for s in graded_cells.before(graded_cells.graded_sources(submission, release), test_cell)]


@pytest.mark.parametrize(("assignment", "exercise", "index"), list(mistakes()))
def test_mistake_fails_hidden_check_and_is_named(assignment, exercise, index):
    """Judged as grading judges it (the test cell's proxies, the source read, the cases recorded): the check goes on past
    the mistake, and a failed case names it, its section and its catalogue id; unjudged (a check run alone), the first
    failing case says the same. The end-to-end test grades a few of these submissions through nbgrader."""
    mistake = catalogue(assignment)[exercise][index]
    reference = interface(getattr(solution(assignment), exercise))
    assert interface(mistake.fn, set(reference) - {""}) == reference, mistake.fn.__name__
    check = getattr(module(assignment), f"check_{exercise}")
    answer = pasted(mistake, exercise)
    # As grading calls it: what the hidden test cell names (the exercise, the student's own KVCache...),
    # each a proxy into the student's namespace; and, where the cell passes more, the function alone.
    namespace = dict(vars(solution(assignment)), **{exercise: answer})
    channel = ReadingChannel(namespace, graded_sources(assignment, exercise, mistake))
    graded = [lookup(channel, name)[1] for name in cell_arguments(assignment, True)[exercise]]
    with cases.judging() as records, pytest.raises(CheckFailed):
        check(*graded)
    [record] = records
    if record.stopped:  # only a forbidden call stops a check: the whole cell scores zero, and the stop names it
        assert f"'{mistake.name}'" in record.stopped and mistake.section in record.stopped, record.stopped[:600]
    else:
        named = [r for r in record.failed if f"'{mistake.name}'" in r.message and mistake.section in r.message]
        assert named, [r.message[:300] for r in record.failed]
        assert any(mistake.id in {m.id for m in r.mistakes} for r in named), [[m.id for m in r.mistakes] for r in named]
    # Unjudged (a check run alone, the first failing case stops it), through proxies that do not read the source: what
    # the record holds (tests/fixtures/catalogue_record.json), which a rewrite of the catalogue must leave as it was.
    plain = LocalChannel(namespace)
    said = message_of(check, [lookup(plain, name)[1] for name in cell_arguments(assignment, True)[exercise]])
    assert f"'{mistake.name}'" in said and mistake.section in said, said
    assert said.startswith(f"{MistakeFound.__name__}: "), said
    assert recorded(assignment, exercise, index, "hidden", said)
    if len(graded) > 1:  # the function alone, where the cell passes more
        with pytest.raises(CheckFailed) as failure:
            check(answer)
        assert f"'{mistake.name}'" in str(failure.value) and mistake.section in str(failure.value), str(failure.value)


@pytest.mark.parametrize(("assignment", "exercise", "index"), list(mistakes()))
def test_mistake_fails_visible_check(assignment, exercise, index):
    mistake = catalogue(assignment)[exercise][index]
    check = getattr(module(assignment, "checks"), f"check_{exercise}")
    said = message_of(check, (pasted(mistake, exercise), *partners(assignment, exercise, False)))
    assert recorded(assignment, exercise, index, "visible", said)
    if (assignment, exercise, mistake.fn.__name__) in VISIBLE_MISSES:
        assert said == "passes", said
        return
    assert not said.startswith(("passes", "not a check's failure")), said
    # nbgrader validate cuts a line at Validator.width - 3 characters (its indent included): none is that long.
    lines = said.splitlines()
    assert not [line for line in lines if len(VALIDATE_INDENT + line) > VALIDATE_WIDTH - 3], lines

