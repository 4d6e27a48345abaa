"""Grading notes: their kinds are a closed set, and what is written is read back the same."""

from __future__ import annotations

import json

import pytest

from autograder.pipeline import notes
from autograder.pipeline.notes import Note, NoteKind


def test_notes_round_trip_with_their_kinds(tmp_path):
    written = [Note(NoteKind.RENAMED, "renamed"), Note(NoteKind.KERNEL_DIED, "cell 3: \ud800 died")]
    notes.write_notes(tmp_path, written)
    stored = json.loads((tmp_path / notes.NOTES_FILE).read_text())
    assert [n["kind"] for n in stored] == ["renamed", "KernelDied"]  # the file keeps the plain values
    back = notes.read_notes(tmp_path)
    assert [n.kind for n in back] == [NoteKind.RENAMED, NoteKind.KERNEL_DIED]
    assert all(isinstance(n.kind, NoteKind) for n in back)


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="renamd"):
        Note("renamd", "a typo in a kind must not pass silently")


def test_every_runtime_error_name_is_a_kind():
    """The cells' error names become note kinds (runtime_notes): each must be one."""
    assert {NoteKind(name) for name in notes.RUNTIME_ERRORS} <= set(NoteKind)
