"""Before nbgrader: a submission copied into the shape nbgrader grades, whatever was done to it.

Before grading, :func:`stage` copies a submission into a private folder that nbgrader reads
instead of ``submitted/`` (the student's files are never changed):

- only regular files are copied (no symbolic links, devices or oversized files), and no folder
  whose name ends in ``.ipynb`` at the top (nbgrader would take it for a notebook);
- a notebook is read whatever its metadata holds: values nested deeper than :data:`MAX_DEPTH`
  (a notebook's own structure is about eight levels deep) are left out, with a note, so that
  no step of grading recurses into them;
- a notebook under another name is graded as the assignment's notebook when there is no
  doubt which one it is; a missing or unreadable notebook is recorded;
- the notebook is put back into the shape nbgrader expects: the locked test cells of the
  release are restored where they belong (right after their exercise), even when they were
  deleted, moved, edited or had their metadata (points, ``grade_id``, ``locked``) changed,
  and added cells lose any nbgrader metadata (they run, they earn nothing).

Staging protects the *shape* of what nbgrader grades (which cells are tests, their points
and their source); it does not need to protect how they are judged: test cells run in the
grader's process (:mod:`autograder.engine.judge`), never in the student's kernel. Text
from a submission (cell sources, outputs, file names) is made valid UTF-8 here, so that no
later step (the gradebook, the feedback, the summary) can fail on it.

Every finding is a :class:`~autograder.engine.notes.Note`, shown to the student in the
feedback and to the instructor in the summary of ``make autograde``.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from ..course.settings import Grading
from .notes import Note, NoteKind, safe_tree, unique

#: Cell metadata a student's cell keeps (the rest is dropped: it could be megabytes).
KEPT_METADATA = {"nbgrader", "tags", "collapsed", "scrolled", "jupyter", "editable", "deletable"}
#: How deep a submitted notebook's JSON may nest; a value nested deeper is left out when it is read.
MAX_DEPTH = 32
#: A JSON string (skipped whole, escapes included) or a bracket.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def shallow_json(text: str, limit: int = MAX_DEPTH) -> tuple[str, int]:
    """``text`` (JSON) with each array or object nested deeper than ``limit`` replaced by ``null``, and how many were.

    One pass over the text, without recursion: a parser (Python's, then nbformat's) can then read
    it without running out of stack. Malformed JSON is returned as it came, for the parser to refuse.
    """
    parts, kept_from, depth, cut_at, dropped = [], 0, 0, 0, 0
    for token in _JSON_TOKEN.finditer(text):
        bracket = token.group()
        if bracket[0] == '"':
            continue
        if bracket in "[{":
            depth += 1
            if depth == limit + 1 and not cut_at:
                parts += [text[kept_from:token.start()], "null"]
                cut_at, dropped = depth, dropped + 1
        else:
            if cut_at and depth == cut_at:
                kept_from, cut_at = token.end(), 0
            depth -= 1
    if not dropped or cut_at:
        return text, 0
    return "".join(parts) + text[kept_from:], dropped


def read_submitted(path: Path) -> tuple[NotebookNode, int]:
    """The notebook at ``path``, with what nests deeper than :data:`MAX_DEPTH` left out, and how many values were."""
    text, dropped = shallow_json(path.read_bytes().decode("utf-8"))
    return nbformat.reads(text, as_version=4), dropped


# -- notebooks of the release --------------------------------------------------------------


def release_folder(root: Path, assignment: str) -> Path:
    """The folder holding the released notebooks of ``assignment`` (nbgrader's release, else notebooks/)."""
    folder = root / "build" / "release" / assignment
    return folder if folder.is_dir() else root / "notebooks"


def release_notebooks(root: Path, assignment: str) -> dict[str, NotebookNode]:
    """Notebook name -> released notebook, for every notebook of ``assignment``."""
    folder = root / "build" / "release" / assignment
    if folder.is_dir():
        return {p.stem: nbformat.read(p, as_version=4) for p in sorted(folder.glob("*.ipynb"))}
    fallback = root / "notebooks" / f"{assignment}.ipynb"
    return {assignment: nbformat.read(fallback, as_version=4)} if fallback.is_file() else {}


def _meta(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _locked(cell: NotebookNode) -> bool:
    meta = _meta(cell)
    return bool(meta.get("locked") or (meta.get("grade") and not meta.get("solution")))


# -- staging -------------------------------------------------------------------------------


@dataclass
class Staged:
    """A submission copied for grading: the notebooks found and what was noticed."""

    notebooks: list[str]
    notes: list[Note]


def stage(root: Path, assignment: str, student: str, staging: Path, settings: Grading | None = None) -> Staged:
    """Copy ``submitted/<student>/<assignment>`` to ``staging/<student>/<assignment>``, cleaned up.

    A file larger than ``settings.max_file_mb``, or past ``settings.max_submission_mb`` in all, is left out.
    """
    settings = settings or Grading()
    max_file, max_total = settings.max_file_mb * 2**20, settings.max_submission_mb * 2**20
    source = root / "submitted" / student / assignment
    target = staging / student / assignment
    target.mkdir(parents=True, exist_ok=True)
    notes: list[Note] = []
    total = 0
    found_notebooks: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(source, followlinks=False):
        rel = Path(dirpath).relative_to(source)
        for name in sorted(dirnames):
            if os.path.islink(os.path.join(dirpath, name)):
                notes.append(Note(NoteKind.LINK, f"{rel / name} is a symbolic link; it was not used."))
        for name in sorted(dirnames):
            if rel == Path(".") and name.endswith(".ipynb") and not os.path.islink(os.path.join(dirpath, name)):
                notes.append(Note(NoteKind.UNREADABLE, f"{name} is a folder, not a notebook; it was not used."))
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))
                             and d not in (".ipynb_checkpoints", "__pycache__")
                             and not (rel == Path(".") and d.endswith(".ipynb")))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            shown = rel / name
            if path.is_symlink() or not path.is_file():
                notes.append(Note(NoteKind.LINK, f"{shown} is a symbolic link or not a regular file; it was not used."))
                continue
            size = path.stat().st_size
            total += size
            if size > max_file or total > max_total:
                notes.append(Note(NoteKind.SIZE, f"{shown} is too large ({size} bytes); it was not used."))
                continue
            if name.endswith(".ipynb") and rel == Path("."):
                found_notebooks[path.stem] = path
                continue
            (target / rel).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / rel / name)

    releases = release_notebooks(root, assignment)
    readable: dict[str, NotebookNode] = {}
    for name, path in found_notebooks.items():
        try:
            readable[name], dropped = read_submitted(path)
        except Exception as error:  # noqa: BLE001 - any unreadable file is reported, not fatal
            notes.append(Note(NoteKind.UNREADABLE, f"{path.name} could not be read as a notebook ({type(error).__name__}); "
                                            "it was not graded."))
            continue
        if dropped:
            notes.append(Note(NoteKind.DEEP, f"{path.name}: what its metadata or outputs nest more than {MAX_DEPTH} "
                                             f"levels deep was left out ({dropped} values)."))
    graded = []
    unclaimed = {n: nb for n, nb in readable.items() if n not in releases}
    for name, release in releases.items():
        notebook = readable.get(name)
        if notebook is None:
            notebook, other = _pick_renamed(unclaimed, release)
            if notebook is None:
                notes.append(Note(NoteKind.MISSING, f"{name}.ipynb was not in your submission, so it scores 0."))
                continue
            unclaimed.pop(other)
            notes.append(Note(NoteKind.RENAMED, f"Your notebook was named {other}.ipynb instead of {name}.ipynb; "
                                         f"it was graded as {name}.ipynb."))
        normalized, cell_notes = normalize(safe_tree(notebook), release)
        notes += cell_notes
        nbformat.write(normalized, target / f"{name}.ipynb")
        graded.append(name)
    for other in unclaimed:
        notes.append(Note(NoteKind.IGNORED, f"{other}.ipynb is not part of this assignment; it was not graded."))
    return Staged(graded, notes)


