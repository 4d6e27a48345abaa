"""Run a test cell in the grader's process, with the student's objects as proxies into the kernel.

nbgrader runs a test cell in the kernel that ran the student's cells, so the checks, their
references and their comparisons share a process with the student's code, which can reach
them. When a notebook is graded, :class:`~autograder.engine.execute.ResilientExecute`
runs each test cell here instead: the cell's source (the instructor's, restored from the
gradebook) is executed in the grader's process, and every name it reads that the cell does
not define (``soft_lookup`` in ``check_soft_lookup(soft_lookup)``) is looked up in the
student's kernel and becomes a :class:`~autograder.grader.remote.Remote` (or plain data). The check
then runs here; only the student's functions run in the kernel.

The cell's outputs are what the check printed and, interleaved in order, what the student's
code printed while the check ran it; a failing check is an error output with its message
and no traceback (a traceback would show the checks' source). nbgrader scores the cell from
these outputs as it would from the kernel's. When the failure names catalogued mistakes
(:class:`~autograder.grader.diagnosis.MistakeFound`), a record of their ids comes before the error: a
``display_data`` output with nothing to show, whose metadata (:data:`MISTAKES_KEY`) the class
report reads (:func:`named_mistakes`). Only this process writes it, so a student's code cannot
forge it; a test cell run in the kernel (``checks_in_grader`` off) has no record.
"""

from __future__ import annotations

import builtins
import io
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

from nbformat import NotebookNode
from nbformat.v4 import new_output

from ..grader import cases, remote
from ..grader.cases import CasesFailed, CheckRecord
from ..grader.diagnosis import Mistake, MistakeFound
from ..grader.remote import Channel, Interrupted
from ..shared.errors import CheckFailed, shown_name


