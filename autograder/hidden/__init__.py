"""Hidden checks and the mistake catalogue, one module per notebook (instructor-only).

Never shipped to students: the mistakes are near-solutions. Each module defines ``check_<exercise>(fn)``
for the hidden test cells, decorated with :func:`hidden`, and ``MISTAKES``, read from its data file
``mistakes/<module>.toml`` (:func:`~autograder.grader.diagnosis.read_mistakes`): per exercise, its
:class:`~autograder.grader.diagnosis.Mistake` objects, each with a stable ``id``, each a declared variation of a
reference (:mod:`autograder.grader.variation`) or, for another algorithm, a function of the module's own. The
test suite feeds every mistake to its check and expects the mistake's name in the message.

A module takes its references from its notebook's :mod:`autograder.references` module (the one its visible
checks use) and never imports the visible checks. It keeps what is secret: its inputs, the catalogue, and
the references that are an exercise's solution. A mistake's code is self-contained (torch, math, ``F`` and
``nn`` only, nothing of this package): the end-to-end tests paste its source into a notebook as a student's answer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..grader.cases import checking
from ..shared.errors import CheckFailed, fail, install_notebook_display

install_notebook_display()


def hidden(check: Callable[..., Any]) -> Callable[..., Any]:
    """Make a hidden check of ``check_<exercise>``: a list of cases, and any unexpected error a plain message.

    Judged by the grader, its cases are recorded (:mod:`autograder.grader.cases`) and the test cell earns
    the share of those it passes; elsewhere the first failing case stops it. It prints that the
    exercise passes only when every case passed. A traceback would print lines of this
    instructor-only source into the student's feedback; the student reads the error's type and
    message instead.
    """
    exercise = check.__name__.removeprefix("check_")

    @functools.wraps(check)
    def run(*args: Any, **kwargs: Any) -> Any:
        with checking(exercise):
            try:
                result = check(*args, **kwargs)
            except CheckFailed:
                raise
            except Exception as error:  # noqa: BLE001 - nothing of the hidden source may leak
                fail(f"The hidden check {check.__name__} could not finish: {type(error).__name__}: {error}")
        print(f"{exercise} passes the hidden checks.")
        return result

    return run
