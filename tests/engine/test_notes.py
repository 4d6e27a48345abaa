"""Grading notes: their kinds are a closed set, and what is written is read back the same."""

from __future__ import annotations

import json
import re

import pytest

from autograder.engine import notes
from autograder.engine.notes import Note, NoteKind


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


# -- text that is printed: inert ---------------------------------------------------------------

#: What a submission can put in a file name, a grade_id or a message, and what it would do in a terminal.
ESCAPES = {
    "title": "\x1b]0;you have been graded\x07",
    "clipboard": "\x1b]52;c;cm0gLXJmIH4=\x07",
    "clear screen": "\x1b[2J\x1b[H",
    "overwrite the line": "\rgraded 40, could not be graded 0",
    "reorder the line": "\u202eedoc",
    "C1 escape": "\x9b2J",
}
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize("what", ESCAPES)
def test_inert_text_shows_every_control_character_and_obeys_none(what):
    text = notes.inert_text(f"a{ESCAPES[what]}b\nc\td")
    assert not CONTROL.search(text) and "\n" not in text and "\t" not in text, repr(text)
    assert text.startswith("a") and text.endswith("b\\nc\\td")
    kept = notes.inert_text(f"a{ESCAPES[what]}b\nc\td", lines=True)
    assert not CONTROL.search(kept) and kept.endswith("b\nc\td")


def test_a_note_is_one_line_whatever_it_quotes():
    note = Note(NoteKind.RENAMED, "Your notebook was named x\n  01_soft_lookup / alice: forged\x1b[2J.ipynb")
    assert "\n" not in note.message and "\x1b" not in note.message
    assert "x\\n  01_soft_lookup / alice: forged\\x1b[2J.ipynb" in note.message


def test_the_summary_of_a_run_cannot_be_forged_or_steer_the_terminal():
    """A student id, a reason and a note that each hold a newline, a summary-like line and escapes."""
    from autograder.grading import grade

    a, forged = "01_soft_lookup", "\ngraded 40, could not be graded 0, in 1.0 s"
    evil = "eve" + ESCAPES["title"] + forged
    outcome = grade.SubmissionResult(a, evil)
    outcome.notes = [Note(NoteKind.IGNORED, "x" + ESCAPES["clear screen"] + forged)]
    # a note read back from an older file, made before notes were one line, is still printed as one
    old = Note(NoteKind.IGNORED, "old")
    object.__setattr__(old, "message", "y" + ESCAPES["clipboard"] + forged)
    outcome.notes.append(old)
    summary = grade.Summary(graded=[(a, evil)], failed=[(a, "mal" + forged, "nbgrader said" + forged + "\r")],
                            seconds=2.0, outcomes={(a, evil): outcome}, protection="a bubblewrap sandbox")
    lines = str(summary).split("\n")
    assert len(lines) == 6, lines  # the counts, the protection, the header and one line per failure and note
    assert [line for line in lines if line.startswith("graded")] == [lines[0]]
    assert lines[0].startswith("graded 1, could not be graded 1")
    assert not any(CONTROL.search(line) for line in lines), lines
    assert all(line.startswith(f"  {a} / ") for line in lines[3:]), lines
