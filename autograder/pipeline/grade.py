"""``make autograde``: grade every submission with nbgrader, several at a time.

Each submission is graded by its own ``nbgrader autograde ASSIGNMENT --student ID``
process, so one submission can never take another down. The SQLite gradebook is opened
with a long busy timeout, so parallel writers wait for each other instead of failing
with "database is locked".
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from .course import ROOT, assignments, nbgrader

#: Seconds a SQLite writer waits for another one before giving up.
SQLITE_BUSY_TIMEOUT = 300


def db_url(root: Path = ROOT) -> str:
    """The gradebook URL: ``NBGRADER_DB_URL`` if set, else SQLite in the course with a busy timeout."""
    return os.environ.get("NBGRADER_DB_URL") or f"sqlite:///{root / 'gradebook.db'}?timeout={SQLITE_BUSY_TIMEOUT}"


@dataclass
class Summary:
    """What a grading run did."""

    graded: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        lines = [f"graded {len(self.graded)}, failed {len(self.failed)}, in {self.seconds:.1f} s"]
        lines += [f"  FAILED {a} / {s}: {why}" for a, s, why in self.failed]
        return "\n".join(lines)


def submissions(root: Path = ROOT, names: list[str] | None = None) -> list[tuple[str, str]]:
    """Every (assignment, student) with a folder in ``submitted/``, sorted."""
    wanted = set(names or assignments(root))
    found = []
    submitted = root / "submitted"
    if submitted.is_dir():
        for student in sorted(p for p in submitted.iterdir() if p.is_dir()):
            for folder in sorted(p for p in student.iterdir() if p.is_dir() and p.name in wanted):
                found.append((folder.name, student.name))
    return found


def _progress(done: int, total: int, failed: int, start: float) -> None:
    elapsed = time.monotonic() - start
    eta = elapsed / done * (total - done) if done else 0.0
    width = 30
    bar = "#" * (width * done // max(total, 1))
    sys.stderr.write(f"\r[{bar:<{width}}] {done}/{total} graded, {failed} failed, ETA {eta:5.0f} s")
    sys.stderr.flush()


def grade_one(assignment: str, student: str, root: Path = ROOT) -> str | None:
    """Autograde one submission; return None on success or nbgrader's last error lines."""
    done = nbgrader("autograde", assignment, "--student", student, "--force", f"--db={db_url(root)}",
                    "--log-level=WARN", root=root, check=False)
    if done.returncode == 0:
        return None
    tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
    return " | ".join(tail) or f"nbgrader exited with {done.returncode}"


def autograde(names: list[str] | None = None, workers: int | None = None, root: Path = ROOT,
              progress: bool = True) -> Summary:
    """Grade every submission of the named assignments with ``workers`` processes at once."""
    jobs = submissions(root, names)
    workers = workers or os.cpu_count() or 1
    summary = Summary()
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(grade_one, a, s, root): (a, s) for a, s in jobs}
        for future in as_completed(futures):
            assignment, student = futures[future]
            error = future.result()
            if error is None:
                summary.graded.append((assignment, student))
            else:
                summary.failed.append((assignment, student, error))
            if progress:
                _progress(len(summary.graded) + len(summary.failed), len(jobs), len(summary.failed), start)
    if progress and jobs:
        sys.stderr.write("\n")
    summary.graded.sort()
    summary.failed.sort()
    summary.seconds = time.monotonic() - start
    return summary


def feedback(names: list[str] | None = None, root: Path = ROOT) -> None:
    """Write ``feedback/<student>/<assignment>/*.html`` for every graded submission."""
    for assignment in names or assignments(root):
        nbgrader("generate_feedback", assignment, "--force", f"--db={db_url(root)}", "--log-level=WARN", root=root)
