"""``make similarity``: which answers of a class look alike, exercise by exercise, and which match the reference.

For each exercise (an answer cell: nbgrader's ``solution`` cell, by its ``grade_id``) of each
assignment, every submission's answer is compared with every other's and with the reference
solution (the solution cell of ``source/``). The comparison is copydetect's (MOSS's winnowing):
the code is split into tokens by Pygments, every name becomes ``V`` (every function name ``F``,
every string ``S``), comments and spacing are dropped, and the fingerprints are the hashes of every
run of :data:`NOISE` characters of what is left. The released cell (signature, docstring,
``raise NotImplementedError()``) is boilerplate: its fingerprints are taken out of every answer.
Renamed variables, other comments and spacing change nothing; statements put in another order
lose only the fingerprints that straddle them.

A pair's **similarity** is the share of each answer's fingerprints found in the other, averaged
over the two, from 0 to 1: 1 for answers the same but for names, comments and spacing; an answer
copied whole into one twice as long scores 0.75.
Pairs at or above ``threshold`` are listed, highest first, with the matching regions that
copydetect finds; every exercise also keeps the similarities of all its pairs, so that the page
can show what is usual for it (a three-line answer is similar for everyone).

Submissions are read as grading reads them (:func:`autograder.engine.staging.stage`, into a
temporary folder: ``submitted/`` is never changed), and no student code is run: the answers are
only read as text. A submission whose notebook cannot be read, or that lacks an answer cell, is
listed with the reason, and an answer cell longer than :data:`MAX_ANSWER` characters is listed, not
compared (fingerprinting a megabyte of code takes half a minute). What this cannot tell: whether two
similar answers were copied (two honest students can write the same short answer), nor anything
about code outside the answer cell, nor a copy rewritten in another style (a loop for a matrix
product).
"""

from __future__ import annotations

import io
import logging
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import numpy as np

from ..course.repository import ROOT, assignments
from ..course.settings import Grading, Settings
from ..engine.notes import NoteKind
from ..engine.staging import release_notebooks, stage

#: Fewest characters of filtered code (names as ``V``, no spacing) that a match must span.
NOISE = 12
#: Pairs at or above this similarity are listed (``--threshold``).
THRESHOLD = 0.5
#: Most pairs shown per exercise, highest first (the others are counted).
SHOWN = 40
#: Longest answer cell compared, in characters (an answer is a few hundred; a longer one is listed, not compared).
MAX_ANSWER = 100_000
#: Why a submission has no answers (the notes of staging that say so).
UNUSABLE = {NoteKind.MISSING, NoteKind.UNREADABLE, NoteKind.SIZE, NoteKind.LINK, NoteKind.IGNORED, NoteKind.RENAMED}


@dataclass
class Pair:
    """Two answers to one exercise and how alike they are. ``second`` None: the reference solution."""

    first: str
    second: str | None
    similarity: float
    slices: tuple[list[tuple[int, int]], list[tuple[int, int]]] = field(default_factory=lambda: ([], []))  # of each
    others: int = 0  # the most other students either answer is also at or above the threshold with

    @property
    def reference(self) -> bool:
        return self.second is None


@dataclass
class Exercise:
    """The answers to one exercise, and their similarities."""

    name: str
    released: str = ""
    reference: str | None = None  # the reference solution's cell, None where source/ has none
    answers: dict[str, str] = field(default_factory=dict)  # student -> answer cell, as handed in
    unanswered: list[str] = field(default_factory=list)  # left as released
    too_short: list[str] = field(default_factory=list)  # nothing left once the released cell is taken out
    too_long: list[str] = field(default_factory=list)  # longer than MAX_ANSWER characters
    failed: list[tuple[str, str]] = field(default_factory=list)  # (student, why) the answer could not be fingerprinted
    missing: list[str] = field(default_factory=list)  # no such answer cell in the notebook
    compared: list[str] = field(default_factory=list)  # the students in :attr:`matrix`'s order
    matrix: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # compared x compared similarities
    to_reference: np.ndarray = field(default_factory=lambda: np.zeros(0))  # each compared student's, with it
    pairs: list[Pair] = field(default_factory=list)  # at or above the threshold, highest first, at most SHOWN
    above: int = 0  # pairs of students at or above the threshold (all, not only those shown)
    above_reference: int = 0  # students at or above it with the reference

    def similarity(self, first: str, second: str | None) -> float:
        """The similarity of two students' answers (``second`` None: with the reference)."""
        i = self.compared.index(first)
        return float(self.to_reference[i] if second is None else self.matrix[i, self.compared.index(second)])

    def pair_values(self) -> np.ndarray:
        """The similarity of every pair of students (each pair once)."""
        return self.matrix[np.triu_indices(len(self.compared), k=1)]


