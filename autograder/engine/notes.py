"""What grading says about a submission: notes, the names of what stopped a cell, text that cannot break.

Every step of grading (staging, the run of the notebook, the summary, the feedback) speaks
through these: a :class:`Note` for the student and the instructor, kept with the graded
submission in ``.grading-notes.json``; the ``ename`` of the error outputs the grader gives a
cell that timed out, killed its kernel or was not run, and the text of a cut output, which
the notes read back from the graded notebook; :func:`safe_text`, which makes whatever a
submission holds (a lone surrogate, a file name that is not UTF-8) into text that every
later step can write; and :func:`inert_text`, the one way such text is printed to a terminal
or put in a platform's plain-text output: every control character written as an escape, so
that it shows itself and does nothing (no terminal escape sequence, no carriage return that
overwrites a line, no newline that starts a forged line of a summary).
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from nbformat import NotebookNode

#: Where the notes of a graded submission are kept, in its ``autograded/`` folder.
NOTES_FILE = ".grading-notes.json"
#: The ``ename`` of the error outputs the grader gives a cell (autograder/engine/execute.py).
TIMEOUT, KERNEL_DIED, NOT_RUN = "CellTimeoutError", "KernelDied", "NotRun"
RUNTIME_ERRORS = {TIMEOUT, KERNEL_DIED, NOT_RUN}  # each is also a NoteKind
#: How a cut output begins (the rest says how many bytes and which stream).
OUTPUT_CUT = "[output cut:"


def output_cut(limit: int, stream: str, whole_notebook: bool = False) -> str:
    """The stream text that replaces what a cell wrote beyond ``limit`` bytes (``whole_notebook``: beyond the
    notebook's ``limit``, every cell together)."""
    if whole_notebook:
        return (f"\n{OUTPUT_CUT} the notebook's cells together wrote more than {limit} bytes; "
                f"this cell's {stream} was not kept]\n")
    return f"\n{OUTPUT_CUT} this cell wrote more than {limit} bytes to {stream}]\n"


def safe_text(text: Any) -> str:
    """``text`` as a string that encodes to UTF-8 whatever it held (lone surrogates become ``\\udXXX``)."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


#: What :func:`inert_text` escapes: the C0 and C1 control characters and DEL (ESC starts a terminal's
#: escape sequences, CR and backspace overwrite what was shown, NUL and BEL), the Unicode line and
#: paragraph separators, and the marks and overrides that reorder a line as it is shown.
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def inert_text(text: Any, lines: bool = False) -> str:
    """``text`` as :func:`safe_text`, with every control character written as its escape (``\\x1b``, ``\\n``).

    Printed to a terminal or shown as plain text, the result shows what it holds and does nothing.
    With ``lines``, newlines and tabs are kept (a multi-line message); without, the text is one
    line whatever it held, so that it cannot pass for a line of its own.
    """
    kept = "\n\t" if lines else ""
    return CONTROL_CHARACTERS.sub(lambda m: m.group() if m.group() in kept else m.group().encode("unicode_escape").decode(),
                                  safe_text(text))


def safe_tree(value: Any) -> Any:
    """Every string in a JSON-like tree (a notebook) made :func:`safe_text`."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return type(value)((safe_text(k), safe_tree(v)) for k, v in value.items())
    if isinstance(value, list):
        return [safe_tree(v) for v in value]
    return value


class NoteKind(StrEnum):
    """What a note is about. The values are what ``.grading-notes.json`` holds (do not change them)."""

    PROTECTION = "protection"  # how the student's code ran (sandbox or limits only)
    FAILED = "failed"  # the submission could not be graded: no score was recorded
    MISSING = "missing"  # no notebook of that name: scores 0
    RENAMED = "renamed"  # a notebook under another name was graded
    IGNORED = "ignored"  # a notebook that is not part of the assignment
    UNREADABLE = "unreadable"  # a file that is not a notebook
    DEEP = "deep"  # parts of a notebook nested too deep to read, left out
    LINK = "link"  # a symbolic link or special file, not used
    SIZE = "size"  # a file too large, not used
    ADDED = "added"  # a cell the student added that claims to be graded
    METADATA = "metadata"  # a locked cell's grading metadata was changed, then restored
    EDITED = "edited"  # a locked cell was edited; the original ran
    DELETED = "deleted"  # a test cell was missing; it was put back
    MOVED = "moved"  # a test cell was moved; it was put back
    OUTPUT = "output"  # a cell's output was cut
    TIMEOUT = "CellTimeoutError"  # a cell ran out of time
    KERNEL_DIED = "KernelDied"  # a cell killed its kernel
    NOT_RUN = "NotRun"  # a cell was not run (the notebook's time ran out)


@dataclass(frozen=True)
class Note:
    """Something the student (and the instructor) should know about how a submission was graded."""

    kind: NoteKind
    message: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", NoteKind(self.kind))  # an unknown kind is a ValueError
        object.__setattr__(self, "message", inert_text(self.message))  # one line, whatever it quotes


def describe_exit(code: int | None) -> str:
    """How a kernel process ended, in words (negative codes and 128+n are signals)."""
    if code is None:
        return "it stopped responding"
    number = -code if code < 0 else code - 128 if code > 128 else 0
    if number:
        try:
            name = signal.Signals(number).name
        except ValueError:  # a number no signal of this system has
            name = f"signal {number}"
        why = {
            "SIGSEGV": "a crash in native code, for example through ctypes",
            "SIGKILL": "killed, usually for going over the memory limit",
            "SIGXCPU": "it used up its CPU-time limit",
            "SIGABRT": "an abort in native code",
        }.get(name, "a signal")
        return f"it was stopped by {name} ({why})"
    return f"it exited with code {code} (os._exit, exit() or quit(), or sys.exit outside a cell)"


def unique(notes: list[Note]) -> list[Note]:
    seen, out = set(), []
    for note in notes:
        if note not in seen:
            seen.add(note)
            out.append(note)
    return out


def runtime_notes(notebook: NotebookNode) -> list[Note]:
    """Notes for the cells that crashed, hung, were skipped or flooded their output."""
    notes = []
    for index, cell in enumerate(notebook.cells):
        where = (cell.get("metadata", {}).get("nbgrader", {}) or {}).get("grade_id") or f"cell {index + 1}"
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and out.get("ename") in RUNTIME_ERRORS:
                notes.append(Note(out["ename"], f"{where}: {out['evalue']}"))
            elif out.get("output_type") == "stream" and OUTPUT_CUT in out.get("text", ""):
                notes.append(Note(NoteKind.OUTPUT, f"{where}: its output was cut (too long)."))
    return unique(notes)


def write_notes(folder: Path, notes: list[Note]) -> None:
    """Keep ``notes`` with the graded submission (never following a link planted there)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / NOTES_FILE
    if path.is_symlink() or path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump([asdict(n) for n in notes], handle, indent=1)


def read_notes(folder: Path) -> list[Note]:
    """The notes kept by :func:`write_notes` (none when there are none)."""
    path = folder / NOTES_FILE
    if not path.is_file() or path.is_symlink():
        return []
    return [Note(str(n.get("kind", "")), str(n.get("message", ""))) for n in json.loads(path.read_text(encoding="utf-8"))]


def notes_html(notes: list[Note]) -> str:
    """The notes as an HTML block for the top of the feedback."""
    import html

    items = "".join(f"<li>{html.escape(n.message)}</li>" for n in notes)
    return (
        '<div class="grading-notes" style="border:2px solid #c60;padding:0.5em 1em;margin:1em;">'
        f"<h2>How this submission was graded</h2><ul>{items}</ul></div>"
    )
