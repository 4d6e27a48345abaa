"""Every catalogued mistake still gives what it gave: the catalogue compared with its record.

The record (``tests/fixtures/catalogue_record.json``, written by :mod:`tests.checks.catalogue_record`)
holds, for every mistake, what the hidden and the visible check say of it. A rewrite of the catalogue
(a mistake written as a variation of its reference instead of a copy of it) must leave every one of
those messages as it was (its numbers to 9 significant digits, the same on every supported Python); a change
meant to change them records the catalogue again.
"""

from __future__ import annotations

import json
import re

import pytest

from autograder.course.repository import assignments

from .catalogue_record import RECORD, record

#: A number written with a decimal point in a message (its last digits may differ between Pythons: ``sum`` of floats
#: is compensated from Python 3.12).
NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?:e[-+]?\d+)?")


def normalised(said: dict[str, str]) -> dict[str, str]:
    """What a mistake gives, its numbers to 9 significant digits."""
    return {key: NUMBER.sub(lambda m: f"{float(m.group()):.9g}", text) for key, text in said.items()}


@pytest.mark.parametrize("assignment", assignments())
def test_every_mistake_gives_what_it_gave(assignment):
    recorded = {key: normalised(said) for key, said in json.loads(RECORD.read_text())[assignment].items()}
    now = {key: normalised(said) for key, said in record(assignment).items()}
    assert sorted(now) == sorted(recorded), "the catalogue's mistakes (by id, in order) are not those recorded"
    changed = {key: (recorded[key], now[key]) for key in recorded if now[key] != recorded[key]}
    assert not changed, "\n\n".join(f"{key}:\n was {was}\n now {is_}" for key, (was, is_) in changed.items())
