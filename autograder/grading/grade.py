"""``make autograde``: grade a whole class with nbgrader, in parallel, against hostile submissions.

Each submission is graded by its own ``nbgrader autograde ASSIGNMENT --student ID`` process,
several at a time (a thread pool of ``workers``, default: the number of cores), so one
submission can never take another down. For each submission (:func:`grade_one`):

1. :func:`autograder.engine.staging.stage` copies it to a private folder that nbgrader
   reads instead of ``submitted/``: regular files only, a renamed notebook recognised, the
   locked test cells and their metadata restored, every string made valid UTF-8;
2. nbgrader grades that copy (its process forked from a server that has imported nbgrader,
   PyTorch and the checks once, :mod:`autograder.engine.forkserver`;
   ``AUTOGRADER_FORKSERVER=0`` starts each one afresh instead). Its ``Execute`` is
   :class:`~autograder.engine.execute.ResilientExecute` (``nbgrader_config.py``): the
   student's cells run in the sandbox of :mod:`autograder.engine.sandbox` and survive
   crashes and hangs; the test cells run in nbgrader's own process, which calls the student's
   functions in the sandbox and judges what comes back (:mod:`autograder.engine.judge`).
   This module adds a last wall-clock limit on the whole nbgrader process;
3. what happened is kept with the graded submission and shown at the top of its feedback.

How nbgrader is run on the staged copy is a :class:`Runner`: here, several at a time (the
default), or on a Dask cluster (:func:`autograder.grading.cluster.autograde` gives
:func:`autograde` its runner; this module does not import that one), which grades each staged
copy on a worker and hands back the graded notebook and the scores that are then written here;
staging, the notes, the progress bar and the summary are the same either way.

Grading refuses to start where no sandbox can be made, unless the instructor says
``sandbox=False`` (``--no-sandbox``). A submission without a notebook to grade scores 0 with a
note saying why. A submission that could not be graded because something failed around it
(nbgrader stopped, the disk was full, the process ran out of time) gets no score at all: the
summary lists it under "could not be graded: grade again", so no honest student is given a 0
by an accident. The run always ends with a :class:`Summary`. The SQLite gradebook is opened
with a long busy timeout, so parallel writers wait for each other.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from ..course.repository import ROOT, assignments, nbgrader, tool_env
from ..course.settings import Grading, Settings
from ..engine import notes, sandbox, staging
from ..engine.forkserver import ForkServer
from ..engine.notes import Note, NoteKind, inert_text, safe_text
from . import runs

RUN_VARIABLE = sandbox.RUN_VARIABLE


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made on this machine, and the instructor did not accept grading without one."""


def db_url(settings: Settings) -> str:
    """The gradebook URL of ``nbgrader_config.py`` (``NBGRADER_DB_URL`` there), a SQLite one with a busy timeout."""
    from nbgrader.coursedir import CourseDirectory

    url = settings.value(CourseDirectory, "db_url") or f"sqlite:///{settings.root / 'gradebook.db'}"
    if url.startswith("sqlite:") and "?" not in url:
        url += f"?timeout={settings.value(Grading, 'sqlite_busy_timeout')}"
    return url


def bubblewrap(settings: Settings) -> bool:
    """Whether ``settings`` run the student's code in bubblewrap where it can be made."""
    from ..engine.kernel_manager import SandboxedKernelManager

    return settings.value(SandboxedKernelManager, "bubblewrap")


def protection(settings: Settings, mode: str) -> str:
    """Which protection grading runs student code under, in words (for the summary and the feedback).

    ``mode`` is :func:`sandbox.mode` where the student's code runs.
    """
    sandboxed = settings.value(Grading, "sandbox")
    where = ("test cells run in the grader's process; the student's code, in a bubblewrap sandbox"
             if sandboxed and mode != "limits only" else
             "test cells run in the grader's process; the student's code WITHOUT a sandbox (resource limits only)")
    return f"{where} ({mode if sandboxed else 'limits only'})"


