"""Every catalogued mistake still gives what it gave: the catalogue compared with its record.

The record (``tests/fixtures/catalogue_record.json``, written by :mod:`tests.checks.catalogue_record`)
holds, for every mistake, what the hidden and the visible check say of it. A rewrite of the catalogue
(a mistake written as a variation of its reference instead of a copy of it) must leave every one of
those messages as it was; a change meant to change them records the catalogue again.
"""

from __future__ import annotations

import json

import pytest

from autograder.course.repository import assignments

from .catalogue_record import RECORD, record


@pytest.mark.parametrize("assignment", assignments())
def test_every_mistake_gives_what_it_gave(assignment):
    recorded = json.loads(RECORD.read_text())[assignment]
    now = record(assignment)
    assert sorted(now) == sorted(recorded), "the catalogue's mistakes (by id, in order) are not those recorded"
    changed = {key: (recorded[key], now[key]) for key in recorded if now[key] != recorded[key]}
    assert not changed, "\n\n".join(f"{key}:\n was {was}\n now {is_}" for key, (was, is_) in changed.items())