def _pick_renamed(candidates: dict[str, NotebookNode], release: NotebookNode) -> tuple[NotebookNode | None, str]:
    """The one candidate notebook that is clearly ``release`` under another name (most grade ids shared)."""
    wanted = {_meta(c).get("grade_id") for c in release.cells} - {None}
    scored = sorted(
        ((len(wanted & {_meta(c).get("grade_id") for c in nb.cells}), name) for name, nb in candidates.items()),
        reverse=True,
    )
    if scored and scored[0][0] > 0 and (len(scored) == 1 or scored[1][0] < scored[0][0]):
        return candidates[scored[0][1]], scored[0][1]
    return None, ""


def normalize(submitted: NotebookNode, release: NotebookNode) -> tuple[NotebookNode, list[Note]]:
    """``submitted`` with the release's locked cells and nbgrader metadata restored (see the module doc)."""
    notes: list[Note] = []
    by_id = {_meta(c)["grade_id"]: c for c in release.cells if _meta(c).get("grade_id")}
    order = [_meta(c)["grade_id"] for c in release.cells if _meta(c).get("grade_id")]
    locked_sources: dict[str, list[str]] = {}
    for gid in order:
        if _locked(by_id[gid]):
            locked_sources.setdefault(by_id[gid].source.strip(), []).append(gid)

    matched: dict[str, NotebookNode] = {}
    restored: set[int] = set()  # id() of the locked cells taken from the release
    cells: list[NotebookNode] = []
    for original in submitted.cells:
        cell = copy.deepcopy(original)
        meta = _meta(cell)
        gid = meta.get("grade_id")
        if gid not in by_id or gid in matched:
            twin = next((g for g in locked_sources.get(cell.source.strip(), []) if g not in matched), None)
            if twin is None:
                if meta.get("grade") or meta.get("points"):
                    notes.append(Note(NoteKind.ADDED, f"A cell you added claims to be graded ({meta.get('grade_id') or 'no id'}, "
                                               f"{meta.get('points', 0)} points); it was run as an ordinary cell."))
                cell.metadata.pop("nbgrader", None)
                cells.append(cell)
                continue
            gid = twin
            notes.append(Note(NoteKind.METADATA, f"The test cell {twin} had lost or changed its grading metadata; "
                                          "it was restored."))
        reference = by_id[gid]
        changed = [k for k in ("points", "grade", "solution", "locked") if meta.get(k) != _meta(reference).get(k)]
        if changed and meta.get("grade_id") == gid:
            notes.append(Note(NoteKind.METADATA, f"The metadata of cell {gid} was changed ({', '.join(changed)}); "
                                          "the original was restored."))
        if _locked(reference):
            if cell.source.strip() != reference.source.strip():
                notes.append(Note(NoteKind.EDITED, f"The locked cell {gid} was edited; the original was run instead."))
            cell = copy.deepcopy(reference)
            restored.add(id(cell))
        else:
            cell.metadata["nbgrader"] = copy.deepcopy(_meta(reference))
            if cell.cell_type != reference.cell_type:
                cell = _retype(cell, reference.cell_type)
        matched[gid] = cell
        cells.append(cell)

    # Which exercise did each locked cell follow? (for the "moved" note)
    seen_order = [_meta(c).get("grade_id") for c in submitted.cells if _meta(c).get("grade_id") in matched]
    present = [g for g in order if g in matched]
    moved = {g for g in present if _locked(by_id[g]) and g in seen_order
             and _exercise_before(seen_order, g, by_id) != _exercise_before(present, g, by_id)}

    result = [c for c in cells if id(c) not in restored]
    anchor = _initial_anchor(release, order)
    for gid in order:
        reference = by_id[gid]
        if not _locked(reference):
            if gid in matched:
                anchor = next(i for i, c in enumerate(result) if c is matched[gid])
            continue
        if gid not in matched:
            notes.append(Note(NoteKind.DELETED, f"The test cell {gid} was missing from your notebook; it was put back and run."))
        elif gid in moved:
            notes.append(Note(NoteKind.MOVED, f"The test cell {gid} had been moved; it was put back after its exercise."))
        anchor = min(anchor + 1, len(result))
        result.insert(anchor, copy.deepcopy(reference))
    notebook = copy.deepcopy(submitted)
    notebook.nbformat, notebook.nbformat_minor = release.nbformat, release.nbformat_minor
    notebook.cells = [_clean(c, i, release.nbformat_minor) for i, c in enumerate(result)]
    notebook.metadata = copy.deepcopy(release.metadata)
    return notebook, unique(notes)


