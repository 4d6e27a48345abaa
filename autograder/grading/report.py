"""``make report``: one HTML page about a graded class, to plan the next lecture (``report/index.html``).

For each assignment with graded submissions, and each exercise in it:

- the **distribution of scores** (points of the exercise's test cells, visible and hidden), as a
  figure (``report/<assignment>-scores.png``) and a table;
- the **cases that fail most often**: each case of the exercise's checks that some student failed,
  with how many, read from the grader's record of a check's cases (:mod:`.case_results`; a test
  cell without one is a single case, "visible checks" or "hidden checks");
- the **named mistakes**: how many students made each and the section that teaches it, counted
  by the mistake's id from the records the grader keeps in a judged test cell
  (:func:`autograder.engine.judge.named_mistakes`, and the mistakes a failed case fits), never
  from the words of a message, which a student's code could print;
- the **other failures**, counted by message (numbers in a message are replaced by ``#``, so the
  same failure on other values counts once): the errors of test cells without a record of cases,
  and the reason a whole cell scored nothing though cases passed (a forbidden call, ...),
  leaving out those of students whose mistake on that exercise was named (the visible check's
  failure of a named mistake is one of its symptoms);

then the submissions that **could not be graded** (a grading note of kind ``failed``, or a
submission with no graded notebook), and the **time** grading took, as far as the graded
folders record it (when each submission's grading notes were written).
"""

from __future__ import annotations

import html
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..course.repository import ROOT, assignments
from ..course.settings import Settings
from ..engine import notes as grading_notes
from ..engine.judge import named_mistakes
from .case_results import catalogued, exercise_of, failure_text, is_test_cell, read_judged_cell
from .feedback import with_policy, write_text

#: The page's Content-Security-Policy: no script at all, its own style and figures, nothing from elsewhere
#: (a message quoted in a table is escaped; the policy stops whatever might get past that).
REPORT_POLICY = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", re.I)


@dataclass
class Exercise:
    """What the class did on one exercise."""

    name: str
    max_points: float = 0.0
    points: dict[str, float] = field(default_factory=dict)  # student -> points of the exercise's test cells
    mistakes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # mistake id -> students
    names: dict[str, str] = field(default_factory=dict)  # mistake id -> its name
    sections: dict[str, str] = field(default_factory=dict)  # mistake id -> section
    failures: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # message -> students
    cases: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))  # (checks, case) -> students


@dataclass
class Assignment:
    name: str
    exercises: dict[str, Exercise] = field(default_factory=dict)
    students: list[str] = field(default_factory=list)


@dataclass
class ClassReport:
    """Everything the page shows."""

    assignments: list[Assignment] = field(default_factory=list)
    ungraded: list[tuple[str, str, str]] = field(default_factory=list)  # (assignment, student, why)
    finished: list[float] = field(default_factory=list)  # when each submission's grading ended (epoch s)

    def __str__(self) -> str:
        named = sum(len(s) for a in self.assignments for e in a.exercises.values() for s in e.mistakes.values())
        other = sum(len(s) for a in self.assignments for e in a.exercises.values() for s in e.failures.values())
        cases = sum(len(s) for a in self.assignments for e in a.exercises.values() for s in e.cases.values())
        submissions = sum(len(a.students) for a in self.assignments)
        return (f"report: report/index.html: {submissions} graded submissions of {len(self.assignments)} assignments; "
                f"{cases} failed cases, {named} named mistakes, {other} other failures, "
                f"{len(self.ungraded)} could not be graded")


