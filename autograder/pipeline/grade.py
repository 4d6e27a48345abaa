"""``make autograde``: grade a whole class with nbgrader, in parallel, against hostile submissions.

Each submission is graded by its own ``nbgrader autograde ASSIGNMENT --student ID`` process,
several at a time (a thread pool of ``workers``, default: the number of cores), so one
submission can never take another down. For each submission (:func:`grade_one`):

1. :func:`autograder.pipeline.integrity.stage` copies it to a private folder that nbgrader
   reads instead of ``submitted/``: regular files only, a renamed notebook recognised, the
   locked test cells and their metadata restored;
2. nbgrader grades that copy (its process forked from a server that has imported nbgrader
   once, :mod:`autograder.pipeline.forkserver`; ``AUTOGRADER_FORKSERVER=0`` starts each one
   afresh instead). Its ``Execute`` is :class:`~autograder.pipeline.execute.ResilientExecute`
   (``nbgrader_config.py``): the kernel runs in the sandbox of :mod:`autograder.pipeline.sandbox`,
   survives crashes and hangs of the student's code, and the notebook has a time limit; this
   module adds a last wall-clock limit on the whole nbgrader process;
3. when the student's code could tamper with the checks (:func:`~autograder.pipeline.integrity.scan`),
   the notebook is run again where it cannot (:mod:`autograder.pipeline.recheck`) and every
   test cell that does not pass there scores 0;
4. what happened is kept with the graded submission and shown at the top of its feedback.

A submission that cannot be graded at all scores 0 with a note saying why; the run always
ends with a :class:`Summary`. The SQLite gradebook is opened with a long busy timeout, so
parallel writers wait for each other instead of failing with "database is locked".
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import integrity, sandbox
from .course import ROOT, assignments, nbgrader, tool_env
from .forkserver import ForkServer
from .integrity import Note

#: Seconds a SQLite writer waits for another one before giving up.
SQLITE_BUSY_TIMEOUT = 300
#: Default time limit of one notebook (restarts included); ``ResilientExecute.notebook_timeout``.
NOTEBOOK_TIMEOUT = 600
#: Seconds added to the notebook limits before the whole nbgrader process is killed.
NBGRADER_MARGIN = 120
RUN_VARIABLE = sandbox.RUN_VARIABLE
#: When to run the protected re-check: only for code that could tamper, for every submission, or never.
RECHECK_MODES = ("suspicious", "always", "never")
#: The server that starts nbgrader processes during a run (None: plain subprocesses).
_server: ForkServer | None = None


def db_url(root: Path = ROOT) -> str:
    """The gradebook URL: ``NBGRADER_DB_URL`` if set, else SQLite in the course with a busy timeout."""
    return os.environ.get("NBGRADER_DB_URL") or f"sqlite:///{root / 'gradebook.db'}?timeout={SQLITE_BUSY_TIMEOUT}"


@dataclass
class Options:
    """How to grade: time limits and when to re-check."""

    cell_timeout: int | None = None  # seconds per cell (None: nbgrader_config.py's Execute.timeout)
    notebook_timeout: int = NOTEBOOK_TIMEOUT
    recheck: str = "suspicious"


@dataclass
class Outcome:
    """What grading one submission did."""

    assignment: str
    student: str
    error: str | None = None
    notes: list[Note] = field(default_factory=list)
    rechecked: bool = False
    zeroed: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Summary:
    """What a grading run did."""

    graded: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    seconds: float = 0.0
    outcomes: dict[tuple[str, str], Outcome] = field(default_factory=dict)

    @property
    def rechecked(self) -> list[tuple[str, str]]:
        return sorted(k for k, o in self.outcomes.items() if o.rechecked)

    @property
    def zeroed(self) -> dict[tuple[str, str], list[str]]:
        return {k: o.zeroed for k, o in sorted(self.outcomes.items()) if o.zeroed}

    def __str__(self) -> str:
        total = len(self.graded) + len(self.failed)
        rate = total / self.seconds * 60 if self.seconds else 0.0
        lines = [f"graded {len(self.graded)}, failed {len(self.failed)}, in {self.seconds:.1f} s "
                 f"({rate:.1f} submissions per minute); re-checked {len(self.rechecked)}, "
                 f"test cells set to 0 by the re-check: {sum(len(v) for v in self.zeroed.values())}"]
        lines += [f"  FAILED {a} / {s}: {why}" for a, s, why in self.failed]
        for (a, s), outcome in sorted(self.outcomes.items()):
            for note in outcome.notes:
                lines.append(f"  {a} / {s}: {note.message}")
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


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _run_nbgrader(assignment: str, student: str, root: Path, staging: Path, options: Options, limit: float
                  ) -> str | None:
    """``nbgrader autograde`` on the staged copy; None on success, else what went wrong."""
    args = [sys.executable, "-m", "nbgrader", "autograde", assignment, "--student", student, "--force",
            f"--db={db_url(root)}", "--log-level=WARN", f"--CourseDirectory.submitted_directory={staging}",
            f"--ResilientExecute.notebook_timeout={options.notebook_timeout}"]
    if options.cell_timeout:
        args.append(f"--Execute.timeout={options.cell_timeout}")
    token = uuid.uuid4().hex
    env = tool_env()
    env[RUN_VARIABLE] = token
    server = _server
    try:
        if server is not None and server.process.poll() is None:
            code, out, err = server.run(args[3:], root, env, limit, staging)
        else:
            proc = subprocess.Popen(args, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                out, err = proc.communicate(timeout=limit)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                out, err = proc.communicate()
                code = None
            finally:
                _kill_group(proc.pid)
    finally:
        sandbox.kill_leftovers(token, RUN_VARIABLE)
    if code is None:
        return f"grading took longer than {limit:.0f} s and was stopped"
    if code == 0:
        return None
    tail = [line for line in (err or out).strip().splitlines() if line.strip()][-5:]
    return " | ".join(tail) or f"nbgrader exited with {code}"


def _record_zero(root: Path, assignment: str, student: str) -> None:
    """Make sure the submission is in the gradebook, every grade nbgrader did not set being 0."""
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.utils import parse_utc

    stamp = root / "submitted" / student / assignment / "timestamp.txt"
    timestamp = None
    if stamp.is_file() and not stamp.is_symlink():
        try:
            timestamp = parse_utc(stamp.read_text().strip())
        except Exception:  # noqa: BLE001 - an unreadable timestamp is no timestamp
            timestamp = None
    with Gradebook(db_url(root)) as gb:
        try:
            gb.find_submission(assignment, student)
        except MissingEntry:
            gb.update_or_create_submission(assignment, student, **({"timestamp": timestamp} if timestamp else {}))
        for notebook in gb.find_submission(assignment, student).notebooks:
            for grade in notebook.grades:
                if grade.auto_score is None and grade.manual_score is None:
                    grade.auto_score = 0.0
                    grade.needs_manual_grade = False
        gb.db.commit()


def _after_nbgrader(outcome: Outcome, root: Path, staged: list[str], options: Options) -> None:
    """Notes on how the notebooks ran, and the protected re-check where it is needed."""
    releases = integrity.release_notebooks(root, outcome.assignment)
    folder = root / "autograded" / outcome.student / outcome.assignment
    for name in staged:
        path = folder / f"{name}.ipynb"
        if not path.is_file():
            continue
        notebook = nbformat.read(path, as_version=4)
        outcome.notes += integrity.runtime_notes(notebook)
        findings = integrity.scan(notebook, releases[name]) if name in releases else []
        if options.recheck == "never" or (options.recheck == "suspicious" and not findings):
            continue
        outcome.rechecked = True
        cell_timeout = options.cell_timeout or 60
        verdicts, problem = integrity.recheck(notebook, outcome.assignment, root, cell_timeout,
                                              timeout=options.notebook_timeout)
        notes, zeroed = integrity.reconcile(db_url(root), outcome.assignment, outcome.student, name, notebook,
                                            verdicts, problem)
        if findings and zeroed:
            notes.append(Note("code", "The code that can change the checks: " + "; ".join(findings[:5])))
        outcome.notes += notes
        outcome.zeroed += zeroed
        if zeroed:
            nbformat.write(notebook, path)


def grade_one(assignment: str, student: str, root: Path = ROOT, options: Options | None = None) -> Outcome:
    """Grade one submission (see the module doc); never raises, the outcome says what went wrong."""
    options = options or Options()
    started = time.monotonic()
    outcome = Outcome(assignment, student)
    staging = Path(tempfile.mkdtemp(prefix="autograder-staging-"))
    try:
        staged = integrity.stage(root, assignment, student, staging)
        outcome.notes += staged.notes
        if staged.notebooks:
            limit = options.notebook_timeout * len(staged.notebooks) + NBGRADER_MARGIN
            outcome.error = _run_nbgrader(assignment, student, root, staging, options, limit)
            if outcome.error is None:
                _after_nbgrader(outcome, root, staged.notebooks, options)
            else:
                outcome.notes.append(Note("failed", f"This submission could not be graded ({outcome.error}); "
                                                    "what nbgrader had not graded scores 0."))
        if outcome.error is not None or not staged.notebooks:
            _record_zero(root, assignment, student)
    except Exception as error:  # noqa: BLE001 - one submission must never stop the class
        outcome.error = f"{type(error).__name__}: {error}"
        outcome.notes.append(Note("failed", f"This submission could not be graded ({outcome.error})."))
        try:
            _record_zero(root, assignment, student)
        except Exception:  # noqa: BLE001 - the failure is already recorded
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    try:
        integrity.write_notes(root / "autograded" / student / assignment, outcome.notes)
    except OSError as error:
        outcome.error = outcome.error or f"could not keep the grading notes: {error}"
    outcome.seconds = time.monotonic() - started
    return outcome


def prepare_gradebook(jobs: list[tuple[str, str]], root: Path = ROOT) -> None:
    """Create the gradebook's schema and every student once, before parallel writers start."""
    from nbgrader.api import Gradebook

    # nbgrader.api runs `alembic` by name when it creates a gradebook: this environment's first.
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

    with Gradebook(db_url(root)) as gb:
        for student in sorted({s for _, s in jobs}):
            gb.update_or_create_student(student)


