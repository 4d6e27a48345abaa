"""A hidden check as a list of named cases, each earning its share of the test cell's points.

A case is one input of :func:`~autograder.grader.verify.verify` (and of ``verify_each``,
``verify_number``), one :func:`~autograder.grader.student.expect_error`, or one block a check marks
``with case("name"):``. Its share is its ``weight`` over the weights of all the check's cases
(even shares by default).

The grader's judge (:mod:`autograder.engine.judge`) runs a test cell under :func:`judging`:
each hidden check (made by the hidden checks' decorator, ``hidden``) then runs under :func:`checking`, a failing
case is recorded with its message and the check goes on with the next one, and the judge turns
the records into the cell's partial score (nbgrader's own mechanism: a number as the cell's
result). Without :func:`judging` (a check run in a kernel, a test), nothing is recorded: the
first failing case stops the check with its message, all or nothing, as nbgrader scores it.

What earns no share, and why:

- **a whole-cell failure** (:class:`~autograder.shared.errors.WholeCellFailure`: a forbidden call, an
  unwritten exercise) in any case: an answer that makes it has not solved the exercise on any
  input, so the check stops and the cell scores zero;
- **a failure outside every case** (the check's own code between its cases, which may need what
  an earlier case built): the check stops there, the cases it did not reach cannot be counted,
  and the cell scores zero; a check keeps every call of the student's code inside a case;
- **a kernel that dies**: the judge's error, zero for the cell.

A call that runs past the time the cell has left (an endless loop on one input) fails its case, and
every case after it fails at once the same way; the cases before it keep their share.

What it does not protect: a share is earned by passing a case's input, so an answer that
recognises the hidden inputs would earn their shares; the inputs are hidden, as they are for
all-or-nothing scoring.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import TracebackType

from ..shared.errors import CheckFailed, OutOfTime, WholeCellFailure, fail


@dataclass
class CaseResult:
    """One case of a check: its name, its weight, whether it passed, and why not."""

    name: str
    weight: float
    passed: bool
    message: str = ""
    mistakes: tuple = ()  # the catalogued mistakes (:class:`~autograder.grader.diagnosis.Mistake`) its failure named


@dataclass
class CheckRecord:
    """The cases one hidden check ran, and why it stopped early (``stopped``: the whole cell scores zero)."""

    exercise: str
    results: list[CaseResult] = field(default_factory=list)
    stopped: str = ""
    timed_out: bool = False  # a call ran past the cell's time (the kernel must be brought back before the next cell)
    pairs_tried: bool = False  # a case's diagnosis tried pairs of mistakes (once a check: see first_pair_search)

    @property
    def failed(self) -> list[CaseResult]:
        """The cases that failed."""
        return [r for r in self.results if not r.passed]

    def fraction(self) -> float:
        """The share of the weights the passed cases hold (0 when the check stopped or ran no case)."""
        total = sum(r.weight for r in self.results)
        if self.stopped or total <= 0:
            return 0.0
        return sum(r.weight for r in self.results if r.passed) / total


#: A case whose call of the student's code ran past the time the test cell had left, or came after one that did.
OUT_OF_TIME = ("This case did not finish: the time this test cell has was spent while it ran (an endless loop, or a "
               "computation much slower than the exercise needs). The cases before it keep their share.")


class CasesFailed(CheckFailed):
    """Some cases of a check failed: ``record`` holds every case; the message lists the failed ones."""

    def __init__(self, record: CheckRecord) -> None:
        self.record = record
        self.mistakes = tuple(m for r in record.failed for m in r.mistakes)
        failed = record.failed
        lines = [f"{record.exercise}: {len(failed)} of {len(record.results)} hidden cases failed."]
        lines += [f"- {r.name}: {r.message}" for r in failed]
        super().__init__("\n".join(lines))


_RECORDS: ContextVar[list[CheckRecord] | None] = ContextVar("autograder_case_records", default=None)
_OPEN: ContextVar[CheckRecord | None] = ContextVar("autograder_open_check", default=None)
_IN_CASE: ContextVar[bool] = ContextVar("autograder_in_case", default=False)


@contextmanager
def judging() -> Iterator[list[CheckRecord]]:
    """Record the cases of every hidden check run inside (the judge's test cell); yields the records."""
    records: list[CheckRecord] = []
    token = _RECORDS.set(records)
    try:
        yield records
    finally:
        _RECORDS.reset(token)


@contextmanager
def checking(exercise: str) -> Iterator[CheckRecord | None]:
    """Run a hidden check's body; under :func:`judging`, record its cases and raise :class:`CasesFailed` at the end
    when any failed. Yields the record (None when nothing is recorded)."""
    records = _RECORDS.get()
    if records is None or _OPEN.get() is not None:  # not judged, or a check run by another check
        yield None
        return
    record = CheckRecord(exercise)
    records.append(record)
    token = _OPEN.set(record)
    try:
        yield record
    except CheckFailed as failure:
        record.stopped = str(failure)
        raise
    finally:
        _OPEN.reset(token)
    if record.failed:
        raise CasesFailed(record)


def needs(built: object, by: str) -> None:
    """Fail the case being run, saying it could not run, when ``built`` (made by the earlier case ``by``) is None.

    A case that uses what an earlier case built (a module, a filled cache) cannot run when that case
    raised before building it: it is counted as failed, and the message says why.
    """
    if built is None:
        fail(f"This case could not run: it needs what the case \"{by}\" builds, and that case failed.")


def recording() -> bool:
    """Whether a failing case is recorded and the check goes on (a check judged under :func:`judging`)."""
    return _OPEN.get() is not None and not _IN_CASE.get()


def first_pair_search() -> bool:
    """Whether a diagnosis may try pairs of mistakes now: once a judged check (the first of its failing cases that
    no single mistake explains), always elsewhere (the first failing case stops the check there). A wrong answer
    that fails every case pays for the pairs once, not once a case."""
    record = _OPEN.get()
    if record is None:
        return True
    tried, record.pairs_tried = record.pairs_tried, True
    return not tried


class case:  # noqa: N801 - used as a statement, ``with case("causal, n != m"):``
    """A named case of a hidden check, worth ``weight`` shares of the cell's points.

    Recorded when the check is judged (:func:`recording`): a failure inside is kept with its
    message and swallowed, so the check goes on. Otherwise, and inside another case, it changes
    nothing: a failure stops the check. A :class:`~autograder.shared.errors.WholeCellFailure` always stops it.
    """

    def __init__(self, name: str, weight: float = 1.0) -> None:
        self.name, self.weight = name, float(weight)
        self._token = None

    def __enter__(self) -> case:
        if recording():
            self._token = _IN_CASE.set(True)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> bool:
        if self._token is None:
            return False
        _IN_CASE.reset(self._token)
        self._token = None
        record = _OPEN.get()
        if record is None:
            return False
        if error is None:
            record.results.append(CaseResult(self.name, self.weight, True))
            return False
        if isinstance(error, OutOfTime):  # the cases after it fail the same way at once: the time is spent
            record.timed_out = True
            record.results.append(CaseResult(self.name, self.weight, False, OUT_OF_TIME))
            return True
        if isinstance(error, WholeCellFailure) or not isinstance(error, Exception):
            return False  # the whole cell fails; a kernel that died or a stopped grader stops everything
        message = (str(error) if isinstance(error, CheckFailed) else
                   f"The hidden check could not finish this case: {type(error).__name__}: {error}")
        record.results.append(CaseResult(self.name, self.weight, False, message, tuple(getattr(error, "mistakes", ()))))
        return True