def uncatalogued(text: str) -> str:
    """A failure's message with its numbers replaced, so that the same failure groups together."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return NUMBER.sub("#", " ".join(lines))[:400]


def read_cells(path: Path, assignment: Assignment, student: str) -> None:
    """Failed cases, named mistakes and other failures in the test cells of one graded notebook."""
    import nbformat

    notebook = nbformat.reads(path.read_bytes().decode("utf-8", "replace"), as_version=4)
    for cell in notebook.cells:
        if not is_test_cell(cell):
            continue
        judged = read_judged_cell(cell)
        exercise = assignment.exercises.setdefault(judged.exercise, Exercise(judged.exercise))  # the notebook's order
        checks = "hidden" if judged.hidden else "visible"
        for case in judged.failed:
            exercise.cases[(checks, case.name)].add(student)
        named = {m["id"]: m for m in named_mistakes(cell)}
        for case in judged.failed:
            for ident, name in zip(case.mistake_ids, case.mistakes):
                found = catalogued(ident)
                named.setdefault(ident, {"id": ident, "name": name, "section": found.section if found else ""})
        for ident, mistake in named.items():  # a failure may name more than one mistake
            exercise.mistakes[ident].add(student)
            exercise.names.setdefault(ident, str(mistake.get("name", ident)))
            exercise.sections.setdefault(ident, str(mistake.get("section", "")))
        # The cases say what failed in a cell with a record; its error only says why it scored nothing.
        text = judged.stopped if judged.recorded else failure_text(cell)
        if text and not named:
            exercise.failures[uncatalogued(text)].add(student)


def collect(names: list[str] | None = None, root: Path = ROOT, db_url: str | None = None) -> ClassReport:
    """Read the gradebook and the graded notebooks of ``names`` (default: every assignment)."""
    from nbgrader.api import Gradebook, MissingEntry

    from .grade import db_url as course_db_url

    report = ClassReport()
    with Gradebook(db_url or course_db_url(Settings.load(root))) as gb:
        known = {a.name for a in gb.assignments}
        for name in names or assignments(root):
            submitted = sorted(p.parent.name for p in (root / "submitted").glob(f"*/{name}") if p.is_dir())
            graded = sorted(p.parent.name for p in (root / "autograded").glob(f"*/{name}") if p.is_dir())
            assignment = Assignment(name)
            for student in graded:
                folder = root / "autograded" / student / name
                notes = grading_notes.read_notes(folder)
                report.ungraded += [(name, student, n.message) for n in notes if n.kind == "failed"]
                notes_file = folder / grading_notes.NOTES_FILE
                if notes_file.is_file():
                    report.finished.append(notes_file.stat().st_mtime)
                notebooks = sorted(p for p in folder.glob("*.ipynb") if p.is_file() and not p.is_symlink())
                if not notebooks:
                    if not any(n.kind == "failed" for n in notes):
                        report.ungraded.append((name, student, "no graded notebook"))
                    continue
                assignment.students.append(student)
                for path in notebooks:
                    read_cells(path, assignment, student)
                if name not in known:
                    continue
                try:
                    submission = gb.find_submission(name, student)
                except MissingEntry:
                    continue
                for notebook in submission.notebooks:
                    for grade in notebook.grades:
                        if grade.cell_type == "markdown" or not grade.name.startswith("test_"):
                            continue
                        exercise = assignment.exercises.setdefault(exercise_of(grade.name), Exercise(exercise_of(grade.name)))
                        exercise.points[student] = exercise.points.get(student, 0.0) + (grade.score or 0.0)
            for exercise in assignment.exercises.values():
                if name in known:
                    cells = [c for nb in gb.find_assignment(name).notebooks for c in nb.grade_cells
                             if c.name.startswith("test_") and exercise_of(c.name) == exercise.name]
                    exercise.max_points = sum(c.max_score for c in cells)
            for exercise in assignment.exercises.values():
                # A student whose mistake was named on this exercise: their other failures are its symptoms.
                named = set().union(*exercise.mistakes.values()) if exercise.mistakes else set()
                exercise.failures = defaultdict(set, {m: s - named for m, s in exercise.failures.items() if s - named})
            report.ungraded += [(name, s, "submitted, but no graded copy in autograded/ (run make autograde)")
                                for s in submitted if s not in graded]
            if assignment.students:
                report.assignments.append(assignment)
    return report


# -- the page ------------------------------------------------------------------------------


def scores_figure(assignment: Assignment, path: Path) -> None:
    """One histogram of points per exercise, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    exercises = [e for e in assignment.exercises.values() if e.max_points]
    if not exercises:
        return
    columns = min(4, len(exercises))
    rows = -(-len(exercises) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.4 * rows), squeeze=False)
    for ax, exercise in zip(axes.flat, exercises):
        values = [exercise.points.get(s, 0.0) for s in assignment.students]
        bins = sorted(set(values) | {0.0, exercise.max_points})
        counts = Counter(values)
        ax.bar([f"{b:g}" for b in bins], [counts.get(b, 0) for b in bins], color="#4477aa")
        ax.set_title(exercise.name, fontsize=9)
        ax.set_xlabel(f"points (of {exercise.max_points:g})", fontsize=8)
        ax.set_ylabel("students", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in list(axes.flat)[len(exercises):]:
        ax.axis("off")
    fig.suptitle(f"{assignment.name}: points per exercise", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(header: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def exercise_html(assignment: Assignment, exercise: Exercise) -> str:
    e = html.escape
    parts = [f"<h3>{e(exercise.name)}</h3>"]
    if exercise.max_points:
        values = [exercise.points.get(s, 0.0) for s in assignment.students]
        full = sum(v >= exercise.max_points for v in values)
        mean = sum(values) / len(values) if values else 0.0
        parts.append(f"<p>{full} of {len(values)} students have full marks ({exercise.max_points:g} points); "
                     f"mean {mean:.2f}.</p>")
        counts = Counter(values)
        parts.append(_table(["points", "students"], [[f"{p:g}", str(counts[p])] for p in sorted(counts)]))
    if exercise.cases:
        rows = sorted(((len(s), checks, case) for (checks, case), s in exercise.cases.items()),
                      key=lambda r: (-r[0], r[1], r[2]))
        parts.append("<h4>Cases that fail most often</h4>" + _table(
            ["case", "checks", "students who failed it"], [[case, checks, str(count)] for count, checks, case in rows]))
    if exercise.mistakes:
        rows = sorted(((len(s), exercise.names.get(i, i), i) for i, s in exercise.mistakes.items()),
                      key=lambda r: (-r[0], r[1]))
        parts.append("<h4>Named mistakes</h4>" + _table(
            ["mistake", "students", "section that teaches it"],
            [[name, str(count), exercise.sections.get(i, "")] for count, name, i in rows]))
    if exercise.failures:
        rows = sorted(((len(s), m) for m, s in exercise.failures.items()), key=lambda r: (-r[0], r[1]))
        parts.append("<h4>Other failures, by message</h4>" + _table(["students", "message (numbers as #)"],
                                                                     [[str(c), m] for c, m in rows]))
    return "\n".join(parts)


CSS = """body { font-family: sans-serif; max-width: 70em; margin: 1em auto; padding: 0 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; } td, th { border: 1px solid #ccc; padding: 0.2em 0.6em;
text-align: left; vertical-align: top; } td { white-space: pre-wrap; overflow-wrap: anywhere; }
img { max-width: 100%; }"""


def page(report: ClassReport, similarity: bool = False) -> str:
    """The class page; ``similarity``: ``report/similarity/index.html`` exists, and is linked."""
    e = html.escape
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Class report</title><style>{CSS}</style>"
             "</head><body><h1>Class report</h1>"]
    parts.append("<p><a href='similarity/index.html'>Similar answers, exercise by exercise</a>, and answers that match "
                 "the reference solution (<code>make similarity</code>).</p>" if similarity else
                 "<p>Similar answers, exercise by exercise: run <code>make similarity</code>, and this page links to "
                 "them.</p>")
    if report.finished:
        first, last = min(report.finished), max(report.finished)
        stamp = "%Y-%m-%d %H:%M:%S"
        parts.append(f"<p>Grading: {len(report.finished)} submissions finished between "
                     f"{e(time.strftime(stamp, time.localtime(first)))} and {e(time.strftime(stamp, time.localtime(last)))} "
                     f"({last - first:.0f} s from the first to the last).</p>")
    for assignment in report.assignments:
        parts.append(f"<h2>{e(assignment.name)} ({len(assignment.students)} graded submissions)</h2>")
        parts.append(f"<img src='{e(assignment.name)}-scores.png' alt='points per exercise of {e(assignment.name)}'>")
        parts += [exercise_html(assignment, x) for x in assignment.exercises.values()]
    parts.append("<h2>Submissions that could not be graded</h2>")
    parts.append(_table(["assignment", "student", "why"], [list(u) for u in report.ungraded])
                 if report.ungraded else "<p>None.</p>")
    parts.append("</body></html>")
    return with_policy("\n".join(parts), REPORT_POLICY)


def write_report(names: list[str] | None = None, root: Path = ROOT, db_url: str | None = None) -> ClassReport:
    """Write ``report/index.html`` and its figures; return what they show."""
    report = collect(names, root, db_url)
    folder = root / "report"
    folder.mkdir(exist_ok=True)
    for assignment in report.assignments:
        scores_figure(assignment, folder / f"{assignment.name}-scores.png")
    write_text(folder / "index.html", page(report, similarity=(folder / "similarity" / "index.html").is_file()))
    return report


if __name__ == "__main__":
    import sys

    print(write_report(sys.argv[1:] or None))
