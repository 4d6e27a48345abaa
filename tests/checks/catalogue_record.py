"""What every catalogued mistake gives, recorded once, so that a rewrite of the catalogue is compared with it.

For every mistake of every notebook: the message the hidden check gives its pasted source (judged
through the proxies grading uses, as :mod:`tests.checks.test_catalogue` does), and the message the
visible check gives. ``tests/fixtures/catalogue_record.json`` holds the record of the catalogue as it
was; ``test_catalogue_record.py`` compares the catalogue of the working tree with it. A change that
is meant to change what a mistake gives (a new case, a reworded message) records the catalogue again::

    .venv/bin/python -m tests.checks.catalogue_record

and the diff of the JSON file shows, mistake by mistake, what changed.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter

import torch

from autograder.course.repository import assignments
from autograder.grader.local_channel import LocalChannel
from autograder.grader.remote import lookup
from autograder.shared.errors import CheckFailed

from ..course_copy import catalogue
from ..notebook_code import ROOT, cell_arguments
from .test_catalogue import module, partners, pasted, solution

RECORD = ROOT / "tests" / "fixtures" / "catalogue_record.json"


def _message(check, arguments) -> str:
    """What ``check(*arguments)`` says: the failure's type and message, or that it passed."""
    torch.manual_seed(0)  # a mistake that ignores its generator draws from the global one: the same numbers each time
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check(*arguments)
    except CheckFailed as failure:
        return f"{type(failure).__name__}: {failure}"
    except Exception as error:  # noqa: BLE001 - recorded as it is, so that a change shows
        return f"not a check's failure: {type(error).__name__}: {error}"
    return "passes"


def record(assignment: str) -> dict[str, dict[str, str]]:
    """``<mistake id>#<k>`` -> what the hidden and the visible check say of it (``k``: its place among that id's)."""
    found: dict[str, dict[str, str]] = {}
    for exercise, listed in catalogue(assignment).items():
        seen: Counter[str] = Counter()
        for mistake in listed:
            key = f"{mistake.id}#{seen[mistake.id]}"
            seen[mistake.id] += 1
            answer = pasted(mistake, exercise)
            channel = LocalChannel(dict(vars(solution(assignment)), **{exercise: answer}))
            hidden_arguments = [lookup(channel, name)[1] for name in cell_arguments(assignment, True)[exercise]]
            visible_arguments = [answer, *partners(assignment, exercise, False)]
            found[key] = {
                "name": mistake.name,
                "hidden": _message(getattr(module(assignment), f"check_{exercise}"), hidden_arguments),
                "visible": _message(getattr(module(assignment, "checks"), f"check_{exercise}"), visible_arguments),
            }
    return found


def main() -> None:
    RECORD.write_text(json.dumps({a: record(a) for a in assignments()}, indent=1, sort_keys=True) + "\n")
    print(f"recorded {RECORD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