def _exercise_before(sequence: list[str], gid: str, by_id: dict[str, NotebookNode]) -> str | None:
    """The last answer (unlocked) cell before ``gid`` in ``sequence``."""
    earlier = sequence[: sequence.index(gid)]
    return next((g for g in reversed(earlier) if not _locked(by_id[g])), None)


def _initial_anchor(release: NotebookNode, order: list[str]) -> int:
    """Where a first locked cell with no exercise before it goes: after as many cells as in the release."""
    if not order:
        return -1
    first = next(i for i, c in enumerate(release.cells) if _meta(c).get("grade_id") == order[0])
    return first - 1


def _retype(cell: NotebookNode, cell_type: str) -> NotebookNode:
    if cell_type == "code":
        return nbformat.v4.new_code_cell(cell.source, metadata=cell.metadata)
    return nbformat.v4.new_markdown_cell(cell.source, metadata=cell.metadata)


def _clean(cell: NotebookNode, index: int, minor: int) -> NotebookNode:
    """A fresh copy of ``cell``: no outputs, and a cell id that depends only on its position."""
    cell = copy.deepcopy(cell)
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    allowed = ("cell_type", "metadata", "source") + (("outputs", "execution_count") if cell.cell_type == "code"
                                                       else ("attachments",))
    for key in [k for k in cell if k not in allowed]:
        cell.pop(key)
    for key in [k for k in cell.metadata if k not in KEPT_METADATA]:
        cell.metadata.pop(key)
    if minor >= 5:
        cell["id"] = f"cell-{index:04d}"
    return cell