class Runner:
    """Runs nbgrader on a staged submission, here: each run forked from ``server`` (else a new process).

    A runner leaves the graded notebooks in ``autograded/`` and the grades in the gradebook, and
    returns None, or why the submission could not be graded.
    :class:`autograder.grading.cluster.ClusterRunner` is the other one.
    """

    server: ForkServer | None = None
    run: runs.Run | None = None  # the run it belongs to (:mod:`autograder.grading.runs`), if any

    def __init__(self, server: ForkServer | None = None, run: runs.Run | None = None) -> None:
        self.server = server
        self.run = run

    @classmethod
    def start(cls, settings: Settings, assignments: Sequence[str] | None = None) -> Runner:
        """A runner registered as a run of the course of ``settings`` (:mod:`autograder.grading.runs`), with its
        fork server, which imports the checks of ``assignments`` ahead (None: of every one).

        A run stopped earlier is cleaned up first; :meth:`close` ends this one.
        """
        run = runs.start(settings.root)
        return cls(fork_server(settings, env=run.environment(dict(os.environ)), assignments=assignments), run)

    def mode(self, settings: Settings) -> str:
        """:func:`sandbox.mode` where this runner runs the student's code with ``settings``."""
        return sandbox.mode(bubblewrap(settings))

    def __call__(self, assignment: str, student: str, settings: Settings, staged: Path, limit: float) -> str | None:
        return run_nbgrader(assignment, student, settings, staged, limit, self.server, self.run)

    def close(self) -> None:
        try:
            if self.server is not None:
                self.server.close()
        finally:
            if self.run is not None:
                self.run.close()


@dataclass
class SubmissionResult:
    """What grading one submission did."""

    assignment: str
    student: str
    error: str | None = None
    notes: list[Note] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Summary:
    """What a grading run did."""

    graded: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    seconds: float = 0.0
    outcomes: dict[tuple[str, str], SubmissionResult] = field(default_factory=dict)
    protection: str = ""
    recorded: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        total = len(self.graded) + len(self.failed)
        rate = total / self.seconds * 60 if self.seconds else 0.0
        lines = [f"recorded {a} in the gradebook from source/{a} (nbgrader generate_assignment)" for a in self.recorded]
        lines.append(f"graded {len(self.graded)}, could not be graded {len(self.failed)}, in {self.seconds:.1f} s "
                     f"({rate:.1f} submissions per minute)")
        if self.protection:
            lines.append(f"protection: {self.protection}")
        if self.failed:
            lines.append("could not be graded (the gradebook holds what it held before; grade them again):")
            lines += [f"  {a} / {s}: {why}" for a, s, why in self.failed]
        for (a, s), outcome in sorted(self.outcomes.items()):
            for note in outcome.notes:
                if note.kind not in (NoteKind.FAILED, NoteKind.PROTECTION):  # said once, above
                    lines.append(f"  {a} / {s}: {note.message}")
        return "\n".join(inert_text(line) for line in lines)  # a name or note cannot start a line of its own


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
    sys.stderr.write(f"\r[{bar:<{width}}] {done}/{total} done ({done - failed} graded, {failed} could not be), "
                     f"ETA {eta:5.0f} s")
    sys.stderr.flush()


#: The lines nbgrader closes a failure with, which say nothing of its cause.
NBGRADER_BOILERPLATE = ("There was an error processing", "Please see the", "NbGraderException",
                        "Traceback (most recent call last)")


def failure_reason(output: str, code: int) -> str:
    """The line of nbgrader's output that says why it failed, else its exit code.

    The cause, not nbgrader's closing words ("Please see the above traceback"): bubblewrap's own complaint
    when the sandbox could not be made, else the last error line that is not boilerplate.
    """
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    sandbox_said = [line for line in lines if line.startswith("bwrap:")]
    errors = [line for line in lines if ("Error" in line or "error" in line or line.startswith("[AutogradeApp |"))
              and not any(words in line for words in NBGRADER_BOILERPLATE)]
    chosen = (sandbox_said or errors or lines or [f"nbgrader exited with {code}"])[-1]
    return chosen[:300]