def autograde(names: list[str] | None = None, workers: int | None = None, root: Path = ROOT,
              progress: bool = True, options: Options | None = None, students: list[str] | None = None) -> Summary:
    """Grade every submission of the named assignments (of ``students``, default all) with ``workers`` at once."""
    options = options or Options()
    if options.recheck not in RECHECK_MODES:
        raise ValueError(f"recheck must be one of {RECHECK_MODES}, not {options.recheck!r}")
    jobs = [(a, s) for a, s in submissions(root, names) if students is None or s in students]
    workers = workers or os.cpu_count() or 1
    summary = Summary()
    start = time.monotonic()
    global _server
    if jobs and os.environ.get("AUTOGRADER_FORKSERVER", "1") != "0":
        try:
            _server = ForkServer()  # first, so that its imports overlap with preparing the gradebook
        except OSError:
            _server = None
    try:
        if jobs:
            prepare_gradebook(jobs, root)
        _grade_all(jobs, workers, root, options, progress, summary, start)
    finally:
        if _server is not None:
            _server.close()
            _server = None
    summary.graded.sort()
    summary.failed.sort()
    summary.seconds = time.monotonic() - start
    return summary


def _grade_all(jobs, workers, root, options, progress, summary, start) -> None:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(grade_one, a, s, root, options): (a, s) for a, s in jobs}
        for future in as_completed(futures):
            assignment, student = futures[future]
            outcome = future.result()
            summary.outcomes[(assignment, student)] = outcome
            if outcome.error is None:
                summary.graded.append((assignment, student))
            else:
                summary.failed.append((assignment, student, outcome.error))
            if progress:
                _progress(len(summary.graded) + len(summary.failed), len(jobs), len(summary.failed), start)
    if progress and jobs:
        sys.stderr.write("\n")


