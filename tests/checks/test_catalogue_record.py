"""The record of what every catalogued mistake gives lists the catalogue's mistakes, by id, in order.

The record (``tests/fixtures/catalogue_record.json``, written by :mod:`tests.checks.catalogue_record`)
holds, for every mistake, what the hidden and the visible check say of it. ``test_catalogue.py`` compares
each mistake's messages with it as it runs the mistake's checks: a rewrite of the catalogue (a mistake
written as a variation of its reference instead of a copy of it) must leave every one of those messages
as it was (its numbers to 9 significant digits, the same on every supported Python); a change meant to
change them records the catalogue again.
"""

from __future__ import annotations

import json

import pytest

from autograder.course.repository import assignments

from ..course_copy import catalogue
from .catalogue_record import RECORD, key_of, normalised


@pytest.mark.parametrize("assignment", assignments())
def test_the_record_lists_every_mistake(assignment):
    recorded = json.loads(RECORD.read_text())[assignment]
    now = [key_of(listed, i) for listed in catalogue(assignment).values() for i in range(len(listed))]
    assert sorted(now) == sorted(recorded), "the catalogue's mistakes (by id, in order) are not those recorded"
    names = {key_of(listed, i): m.name for listed in catalogue(assignment).values() for i, m in enumerate(listed)}
    assert {k: names[k] for k in now} == {k: recorded[k]["name"] for k in now}


def test_numbers_are_compared_to_nine_digits():
    assert normalised("error 0.1234567891234 at 1.5e-07") == normalised("error 0.1234567894321 at 1.5e-07")
    assert normalised("error 0.12345679") != normalised("error 0.12345689")