def run_nbgrader(assignment: str, student: str, settings: Settings, staged: Path, limit: float,
                 server: ForkServer | None, run: runs.Run | None = None) -> str | None:
    """``nbgrader autograde`` on the staged copy, in the course of ``settings``; None on success, else what went wrong.

    nbgrader reads the course's ``nbgrader_config.py`` as its own commands do; the run's overrides of it
    (environment and flags, :meth:`Settings.argv`) are its arguments. ``run``: the run it belongs to,
    whose mark and temporary folder its processes carry.
    """
    root = settings.root
    args = [sys.executable, "-m", "nbgrader", "autograde", assignment, "--student", student, "--force",
            f"--db={db_url(settings)}", "--log-level=WARN", f"--CourseDirectory.submitted_directory={staged}",
            *settings.argv()]
    token = run.token() if run is not None else uuid.uuid4().hex
    env = run.environment(tool_env(), token) if run is not None else dict(tool_env(), **{RUN_VARIABLE: token})
    try:
        if server is not None and server.process.poll() is None:
            code, out, err = server.run(args[3:], root, env, limit, staged)
        else:
            proc = subprocess.Popen(args, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                out, err = proc.communicate(timeout=limit)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                sandbox.kill_group(proc.pid)
                out, err = proc.communicate()
                code = None
            finally:
                sandbox.kill_group(proc.pid)
    finally:
        sandbox.kill_leftovers(token, RUN_VARIABLE)
    if code is None:
        return f"grading took longer than {limit:.0f} s and was stopped"
    if code == 0:
        return None
    return failure_reason(err or out, code)


def _record_zero(settings: Settings, assignment: str, student: str) -> None:
    """Make sure the submission is in the gradebook, every grade nbgrader did not set being 0."""
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.utils import parse_utc

    stamp = settings.root / "submitted" / student / assignment / "timestamp.txt"
    timestamp = None
    if stamp.is_file() and not stamp.is_symlink():
        try:
            timestamp = parse_utc(stamp.read_text().strip())
        except Exception:  # noqa: BLE001 - an unreadable timestamp is no timestamp
            timestamp = None
    with Gradebook(db_url(settings)) as gb:
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


#: What the gradebook holds for one submission: (notebook, grade id) -> (auto score, manual score, extra credit,
#: needs manual grade).
Scores = dict[tuple[str, str], tuple]


def _gradebook_exists(settings: Settings) -> bool:
    """Whether the gradebook is there to read (opening a SQLite one that is not would create it)."""
    url = db_url(settings)
    return not url.startswith("sqlite:///") or Path(url[len("sqlite:///"):].split("?")[0]).is_file()


def scores_of(settings: Settings, assignment: str, student: str) -> Scores | None:
    """What the gradebook holds for ``student``'s ``assignment`` (None: no such submission)."""
    from nbgrader.api import Gradebook, MissingEntry

    if not _gradebook_exists(settings):
        return None
    with Gradebook(db_url(settings)) as gb:
        try:
            submission = gb.find_submission(assignment, student)
        except MissingEntry:
            return None
        return {(notebook.name, g.name): (g.auto_score, g.manual_score, g.extra_credit, g.needs_manual_grade)
                for notebook in submission.notebooks for g in notebook.grades}


def restore_scores(settings: Settings, assignment: str, student: str, before: Scores | None) -> None:
    """Make the gradebook hold what it held before a grading of the submission that failed (``before``,
    :func:`scores_of`; None: no submission at all).

    nbgrader saves the scores before its last steps (writing the graded notebook): a grading that failed
    after that would leave scores that the run's summary, the feedback and the service say were never
    recorded. A failed grading changes nothing in the gradebook, and no earlier score is lost.
    """
    from nbgrader.api import Gradebook, MissingEntry

    if not _gradebook_exists(settings):
        return
    with Gradebook(db_url(settings)) as gb:
        try:
            submission = gb.find_submission(assignment, student)
        except MissingEntry:
            return
        if before is None:
            gb.remove_submission(assignment, student)
            return
        for notebook in submission.notebooks:
            for g in notebook.grades:
                g.auto_score, g.manual_score, g.extra_credit, g.needs_manual_grade = before.get(
                    (notebook.name, g.name), (None, None, None, True))
        gb.db.commit()


def _runtime_notes(outcome: SubmissionResult, root: Path, staged: list[str]) -> None:
    """Notes on how the notebooks ran: cells that crashed, hung, were skipped or flooded their output."""
    import nbformat

    folder = root / "autograded" / outcome.student / outcome.assignment
    for name in staged:
        path = folder / f"{name}.ipynb"
        if path.is_file():
            outcome.notes += notes.runtime_notes(nbformat.read(path, as_version=4))


def grade_one(assignment: str, student: str, settings: Settings, runner: Runner | None = None) -> SubmissionResult:
    """Grade one submission of the course of ``settings`` (see the module doc); never raises, the outcome says what
    went wrong."""
    from ..engine.execute import ResilientExecute

    root = settings.root
    course = settings.make(Grading)
    runner = runner or Runner()
    started = time.monotonic()
    how = protection(settings, runner.mode(settings))
    outcome = SubmissionResult(assignment, student, notes=[Note(NoteKind.PROTECTION, f"How your code ran: {how}.")])
    private = Path(tempfile.mkdtemp(prefix="autograder-staging-", dir=runner.run.folder if runner.run else None))
    try:
        staged = staging.stage(root, assignment, student, private, course)
        outcome.notes += staged.notes
        if staged.notebooks:
            notebook_timeout = settings.value(ResilientExecute, "notebook_timeout")
            limit = notebook_timeout * len(staged.notebooks) + course.nbgrader_margin
            before = scores_of(settings, assignment, student)
            outcome.error = runner(assignment, student, settings, private, limit)
            if outcome.error is None:
                _runtime_notes(outcome, root, staged.notebooks)
            else:
                try:
                    restore_scores(settings, assignment, student, before)
                except Exception as error:  # noqa: BLE001 - the grading's own error is the one to keep
                    outcome.error += f"; the gradebook could not be put back as it was ({type(error).__name__})"
        else:
            _record_zero(settings, assignment, student)  # nothing to grade: the submission's own doing
    except Exception as error:  # noqa: BLE001 - one submission must never stop the class
        outcome.error = safe_text(f"{type(error).__name__}: {error}")[:300]
    finally:
        shutil.rmtree(private, ignore_errors=True)
    if outcome.error is not None:
        outcome.notes.append(Note(NoteKind.FAILED, f"This submission could not be graded ({outcome.error}). That is not "
                                            "your doing: it will be graded again."))
    try:
        notes.write_notes(root / "autograded" / student / assignment, outcome.notes)
    except OSError as error:
        outcome.error = outcome.error or f"could not keep the grading notes: {error}"
    outcome.seconds = time.monotonic() - started
    return outcome


def tools_on_path() -> None:
    """Put this environment's commands first on ``PATH``: nbgrader runs ``alembic`` by name when it creates
    or upgrades a gradebook, and a command typed as ``.venv/bin/python -m autograder ...`` has not put the
    environment's ``bin`` there."""
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def prepare_gradebook(jobs: list[tuple[str, str]], settings: Settings) -> list[str]:
    """Create the gradebook's schema, every assignment graded and every student, before parallel writers start.

    An assignment the gradebook does not know (a fresh clone: the gradebook is not committed)
    is recorded from ``source/`` with ``nbgrader generate_assignment``; returns those assignments.
    """
    from nbgrader.api import Gradebook, MissingEntry

    tools_on_path()
    root = settings.root
    missing = []
    with Gradebook(db_url(settings)) as gb:
        for assignment in sorted({a for a, _ in jobs}):
            try:
                gb.find_assignment(assignment)
            except MissingEntry:
                missing.append(assignment)
        for student in sorted({s for _, s in jobs}):
            gb.update_or_create_student(student)
    for assignment in missing:
        if not (root / "source" / assignment / f"{assignment}.ipynb").is_file():
            raise FileNotFoundError(f"the gradebook has no assignment {assignment} and source/{assignment} does not "
                                    "exist: put the assignment's source there, then run make release")
        done = nbgrader("generate_assignment", assignment, "--force", f"--db={db_url(settings)}", "--log-level=ERROR",
                        root=root, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"could not record {assignment} in the gradebook: {failure_reason(done.stderr, done.returncode)}")
    return missing


def autograde(names: list[str] | None = None, settings: Settings | None = None, progress: bool = True,
              students: list[str] | None = None, runner: Runner | None = None) -> Summary:
    """Grade every submission of the named assignments (of ``students``, default all) with ``settings``
    (default: :meth:`Settings.load` of this course), ``Grading.workers`` at once.

    ``runner``: where nbgrader runs (default: here, a :meth:`Runner.start`); it is closed at the end.
    :func:`autograder.grading.cluster.autograde` gives a Dask cluster's.
    Raises :class:`SandboxUnavailable` where no sandbox can be made here (``runner`` None) and
    ``Grading.sandbox`` is True.
    """
    settings = settings or Settings.load(ROOT)
    root = settings.root
    course = settings.make(Grading)
    if runner is None:
        require_sandbox(settings)
    jobs = [(a, s) for a, s in submissions(root, names) if students is None or s in students]
    start = time.monotonic()
    if runner is not None:
        workers = course.workers or len(jobs) or 1
    else:  # the fork server first, so that its imports overlap with preparing the gradebook
        runner = Runner.start(settings, sorted({a for a, _ in jobs})) if jobs else Runner()
        workers = course.workers or os.cpu_count() or 1
    summary = Summary(protection=protection(settings, runner.mode(settings)))
    try:
        if jobs:
            summary.recorded = prepare_gradebook(jobs, settings)
        _grade_all(jobs, workers, settings, progress, summary, start, runner)
    finally:
        runner.close()
    summary.graded.sort()
    summary.failed.sort()
    summary.seconds = time.monotonic() - start
    return summary


def require_sandbox(settings: Settings) -> None:
    """Raise :class:`SandboxUnavailable` where no sandbox can be made here and ``Grading.sandbox`` asks for one."""
    if settings.value(Grading, "sandbox") and sandbox.mode(bubblewrap(settings)) == "limits only":
        raise SandboxUnavailable(
            "No sandbox can be made on this machine, so grading will not run students' code: it would run with your "
            "rights, able to read and change your files. Install bubblewrap (Debian/Ubuntu: sudo apt-get install "
            "bubblewrap; it needs Linux with user namespaces), or, if you accept the risk, grade with --no-sandbox "
            f"(make autograde NO_SANDBOX=1). ({sandbox.why_not(bubblewrap(settings))})")


def fork_server(settings: Settings, cwd: Path | None = None, env: dict[str, str] | None = None,
                assignments: Sequence[str] | None = None) -> ForkServer | None:
    """A :class:`ForkServer` for a run with ``settings`` of ``assignments`` (None: any), started in ``cwd`` with ``env``
    (default: this process's); None where it is turned off (``Grading.forkserver``, ``AUTOGRADER_FORKSERVER=0``) or
    cannot start."""
    if not settings.value(Grading, "forkserver"):
        return None
    try:
        return ForkServer(settings, cwd, env, assignments)
    except OSError:
        return None


def _grade_all(jobs: Sequence[tuple[str, str]], workers: int, settings: Settings, progress: bool,
               summary: Summary, start: float, runner: Runner) -> None:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(grade_one, a, s, settings, runner): (a, s) for a, s in jobs}
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