def feedback(names: list[str] | None = None, root: Path = ROOT) -> list[str]:
    """Write ``feedback/<student>/<assignment>/*.html`` for every graded submission; return the errors.

    The grading notes of a submission are put at the top of each of its feedback pages; a
    submission with no notebook to show gets a page with its notes alone.
    """
    errors = []
    for assignment in names or assignments(root):
        done = nbgrader("generate_feedback", assignment, "--force", f"--db={db_url(root)}", "--log-level=WARN",
                        root=root, check=False)
        if done.returncode != 0:
            errors.append(f"{assignment}: " + " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:]))
        autograded = root / "autograded"
        if not autograded.is_dir():
            continue
        for folder in sorted(autograded.glob(f"*/{assignment}")):
            notes = integrity.read_notes(folder)
            if not notes:
                continue
            target = root / "feedback" / folder.parent.name / assignment
            target.mkdir(parents=True, exist_ok=True)
            block = integrity.notes_html(notes)
            pages = [p for p in target.glob("*.html") if not p.is_symlink()]
            for page in pages:
                text = page.read_text()
                at = text.find(">", text.find("<body")) + 1 if "<body" in text else 0
                page.write_text(text[:at] + block + text[at:])
            if not pages:
                (target / f"{assignment}.html").write_text(
                    f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{assignment}</title></head>"
                    f"<body>{block}</body></html>")
    return errors


#: How a learning platform names the files of a "download all submissions" zip, as a regular
#: expression for nbgrader's ``FileNameCollectorPlugin.named_regexp`` (matched against the
#: whole path of each extracted file). The default is Canvas's
#: ``<name>_[LATE_]<user id>_<submission id>_<file name>[-<n>].ipynb``, for example
#: ``doejane_1234_567890_01_soft_lookup.ipynb`` or ``doejane_LATE_1234_567891_01_soft_lookup-1.ipynb``
#: (``-1``: a resubmission); the student id is the name part. A student id must start with a
#: letter or digit, so no file name can point outside ``submitted/``.
LMS_PATTERN = (r".*/(?P<student_id>[A-Za-z0-9][A-Za-z0-9.-]*)_(?:LATE_)?[0-9]+_[0-9]+_"
               r"(?P<file_id>[A-Za-z0-9_ .()-]+?)(?:-[0-9]+)?\.ipynb$")


def collect_zip(assignment: str, archive: Path, pattern: str = LMS_PATTERN, root: Path = ROOT) -> list[str]:
    """Put the submissions of an LMS zip into ``submitted/`` with nbgrader's ``zip_collect``.

    Returns every student with a submission of ``assignment`` afterwards.


    The zip is copied to ``downloaded/<assignment>/archive/`` and extracted there by nbgrader;
    each ``.ipynb`` whose name matches ``pattern`` (see :data:`LMS_PATTERN`) becomes
    ``submitted/<student_id>/<assignment>/<file>.ipynb``. Files that do not match are skipped
    (nbgrader logs them).
    """
    target = root / "downloaded" / assignment / "archive"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive, target / Path(archive).name)
    done = nbgrader("zip_collect", assignment, "--force", "--log-level=WARN",
                    f"--FileNameCollectorPlugin.named_regexp={pattern}", root=root, check=False)
    if done.returncode != 0:
        raise RuntimeError(" | ".join((done.stderr or done.stdout).strip().splitlines()[-3:]))
    return sorted(p.parent.name for p in (root / "submitted").glob(f"*/{assignment}"))