class _KernelNames(dict):
    """A test cell's namespace: a name the cell does not define is looked up in the student's kernel."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self.channel = channel

    def __missing__(self, name: str):
        if hasattr(builtins, name):
            raise KeyError(name)  # falls through to the built-ins, as in a kernel
        found, value = remote.lookup(self.channel, name)
        if not found:
            raise KeyError(name)  # becomes "NameError: name ... is not defined"
        self[name] = value
        return value


class _Stream(io.TextIOBase):
    """Where the check's prints go: the shared list of the cell's streams, in order."""

    def __init__(self, name: str, streams: list[tuple[str, str]]) -> None:
        self.name, self.streams = name, streams

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.streams.append((self.name, str(text)))
        return len(text)


def error_output(ename: str, message: str) -> NotebookNode:
    """An error output showing ``ename: message`` without a traceback."""
    return new_output("error", ename=ename, evalue=message, traceback=[f"\x1b[0;31m{ename}\x1b[0m: {message}"])


#: The metadata key of the record of the catalogued mistakes a failing check named.
MISTAKES_KEY = "autograder_mistakes"
#: The name under which a record stands among a cell's streams (not a stream: an output of its own).
RECORD = "record"


def mistakes_record(mistakes: Sequence[Mistake]) -> NotebookNode:
    """An output that shows nothing and records ``mistakes`` (id, name, section) for the class report; two
    mistakes made at once are recorded as the two catalogued mistakes they are."""
    named = [{"id": m.id, "name": m.name, "section": m.section} for pair in mistakes for m in (pair.parts or (pair,))]
    return new_output("display_data", data={"text/plain": ""}, metadata={MISTAKES_KEY: named})


#: The metadata key of the record of a check's cases (names, weights, results; see :func:`case_record`).
CASES_KEY = "autograder_cases"


def case_record(cell) -> dict | None:
    """The record of the cases the judged test ``cell``'s check ran, or None (a check without cases).

    A dict with ``exercise``, ``points``, ``score``, ``all_or_nothing``, ``stopped`` (why the whole
    cell scores zero, or "") and ``cases``: a list of dicts with ``name``, ``weight``, ``passed``,
    ``message`` and ``mistakes`` (catalogue ids).
    """
    for output in cell.get("outputs", []):
        if output.get("output_type") == "display_data":
            record = output.get("metadata", {}).get(CASES_KEY)
            if isinstance(record, dict) and isinstance(record.get("cases"), list):
                return record
    return None


def named_mistakes(cell) -> list[dict]:
    """The catalogued mistakes the judged test ``cell`` named: dicts with ``id``, ``name`` and ``section``."""
    found = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "display_data":
            record = output.get("metadata", {}).get(MISTAKES_KEY, [])
            found += [m for m in record if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]
    return found


def stream_outputs(streams: list[tuple[str, Any]]) -> list[NotebookNode]:
    """Consecutive writes to the same stream, joined into one output each; records (:data:`RECORD`) as they are."""
    outputs: list[NotebookNode] = []
    for name, text in streams:
        if name == RECORD:
            outputs.append(text)
        elif outputs and outputs[-1].get("name") == name:
            outputs[-1].text += text
        elif text:
            outputs.append(new_output("stream", name=name, text=text))
    return outputs


def run_test_cell(source: str, channel: Channel, streams: list[tuple[str, str]]
                  ) -> tuple[NotebookNode | None, list[CheckRecord]]:
    """Execute a test cell's ``source`` here against the kernel behind ``channel``.

    What the check prints is appended to ``streams`` (the channel appends what the
    student's code prints), and the record of the mistakes a failing check named;
    returns the error output of a failing check (or None), and the records of the cases the
    cell's hidden checks ran (:mod:`autograder.grader.cases`; :func:`scored_outputs` makes them a score).
    Raises :class:`~autograder.grader.remote.Interrupted` when the kernel hangs or dies.
    """
    code = compile(source, "<test cell>", "exec")
    namespace = _KernelNames(channel)
    with redirect_stdout(_Stream("stdout", streams)), redirect_stderr(_Stream("stderr", streams)), \
            cases.judging() as records:
        try:
            remote.reset(channel)
            exec(code, {"__builtins__": builtins, "__name__": "__main__"}, namespace)  # noqa: S102 - the instructor's test cell
        except Interrupted:
            raise
        except Exception as error:  # noqa: BLE001 - any failure of the check fails the cell, with its message
            if isinstance(error, MistakeFound) and error.mistakes:
                streams.append((RECORD, mistakes_record(error.mistakes)))
            return error_output(shown_name(error), _first_failure(error)), records
    return None, records


def _first_failure(error: BaseException) -> str:
    """The message of a failed cell's error: the first failed case's, when its cases failed (all are listed above)."""
    if isinstance(error, CasesFailed):
        failed = error.record.failed
        return f"{failed[0].name}: {failed[0].message}" if failed else str(error)
    return str(error)


#: The characters of a case's message a record keeps.
MESSAGE_CHARACTERS = 2000


def _short(message: str) -> str:
    return message if len(message) <= MESSAGE_CHARACTERS else message[:MESSAGE_CHARACTERS] + " [cut]"


def _points(value: float) -> str:
    return f"{value:g} point" + ("" if value == 1 else "s")


def scored_outputs(records: list[CheckRecord], failure: NotebookNode | None, points: float,
                   all_or_nothing: bool) -> list[NotebookNode]:
    """The outputs that score a judged test cell from its checks' cases, through nbgrader's partial credit.

    The record of every case (:data:`CASES_KEY`, shown as a list), then: nothing when every case
    passed (full points), the score as the cell's result when some passed, ``failure`` when none
    did or the check stopped (zero). A cell whose checks ran no case gives ``failure`` alone, as before.
    """
    results = [r for record in records for r in record.results]
    if not results:
        return [failure] if failure is not None else []
    stopped = next((record.stopped for record in records if record.stopped), "")
    if not stopped and failure is not None and not any(not r.passed for r in results):
        stopped = failure.evalue  # the cell failed outside its checks' cases
    total = sum(r.weight for r in results)
    earned = sum(r.weight for r in results if r.passed)
    fraction = 0.0 if stopped or total <= 0 else earned / total
    if all_or_nothing and fraction < 1:
        fraction = 0.0
    score = round(points * fraction, 2)
    exercise = " and ".join(dict.fromkeys(record.exercise for record in records))
    lines = [f"Cases of {exercise}: {score:g} of {_points(points)}"
             + (" (this cell is scored all or nothing)" if all_or_nothing else "")]
    seen: dict[str, int] = {}
    for r in results:  # two cases of one name are told apart by a number
        seen[r.name] = seen.get(r.name, 0) + 1
        if seen[r.name] > 1:
            r.name = f"{r.name} #{seen[r.name]}"
    for r in results:
        share = points * r.weight / total if total > 0 else 0.0
        lines.append(f"  {'passed' if r.passed else 'FAILED'}  {r.name} (worth {share:.2g})"
                     + ("" if r.passed else ": " + _short(r.message).replace("\n", "\n      ")))
    if stopped:
        stopped = _short(stopped)
        lines.append(f"  The whole cell scores 0: {stopped}")
    record = {  # each message is cut short: what a student's error says may be long
        "exercise": exercise, "points": points, "score": score, "all_or_nothing": all_or_nothing, "stopped": stopped,
        "cases": [{"name": r.name, "weight": r.weight, "passed": r.passed, "message": _short(r.message),
                   "mistakes": [m.id for m in r.mistakes if getattr(m, "id", "")]} for r in results],
    }
    outputs = [new_output("display_data", data={"text/plain": "\n".join(lines)}, metadata={CASES_KEY: record})]
    if score >= points:
        return outputs
    if score > 0:
        return outputs + [new_output("execute_result", data={"text/plain": repr(float(score))}, execution_count=None)]
    if failure is None:
        failure = error_output(CheckFailed.__name__, f"None of the cases of {exercise} passed.")
    return outputs + [failure]
