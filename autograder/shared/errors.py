"""The one exception a failing check raises, and how a notebook shows it.

A check's message is written for the student. In a notebook it is shown without a
Python traceback: a traceback would point into the autograder's source (which, for
hidden checks, must stay hidden) and would bury the message under frames that do not
help. The cell still ends in an error, so nbgrader still gives it zero points. Its subclasses
(a mismatch, a forbidden call, a named mistake) carry data for the checks and the grader; the
student reads every one as a ``CheckFailed``.
"""

from __future__ import annotations

from typing import NoReturn


class CheckFailed(AssertionError):
    """A check found something wrong; ``str(error)`` is the message for the student."""


class WholeCellFailure(CheckFailed):
    """A failure that costs the whole test cell its points, whatever cases passed (:mod:`autograder.grader.cases`).

    A forbidden call and an unwritten exercise are not wrong answers to one input: an answer that
    makes them has not solved the exercise at all, on any input.
    """


class NotWritten(WholeCellFailure):
    """The exercise still raises ``NotImplementedError``."""


class OutOfTime(BaseException):
    """A call of the student's code ran past the time its test cell had left (a ``BaseException``: no check
    may swallow it; a case of a judged check records it, :mod:`autograder.grader.cases`)."""


def shown_name(error: BaseException) -> str:
    """The error's name as a notebook shows it: ``CheckFailed`` for every failed check, else its type's name."""
    return CheckFailed.__name__ if isinstance(error, CheckFailed) else type(error).__name__


def fail(message: str) -> NoReturn:
    """Stop the check with ``message``, shown to the student as it is."""
    raise CheckFailed(message)


def _show_without_traceback(shell, etype, value, tb, tb_offset=None):
    # ``_showtraceback`` is how ipykernel publishes an error output; giving it a
    # one-entry traceback keeps the message and drops every frame. The output's ``ename`` is
    # the error's own type, as in the kernel's reply: nbgrader's Execute (the Validate button)
    # adds the reply's error as a second output when no output has the reply's ``ename``.
    shell._showtraceback(type(value), value, [f"\x1b[0;31m{shown_name(value)}\x1b[0m: {value}"])


def install_notebook_display() -> None:
    """Make IPython show :class:`CheckFailed` as its message alone (no-op outside IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is always there in a notebook
        return
    shell = get_ipython()
    if shell is not None and CheckFailed not in (shell.custom_exceptions or ()):
        shell.set_custom_exc((CheckFailed,), _show_without_traceback)