@dataclass
class Assignment:
    """An assignment's submissions, compared exercise by exercise."""

    name: str
    students: list[str] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (student, why)
    exercises: list[Exercise] = field(default_factory=list)
    threshold: float = THRESHOLD


# -- reading -------------------------------------------------------------------------------


def _answer_cells(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """grade_id -> source of every answer cell (nbgrader's solution cells) of ``notebook``."""
    cells = {}
    for cell in notebook.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
        if meta.get("solution") and meta.get("grade_id") and cell.get("cell_type") == "code":
            cells[str(meta["grade_id"])] = str(cell.get("source", ""))
    return cells


def reference_answers(root: Path, assignment: str) -> dict[str, str]:
    """grade_id -> the reference solution's cell, from ``source/`` (its nbgrader markers are comments)."""
    answers: dict[str, str] = {}
    for path in sorted((root / "source" / assignment).glob("*.ipynb")):
        answers.update(_answer_cells(nbformat.read(path, as_version=4)))
    return answers


def released_answers(root: Path, assignment: str) -> dict[str, str]:
    """grade_id -> the released answer cell (what a student starts from), in the notebooks' order."""
    answers: dict[str, str] = {}
    for notebook in release_notebooks(root, assignment).values():
        answers.update(_answer_cells(notebook))
    return answers


def read_submission(root: Path, assignment: str, student: str, settings: Grading,
                    staging: Path | None = None) -> tuple[dict[str, str], str | None]:
    """The answer cells of one submission, as grading stages it (into ``staging``, else a temporary folder); or why
    there are none. The staged copy is removed."""
    if staging is None:
        with tempfile.TemporaryDirectory(prefix="similarity-") as folder:
            return read_submission(root, assignment, student, settings, Path(folder))
    try:
        staged = stage(root, assignment, student, staging, settings)
        answers: dict[str, str] = {}
        for name in staged.notebooks:
            answers.update(_answer_cells(nbformat.read(staging / student / assignment / f"{name}.ipynb", as_version=4)))
    except Exception as error:  # noqa: BLE001 - whatever a submission holds, the report goes on
        return {}, f"could not be read ({type(error).__name__})"
    finally:
        shutil.rmtree(staging / student, ignore_errors=True)
    if not staged.notebooks:
        why = [n.message for n in staged.notes if n.kind in UNUSABLE] or ["no notebook of the assignment"]
        return {}, " ".join(why)
    return answers, None


def students_of(root: Path, assignment: str) -> list[str]:
    """The students with a folder for ``assignment`` in ``submitted/``, sorted (those ``make autograde`` grades)."""
    from .grade import submissions

    return [student for _, student in submissions(root, [assignment])]


# -- fingerprints and pairs ----------------------------------------------------------------


def _fingerprint(text: str, boilerplate: np.ndarray):
    from copydetect import CodeFingerprint

    logging.getLogger().disabled, before = True, logging.getLogger().disabled  # copydetect logs on odd input
    try:
        return CodeFingerprint("answer.py", NOISE, 1, boilerplate, language="python", fp=io.StringIO(text))
    finally:
        logging.getLogger().disabled = before


def _overlaps(hashes: list[set[int]]) -> np.ndarray:
    """How many fingerprints each pair of answers shares (a square matrix), by blocks of fingerprints."""
    counts: dict[int, int] = {}
    for found in hashes:
        for value in found:
            counts[value] = counts.get(value, 0) + 1
    shared = [value for value, count in counts.items() if count > 1]  # a fingerprint of one answer matches none
    column = {value: i for i, value in enumerate(shared)}
    result = np.zeros((len(hashes), len(hashes)), dtype=np.float32)
    block = 4096
    for start in range(0, len(shared), block):
        ones = np.zeros((len(hashes), min(block, len(shared) - start)), dtype=np.float32)
        for row, found in enumerate(hashes):
            columns = [column[v] - start for v in found if start <= column.get(v, -1) < start + block]
            ones[row, columns] = 1.0
        result += ones @ ones.T
    return result


def _similarities(hashes: list[set[int]]) -> np.ndarray:
    """For every pair: the share of each answer's fingerprints found in the other, averaged over the two."""
    sizes = np.maximum(np.array([len(h) for h in hashes], dtype=np.float64), 1)
    shared = _overlaps(hashes).astype(np.float64)  # counts: exact in float32 up to 2**24
    return (shared / sizes[:, None] + shared / sizes[None, :]) / 2


def _slices(first, second) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """copydetect's matching regions of two fingerprinted answers, as (start, end) offsets in their text."""
    from copydetect import compare_files

    try:
        _, _, (a, b) = compare_files(first, second)
    except Exception:  # noqa: BLE001 - the regions only decorate the page: the similarity stands without them
        return [], []
    as_list = lambda s: [(int(x), int(y)) for x, y in zip(*s)] if len(s) and len(s[0]) else []  # noqa: E731
    return as_list(a), as_list(b)


def compare_exercise(exercise: Exercise, threshold: float = THRESHOLD, shown: int = SHOWN) -> Exercise:
    """Fill in ``exercise``'s similarities and its pairs at or above ``threshold`` (its answers are read)."""
    boilerplate = np.unique(np.array(sorted(_fingerprint(exercise.released, np.array([])).hashes), dtype=np.int64))
    prints = {}
    for student, text in exercise.answers.items():
        if text.strip() == exercise.released.strip():
            exercise.unanswered.append(student)
            continue
        if len(text) > MAX_ANSWER:
            exercise.too_long.append(student)
            continue
        try:
            found = _fingerprint(text, boilerplate)
        except Exception as error:  # noqa: BLE001 - one answer the tokenizer chokes on is listed; the rest go on
            exercise.failed.append((student, f"{type(error).__name__}: {error}"[:200]))
            continue
        if found.hashes:
            prints[student] = found
        else:
            exercise.too_short.append(student)
    exercise.compared = sorted(prints)
    reference = _fingerprint(exercise.reference, boilerplate) if exercise.reference is not None else None
    hashes = [prints[s].hashes for s in exercise.compared] + [reference.hashes if reference else set()]
    full = _similarities(hashes)
    n = len(exercise.compared)
    exercise.matrix, exercise.to_reference = full[:n, :n], full[:n, n]
    np.fill_diagonal(exercise.matrix, 0.0)
    rows, columns = np.nonzero(np.triu(exercise.matrix >= threshold, k=1))
    alike = (exercise.matrix >= threshold).sum(axis=1)  # how many other students each answer is alike with
    candidates = [(float(exercise.matrix[i, j]), int(max(alike[i], alike[j])) - 1, i, j) for i, j in zip(rows, columns)]
    exercise.above = len(candidates)
    with_reference = [(float(exercise.to_reference[i]), int(alike[i]), i, None) for i in range(n)
                      if exercise.to_reference[i] >= threshold]
    exercise.above_reference = len(with_reference)
    # Highest first; among equals, the reference first, then the pairs alike with fewest others: an answer alike
    # with many is a common answer, a pair alike with nobody else is the one to look at.
    ranked = sorted(with_reference + candidates, key=lambda c: (-c[0], c[3] is not None, c[1], c[2], c[3] or 0))[:shown]
    exercise.pairs = []
    for score, others, i, j in ranked:
        first, second = exercise.compared[i], None if j is None else exercise.compared[j]
        slices = _slices(prints[first], reference if second is None else prints[second])
        exercise.pairs.append(Pair(first, second, score, slices, others))
    return exercise


def compare_assignment(name: str, root: Path = ROOT, threshold: float = THRESHOLD, shown: int = SHOWN) -> Assignment:
    """Read every submission of ``name`` and compare its answers, exercise by exercise."""
    settings = Settings.load(root).make(Grading)
    released = released_answers(root, name)
    reference = reference_answers(root, name)
    result = Assignment(name, threshold=threshold)
    exercises = {gid: Exercise(gid, released=text, reference=reference.get(gid)) for gid, text in released.items()}
    with tempfile.TemporaryDirectory(prefix="similarity-") as staging:
        for student in students_of(root, name):
            answers, why = read_submission(root, name, student, settings, Path(staging))
            if why is not None:
                result.unreadable.append((student, why))
                continue
            result.students.append(student)
            for gid, exercise in exercises.items():
                if gid in answers:
                    exercise.answers[student] = answers[gid]
                else:
                    exercise.missing.append(student)
    result.exercises = [compare_exercise(e, threshold, shown) for e in exercises.values()]
    return result


def compare(names: Iterable[str] | None = None, root: Path = ROOT, threshold: float = THRESHOLD,
            shown: int = SHOWN) -> list[Assignment]:
    """:func:`compare_assignment` for each of ``names`` (default: every assignment) with submissions.

    A name that is not an assignment of ``source/`` is a ValueError.
    """
    known = assignments(root)
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise ValueError(f"no such assignment in source/: {', '.join(unknown)} (there are {', '.join(known)})")
    found = []
    for name in names or known:
        if students_of(root, name):
            found.append(compare_assignment(name, root, threshold, shown))
    return found
