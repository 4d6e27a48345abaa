"""What every catalogued mistake gives, recorded once, so that a rewrite of the catalogue is compared with it.

For every mistake of every notebook: the message the hidden check gives its pasted source (judged
through the proxies grading uses, as :mod:`tests.checks.test_catalogue` does), and the message the
visible check gives. ``tests/fixtures/catalogue_record.json`` holds the record of the catalogue as it
was; ``test_catalogue.py`` compares what each mistake gives now with it, as it runs the mistake's checks
(:func:`recorded`), and ``test_catalogue_record.py`` that the record lists the catalogue's mistakes. A change
that is meant to change what a mistake gives (a new case, a reworded message) records the catalogue again::

    .venv/bin/python -m tests.checks.catalogue_record

and the diff of the JSON file shows, mistake by mistake, what changed.
"""

from __future__ import annotations

import functools
import json
import re
import warnings

import torch

from autograder.course.repository import assignments
from autograder.grader.local_channel import LocalChannel
from autograder.grader.remote import lookup
from autograder.shared.errors import CheckFailed

from ..course_copy import catalogue
from ..notebook_code import ROOT, cell_arguments
from .pasted_answers import module, partners, pasted, solution

RECORD = ROOT / "tests" / "fixtures" / "catalogue_record.json"
#: A number written with a decimal point in a message (its last digits may differ between Pythons: ``sum`` of floats
#: is compensated from Python 3.12).
NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?:e[-+]?\d+)?")


def normalised(text: str) -> str:
    """A message with its numbers to 9 significant digits."""
    return NUMBER.sub(lambda m: f"{float(m.group()):.9g}", text)


def message_of(check, arguments) -> str:
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
        for index, mistake in enumerate(listed):
            key = key_of(listed, index)
            answer = pasted(mistake, exercise)
            channel = LocalChannel(dict(vars(solution(assignment)), **{exercise: answer}))
            hidden_arguments = [lookup(channel, name)[1] for name in cell_arguments(assignment, True)[exercise]]
            visible_arguments = [answer, *partners(assignment, exercise, False)]
            found[key] = {
                "name": mistake.name,
                "hidden": message_of(getattr(module(assignment), f"check_{exercise}"), hidden_arguments),
                "visible": message_of(getattr(module(assignment, "checks"), f"check_{exercise}"), visible_arguments),
            }
    return found


def key_of(listed: list, index: int) -> str:
    """``<mistake id>#<k>``: the record's key of ``listed[index]`` (``k``: its place among the implementations of its id)."""
    mistake = listed[index]
    return f"{mistake.id}#{sum(m.id == mistake.id for m in listed[:index])}"


@functools.cache
def _record() -> dict:
    return json.loads(RECORD.read_text())


def recorded(assignment: str, exercise: str, index: int, check: str, said: str) -> bool:
    """Whether ``said`` is what the record holds for the ``index``-th mistake of ``exercise`` (``check``: "hidden" or
    "visible"), numbers to 9 significant digits; an assertion that names both when it is not."""
    key = key_of(catalogue(assignment)[exercise], index)
    was = _record()[assignment].get(key, {}).get(check)
    assert was is not None, f"{key} is not in {RECORD.name}: record the catalogue again (python -m {__name__})"
    assert normalised(said) == normalised(was), (f"{key}, the {check} check: what the mistake gives changed (record it "
                                                 f"again if that is meant: python -m {__name__})\n was {was}\n now {said}")
    return True


def main() -> None:
    RECORD.write_text(json.dumps({a: record(a) for a in assignments()}, indent=1, sort_keys=True) + "\n")
    print(f"recorded {RECORD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
