"""What the judged test cells of a graded notebook say, case by case: for the feedback page, Gradescope and the report.

A hidden check is a list of named cases; the grader writes the record of the cases it ran into the
judged test cell (:func:`autograder.engine.judge.case_record`: only the grader's process writes it,
so a student's code cannot forge it). :func:`judged_cells` reads every graded test cell of a notebook
as its cases: from that record, never from the words of an output (a student's code can print
anything). A test cell without a record (a visible check, a check run in the kernel) is one case
named after the cell: passed, or failed with its error's message, as nbgrader scores it (an error
output or a write to stderr: no points).

Scores are not read here: the gradebook holds them (a grader may have changed one by hand).
Every text is made inert (:func:`~autograder.engine.notes.inert_text`: a name is one line, a message
keeps its lines, no control character is left to steer a terminal) but not escaped: each reader
escapes for what it writes (HTML, Gradescope's text). A mistake is named by looking its id up in the
grader's catalogue; where this installation has no catalogue, the id's last part stands for its name.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..engine.judge import case_record, named_mistakes
from ..engine.notes import inert_text
from ..grader.diagnosis import Mistake, by_id, catalogue

#: The one case of a test cell without a record, named after the cell.
VISIBLE_CASE = "visible checks"
HIDDEN_CASE = "hidden checks"
#: What a catalogue id is made of (``<notebook>/<exercise>/<slug>``): only such parts are looked up.
_ID_PART = re.compile(r"[A-Za-z0-9_]+")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


@dataclass(frozen=True)
class Case:
    """One case of a check: its name, whether it passed, and for a failure its message and the mistakes it fits."""

    name: str
    passed: bool
    message: str = ""
    mistakes: tuple[str, ...] = ()  # the names of the catalogued mistakes the failure fits
    mistake_ids: tuple[str, ...] = ()  # and their catalogue ids
    points: float | None = None  # its share of the cell's points (None: all or nothing, or no record)


@dataclass(frozen=True)
class JudgedCell:
    """A graded test cell of a notebook, read as its cases."""

    grade_id: str
    exercise: str
    hidden: bool
    cases: tuple[Case, ...]
    stopped: str = ""  # why the whole cell scores 0 though cases passed (a forbidden call, ...)
    all_or_nothing: bool = False
    recorded: bool = False  # the cases are the grader's record (else: the cell as one case)

    @property
    def failed(self) -> tuple[Case, ...]:
        return tuple(case for case in self.cases if not case.passed)


def exercise_of(grade_id: str) -> str:
    """``test_foo_hidden`` and ``test_foo`` -> ``foo`` (a test cell's exercise, by the course's naming)."""
    return grade_id.removeprefix("test_").removesuffix("_hidden")


def failure_text(cell, stderr: bool = True) -> str:
    """The error a test cell printed (its ename and message, and with ``stderr`` what went there), or '' when it
    passed."""
    texts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            texts.append(f"{output.get('ename', '')}: {output.get('evalue', '')}")
        elif output.get("output_type") == "stream" and output.get("name") == "stderr" and stderr:
            texts.append(str(output.get("text", "")))
    return _ANSI.sub("", "\n".join(texts)).strip()


@functools.cache
def catalogued(ident: str) -> Mistake | None:
    """The mistake whose catalogue id is ``ident`` (``<notebook>/<exercise>/<slug>``), where this installation has it."""
    parts = str(ident).split("/")
    if len(parts) != 3 or not all(_ID_PART.fullmatch(p) for p in parts[:2]):
        return None
    try:
        return by_id(catalogue(parts[0], parts[1]), ident)
    except KeyError:
        return None


def mistake_name(ident: str, named: dict[str, str] | None = None) -> str:
    """The name of the catalogued mistake ``ident``: from ``named`` (id -> name), the catalogue, or the id's last part."""
    ident = str(ident)
    found = catalogued(ident)
    name = (named or {}).get(ident) or (found.name if found else ident.rsplit("/", 1)[-1].replace("-", " "))
    return inert_text(name)


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _recorded_cases(record: dict, named: dict[str, str]) -> tuple[Case, ...]:
    entries = [c for c in record["cases"] if isinstance(c, dict)]
    weights = [max(_number(c.get("weight")) or 0.0, 0.0) for c in entries]
    points, total = _number(record.get("points")), sum(weights)
    shares = not record.get("all_or_nothing") and points is not None and total > 0
    cases = []
    for entry, weight in zip(entries, weights):
        passed = entry.get("passed") is True
        listed = entry.get("mistakes") if isinstance(entry.get("mistakes"), list) and not passed else []
        mistakes = tuple(dict.fromkeys(str(m) for m in listed if isinstance(m, str) and m))
        cases.append(Case(
            name=inert_text(entry.get("name") or "") or "(a case without a name)",
            passed=passed,
            message="" if passed else inert_text(entry.get("message") or "", lines=True).strip(),
            mistakes=tuple(mistake_name(m, named) for m in mistakes), mistake_ids=mistakes,
            points=points * weight / total if shares else None,
        ))
    return tuple(cases)


def read_judged_cell(cell) -> JudgedCell:
    """The graded test ``cell`` as its cases (see the module's docstring)."""
    grade_id = str(cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", ""))
    hidden = grade_id.endswith("_hidden")
    record = case_record(cell)
    if record is None:
        error = inert_text(failure_text(cell), lines=True)
        case = Case(HIDDEN_CASE if hidden else VISIBLE_CASE, passed=not error, message=error)
        return JudgedCell(grade_id, exercise_of(grade_id), hidden, (case,))
    named = {m["id"]: str(m.get("name", "")) for m in named_mistakes(cell)}
    # Why the cell stopped, as its error says it (the grader's: "NotImplementedError: ..."), else as the record does.
    stopped = (failure_text(cell, stderr=False) or str(record["stopped"])) if record.get("stopped") else ""
    return JudgedCell(grade_id, exercise_of(grade_id), hidden, _recorded_cases(record, named),
                    stopped=inert_text(stopped, lines=True).strip(),
                    all_or_nothing=bool(record.get("all_or_nothing")), recorded=True)


def is_test_cell(cell) -> bool:
    """A graded code cell that is not an answer: a test cell (nbgrader's ``grade`` without ``solution``)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return (isinstance(meta, dict) and bool(meta.get("grade")) and not meta.get("solution")
            and cell.get("cell_type") == "code" and bool(meta.get("grade_id")))


def judged_cells(notebook) -> list[JudgedCell]:
    """Every graded test cell of ``notebook`` (a graded notebook), in order, as its cases."""
    return [read_judged_cell(cell) for cell in notebook.get("cells", []) if is_test_cell(cell)]


#: How far the lines of a case after its first are indented (under its name).
INDENT = " " * 8


def case_line(case: Case) -> str:
    """One case as text: ``passed  name``, or ``FAILED  name: message``, the message's further lines and the
    mistakes it fits indented under it."""
    if case.passed:
        return f"passed  {case.name}"
    line = f"FAILED  {case.name}" + (f": {case.message}" if case.message else "")
    if case.mistakes:
        line += "\n" + ("The mistake: " if len(case.mistakes) == 1 else "The mistakes: ") + ", ".join(case.mistakes)
    return line.replace("\n", "\n" + INDENT)
