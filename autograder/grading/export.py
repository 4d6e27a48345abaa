"""``make grades``: ``grades.csv`` (nbgrader's export) and ``grades-canvas.csv`` (Canvas's gradebook import).

``grades.csv`` is ``nbgrader export``: one row per student and assignment, in nbgrader's columns, written by
:class:`SafeCsvExportPlugin` (nbgrader's own exporter joins cells with commas, unquoted). ``grades-canvas.csv`` is in the
shape Canvas's *Grades > Import* reads: the columns ``Student``, ``ID``, ``SIS User ID``, ``SIS Login
ID``, ``Section``, then one column per assignment that has submissions, a second row ``Points
Possible`` with each assignment's maximum, and each student's points (after any late penalty).
Canvas matches a row to a student by ``ID`` (Canvas's user id), else ``SIS User ID``, else ``SIS
Login ID``; a new column name creates an assignment of that name. ``ID`` is filled in for
students collected with ``make collect-zip`` (their Canvas user id is in the file names of the
zip Canvas made); ``SIS Login ID`` is the nbgrader student id. A blank cell (no submission)
leaves that grade in Canvas as it is.

Both are safe to open in a spreadsheet (:func:`write_csv`): every cell is quoted as CSV needs (an id
with a comma or a quote stays one cell), and a text cell that a spreadsheet would take for a formula
(it begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) begins with ``'`` instead,
as OWASP recommends against CSV injection; numbers (scores, points, a negative one too) stay numbers.
What it does *not* do: change the ids themselves (the ``'`` is in the file only, and a spreadsheet
shows the text without it), or make the names safe for anything but a spreadsheet.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbgrader.plugins import CsvExportPlugin

from ..course.repository import ROOT, assignments, nbgrader
from ..course.settings import Settings

CANVAS_FILE = "grades-canvas.csv"
CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
#: ``<name>_[LATE_]<user id>_<submission id>_<file>``: the Canvas user id of a collected student.
CANVAS_NAME = re.compile(r"^(?P<student>[A-Za-z0-9][A-Za-z0-9.-]*)_(?:LATE_)?(?P<user>[0-9]+)_[0-9]+_")
#: The columns of nbgrader's ``grades.csv`` (its ``CsvExportPlugin``), in its order.
GRADES_COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email", "raw_score",
                  "late_submission_penalty", "score", "max_score"]
#: How a cell a spreadsheet takes for a formula begins (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_cell(value: Any) -> Any:
    """``value`` as a CSV cell a spreadsheet shows as it is: a number stays a number, None is blank, text that
    begins like a formula gets a leading ``'``."""
    if value is None:
        return ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def write_csv(path: Path, rows: list[list[Any]]) -> None:
    """Write ``rows`` to ``path`` with the csv module (quoting what needs it), each cell :func:`spreadsheet_cell`."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([[spreadsheet_cell(cell) for cell in row] for row in rows])


class SafeCsvExportPlugin(CsvExportPlugin):
    """nbgrader's CSV export (the same columns, rows and values), written by :func:`write_csv`.

    ``nbgrader export --exporter=autograder.grading.export.SafeCsvExportPlugin``.
    """

    def export(self, gradebook) -> None:
        from nbgrader.api import MissingEntry

        rows: list[list[Any]] = [GRADES_COLUMNS]
        for assignment in gradebook.assignments:
            if self.assignment and assignment.name not in [str(a) for a in self.assignment]:
                continue
            for student in gradebook.students:
                if self.student and student.id not in [str(s) for s in self.student]:
                    continue
                try:
                    submission = gradebook.find_submission(assignment.name, student.id)
                except MissingEntry:  # no submission: zero, as nbgrader exports it
                    timestamp, raw, penalty, score = None, 0.0, 0.0, 0.0
                else:
                    timestamp, raw, penalty = submission.timestamp, submission.score, submission.late_submission_penalty
                    score = max(0.0, raw - (penalty or 0.0))
                rows.append([assignment.name, assignment.duedate, timestamp, student.id, student.last_name,
                             student.first_name, student.email, raw, penalty, score, assignment.max_score])
        write_csv(Path(self.to or "grades.csv"), rows)


#: The exporter as nbgrader's subprocess imports it: this module's import path, even where it runs as ``__main__``.
EXPORTER = f"{__spec__.name}.{SafeCsvExportPlugin.__qualname__}"


@dataclass
class Export:
    """What :func:`export` wrote."""

    files: list[Path] = field(default_factory=list)
    students: int = 0
    graded: list[str] = field(default_factory=list)
    without_submissions: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        line = (f"grades: {', '.join(p.name for p in self.files)}: {self.students} students, "
                f"assignments with submissions: {', '.join(self.graded) or 'none'}")
        if self.without_submissions:
            line += f"; no submissions for: {', '.join(self.without_submissions)}"
        return line


def canvas_ids(root: Path = ROOT) -> dict[str, str]:
    """nbgrader student id -> Canvas user id, from the files ``make collect-zip`` extracted."""
    found: dict[str, str] = {}
    for path in sorted((root / "downloaded").glob("*/extracted/**/*")):
        match = CANVAS_NAME.match(path.name)
        if match:
            found.setdefault(match["student"], match["user"])
    return found


def _points(value: float) -> int | float:
    """Points as a number: whole points without ``.0``."""
    return int(value) if float(value).is_integer() else float(value)


def canvas_rows(gradebook, names: list[str], ids: dict[str, str]) -> list[list[Any]]:
    """The rows of ``grades-canvas.csv`` for the assignments ``names`` (header and points first)."""
    from nbgrader.api import MissingEntry

    rows = [CANVAS_COLUMNS + names,
            ["Points Possible", "", "", "", ""] + [_points(gradebook.find_assignment(a).max_score) for a in names]]
    for student in sorted(gradebook.students, key=lambda s: s.id):
        name = ", ".join(p for p in (student.last_name, student.first_name) if p) or student.id
        row = [name, ids.get(student.id, ""), "", student.id, ""]
        for assignment in names:
            try:
                submission = gradebook.find_submission(assignment, student.id)
            except MissingEntry:
                row.append("")
                continue
            row.append(_points(max(submission.score - (submission.late_submission_penalty or 0), 0.0)))
        rows.append(row)
    return rows


def export(root: Path = ROOT, db_url: str | None = None) -> Export:
    """Write ``grades.csv`` with nbgrader and ``grades-canvas.csv`` beside it; say what they hold."""
    from nbgrader.api import Gradebook

    from .grade import db_url as course_db_url

    db_url = db_url or course_db_url(Settings.load(root))
    done = nbgrader("export", "--to", str(root / "grades.csv"), f"--db={db_url}", "--log-level=WARN",
                    f"--exporter={EXPORTER}", root=root, check=False)
    if done.returncode != 0:
        raise RuntimeError("nbgrader export failed: " + " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:]))
    result = Export(files=[root / "grades.csv", root / CANVAS_FILE])
    with Gradebook(db_url) as gradebook:
        known = {a.name for a in gradebook.assignments}
        with_submissions = {a.name for a in gradebook.assignments if a.num_submissions}
        order = assignments(root) + sorted(known - set(assignments(root)))
        result.graded = [a for a in order if a in with_submissions]
        result.without_submissions = [a for a in order if a not in with_submissions]
        rows = canvas_rows(gradebook, result.graded, canvas_ids(root))
        result.students = len(rows) - 2
    write_csv(root / CANVAS_FILE, rows)
    return result
