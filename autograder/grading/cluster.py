"""``make autograde CLUSTER=tcp://host:8786``: grade on the workers of a Dask cluster, write the grades here.

:class:`ClusterRunner` is the :class:`~autograder.grading.grade.Runner` that
:func:`~autograder.grading.grade.autograde` uses when it is given a scheduler's address. Each
submission is staged here, as always (:mod:`autograder.engine.staging`); then

1. the staged copy (its bytes) goes to the cluster as one task, :func:`grade_staged`. On the
   worker that runs it, the task lays out a private course in a temporary folder (the
   assignment's config, source and a gradebook in which it is recorded), grades the copy there
   with ``nbgrader autograde`` exactly as ``make autograde`` does (the same
   :func:`~autograder.grading.grade.run_nbgrader`, the same sandbox, forked from one
   :class:`~autograder.engine.forkserver.ForkServer` per worker), and returns plain data
   (:class:`Graded`): the files of ``autograded/``, the scores and comments nbgrader recorded,
   the submission's timestamp, or why it could not be graded;
2. :func:`record`, in the command that submitted the work, writes ``autograded/<student>/<assignment>/``
   and the gradebook, one submission at a time: the only writer, so SQLite works (PostgreSQL is
   optional). Late penalties are assigned here, by nbgrader's ``AssignLatePenalties`` with the
   course's config, since only this gradebook knows the due dates.

A worker that dies (its machine lost, the process killed) takes its task with it; the scheduler
runs the task again on another worker (up to ``distributed.scheduler.allowed-failures`` times).
Each submission is recorded once, when its task's result arrives. A task that raises, or whose
workers keep dying, is "could not be graded" (no score, never a 0).

The workers need the course's Python environment (the pins of ``pyproject.toml``; bubblewrap for
the sandbox) and its files. The files are a zip built here, :func:`build_archive` (about a
megabyte): the ``autograder`` package, hidden checks and grading tools included, and per assignment
a course to grade it in. It is shipped with the work, ``Client.register_plugin(UploadFile(...))``
(what ``Client.upload_file`` does): every worker, those that join later too, saves it, puts it on
its ``sys.path`` (so it runs this course's code whatever is installed there) and unpacks it
once. So a worker needs no checkout of the course, only the environment.

Not protected here: the workers are the instructor's machines. What the scheduler and the
workers hold (the hidden checks, the submissions) is as safe as they are; Dask's ``tcp://``
is not encrypted or authenticated (``tls://`` is, with Dask's security settings). The
student's code runs in the sandbox on the worker, as it would here. A worker grades in a copy of
the course in its temporary folder (``autograder-cluster-*``, readable by the worker's user
alone) and removes it after; a worker killed mid-task leaves it there.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import uuid
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath

from ..course.repository import ROOT
from ..course.settings import Grading, Settings
from ..engine import sandbox
from . import gradescope
from .grade import Runner, SandboxUnavailable, Summary, bubblewrap, db_url, fork_server, run_nbgrader, submissions
from .grade import autograde as grade_all

#: Seconds to wait for the first worker of the cluster before giving up.
WAIT_FOR_WORKERS = 120
#: The name of an archive (and of its unpacked folder): this prefix and a digest of what it holds.
PREFIX = "autograder-course-"


# -- the course's files, for the workers -----------------------------------------------------


def course_folder(name: str) -> Path:
    """The course of the archive ``name`` uploaded to this worker, unpacked beside it (the first time)."""
    from distributed import get_worker

    local = Path(get_worker().local_directory)
    return unpack(local / f"{name}.zip", local / name)


def _digest(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for name, data in sorted(files.items()):
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()[:16]


def build_archive(names: list[str], root: Path = ROOT) -> Path:
    """``build/cluster/autograder-course-<digest>.zip`` in ``root``: this package, and per assignment a course to grade it in.

    ``courses/<assignment>/`` holds what :func:`gradescope.course_files` lays out for Gradescope
    (the config, the source, the release and a gradebook in which the assignment is recorded).
    The digest is that of the files it is made from, so an unchanged course is built once.
    """
    sources = {f"source/{p.relative_to(root / 'source').as_posix()}": p.read_bytes()
               for a in names for p in sorted((root / "source" / a).rglob("*")) if p.is_file()}
    package = gradescope.package_files(ROOT)  # the package that runs this, whichever course it grades
    config = (root / "nbgrader_config.py").read_bytes()
    path = root / "build" / "cluster" / f"{PREFIX}{_digest({**package, **sources, 'config': config})}.zip"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cluster-build-") as work:
        folders = [Path(work) / a for a in names]
        for folder in folders:
            folder.mkdir()
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # one nbgrader process per assignment
            courses = list(pool.map(lambda a, f: gradescope.course_files(a, root, f), names, folders))
        files = dict(package)
        for assignment, course in zip(names, courses):
            files.update({f"courses/{assignment}/{n.removeprefix('course/')}": p.read_bytes() for n, p in course.items()})
        partial = path.with_suffix(f".{uuid.uuid4().hex}.part")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in sorted(files.items()):
                gradescope.add_file(archive, name, data)
        os.replace(partial, path)
    return path


def unpack(archive: Path, folder: Path) -> Path:
    """``archive`` unpacked into ``folder`` (once: a folder already there is the same archive's)."""
    if not folder.is_dir():
        partial = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=folder.parent))
        with zipfile.ZipFile(archive) as opened:
            opened.extractall(partial)
        try:
            os.rename(partial, folder)
        except OSError:  # another task unpacked it first
            shutil.rmtree(partial, ignore_errors=True)
    return folder


# -- a submission's files, both ways ---------------------------------------------------------


def relative(name: str) -> PurePosixPath:
    """``name`` as a path inside a submission's folder; ValueError for one that would leave it."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or any(part in ("", ".", "..") for part in name.split("/")):
        raise ValueError(f"not a file inside a submission: {name!r}")
    return path


def read_tree(folder: Path) -> dict[str, bytes]:
    """Every regular file below ``folder`` (links are not followed), by its path inside it."""
    files = {}
    for dirpath, _, filenames in os.walk(folder, followlinks=False):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                files[path.relative_to(folder).as_posix()] = path.read_bytes()
    return files


def write_tree(folder: Path, files: dict[str, bytes]) -> None:
    """``folder`` made anew with ``files`` in it (whatever was there, a link included, is removed first)."""
    paths = {name: folder.joinpath(*relative(name).parts) for name in files}  # every name checked before anything changes
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, path in paths.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])


# -- on a worker -------------------------------------------------------------------------------


@dataclass
class Graded:
    """What a worker hands back for one submission: plain data, or the reason it could not be graded."""

    error: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)  # autograded/<student>/<assignment>/, by path
    grades: list[tuple[str, str, float | None, bool]] = field(default_factory=list)  # notebook, cell, auto score, review?
    comments: list[tuple[str, str, str | None]] = field(default_factory=list)  # notebook, cell, auto comment
    timestamp: datetime | None = None


class _Worker:
    """This worker's course environment: the unpacked course on PYTHONPATH and its fork server.

    nbgrader and the kernels it starts import ``autograder`` from the unpacked course (the
    sandbox shows the kernel that folder's package). The environment is the process's, so a
    task of another course (another archive) waits until this one's tasks are done.
    """

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.folder: Path | None = None
        self.running = 0
        self.server = None
        self.pythonpath = os.environ.get("PYTHONPATH", "")

    @contextmanager
    def using(self, folder: Path, settings: Settings) -> Iterator[object]:
        """Run in ``folder``'s environment, with its fork server for ``settings`` (if ``Grading.forkserver``).

        One server serves every task of ``folder`` (of one course's archive): the first task's settings start it.
        """
        with self.changed:
            self.changed.wait_for(lambda: self.folder == folder or self.running == 0)
            if self.folder != folder or (self.server is not None and self.server.process.poll() is not None):
                if self.server is not None:
                    self.server.close()
                os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), self.pythonpath) if p)
                os.environ.pop("NBGRADER_DB_URL", None)  # always the private course's own gradebook
                courses = folder / "courses"  # the archive's assignments
                graded = sorted(p.name for p in courses.iterdir()) if courses.is_dir() else None
                self.folder, self.server = folder, fork_server(settings, folder, assignments=graded)
            self.running += 1
            server = self.server
        try:
            yield server
        finally:
            with self.changed:
                self.running -= 1
                self.changed.notify_all()


_WORKER = _Worker()


def worker_sandbox(bubblewrap: bool = True) -> tuple[str, str]:
    """(:func:`sandbox.mode`, :func:`sandbox.why_not`) on this worker."""
    return sandbox.mode(bubblewrap), sandbox.why_not(bubblewrap)


def grade_staged(course: str, assignment: str, student: str, files: dict[str, bytes], settings: Settings,
                 limit: float) -> Graded:
    """The task: grade one staged submission (``files``) in a private course on this worker (see the module doc).

    ``course``: the name of the uploaded archive; ``settings``: the run's (the overrides of the command that
    submitted the work, over this worker's copy of the course); ``limit``: seconds the nbgrader process may take.
    """
    if settings.value(Grading, "sandbox") and sandbox.mode(bubblewrap(settings)) == "limits only":
        raise SandboxUnavailable(f"this worker cannot make a sandbox ({sandbox.why_not()}); install bubblewrap on it, "
                                 "or grade with --no-sandbox")
    folder = course_folder(course)
    private = Path(tempfile.mkdtemp(prefix="autograder-cluster-"))
    try:
        shutil.copytree(folder / "courses" / assignment, private, dirs_exist_ok=True)
        private.chmod(0o700)  # copytree gave it the course folder's mode: other users of the worker must not read it
        staged = private / "staged"
        write_tree(staged / student / assignment, files)
        with _WORKER.using(folder, settings) as server:
            here = settings.at(private)  # the worker's copy of the course, NBGRADER_DB_URL unset by using()
            error = run_nbgrader(assignment, student, here, staged, limit, server)
        if error is not None:
            return Graded(error=error)
        return _read_back(here, assignment, student)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _read_back(course: Settings, assignment: str, student: str) -> Graded:
    from nbgrader.api import Gradebook

    graded = Graded(files=read_tree(course.root / "autograded" / student / assignment))
    with Gradebook(db_url(course)) as gb:
        submission = gb.find_submission(assignment, student)
        graded.timestamp = submission.timestamp
        for notebook in submission.notebooks:
            graded.grades += [(notebook.name, g.name, g.auto_score, bool(g.needs_manual_grade)) for g in notebook.grades]
            graded.comments += [(notebook.name, c.name, c.auto_comment) for c in notebook.comments]
    return graded


# -- where the work is submitted ----------------------------------------------------------------


def record(settings: Settings, assignment: str, student: str, graded: Graded, notebooks: list[str]) -> None:
    """Write what a worker graded into ``autograded/`` and the gradebook, as ``nbgrader autograde --force`` would.

    ``notebooks``: those nbgrader graded (the others of the assignment were missing and score 0).
    """
    from nbgrader.api import Gradebook

    write_tree(settings.root / "autograded" / student / assignment, graded.files)
    with Gradebook(db_url(settings)) as gb:
        gb.update_or_create_submission(assignment, student, **({"timestamp": graded.timestamp} if graded.timestamp else {}))
        for notebook, name, score, review in graded.grades:
            cell = gb.find_grade(name, notebook, assignment, student)
            cell.auto_score = score
            # nbgrader's SaveAutoGrades: a grader's manual score asks for a review when the cell is graded again
            cell.needs_manual_grade = review or (notebook in notebooks and cell.manual_score is not None)
        for notebook, name, text in graded.comments:
            if notebook in notebooks:
                gb.find_comment(name, notebook, assignment, student).auto_comment = text
        gb.db.commit()
    _late_penalties(settings, assignment, student, notebooks)


def _late_penalties(settings: Settings, assignment: str, student: str, notebooks: list[str]) -> None:
    """nbgrader's ``AssignLatePenalties`` with the course's config, on the gradebook here (it knows the due dates)."""
    import nbformat
    from nbgrader.preprocessors import AssignLatePenalties

    quiet = logging.getLogger("autograder.cluster")  # "N seconds late" is the gradebook's to tell, not the progress bar's
    quiet.setLevel(logging.ERROR)
    penalties = settings.make(AssignLatePenalties, log=quiet)
    for name in notebooks:
        resources = {"nbgrader": {"assignment": assignment, "student": student, "notebook": name,
                                  "db_url": db_url(settings)}}
        penalties.preprocess(nbformat.v4.new_notebook(), resources)


class ClusterRunner(Runner):
    """Grades on the workers of the Dask scheduler at ``address`` (see the module doc).

    Connecting ships the course (:func:`build_archive`) and checks that the workers can make a
    sandbox; raises :class:`SandboxUnavailable` where one cannot and ``Grading.sandbox`` is True,
    RuntimeError where no worker joins in :data:`WAIT_FOR_WORKERS` seconds.
    """

    def __init__(self, address: str, names: list[str], settings: Settings) -> None:
        from distributed import Client
        from distributed.diagnostics.plugin import UploadFile

        super().__init__()
        archive = build_archive(names, settings.root)
        self.course = archive.name.removesuffix(".zip")
        self.client = Client(address, timeout="60s", set_as_default=False)
        self._writing = threading.Lock()
        try:
            self.client.register_plugin(UploadFile(str(archive)), name=self.course)  # workers that join later get it too
            try:
                self.client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS)
            except TimeoutError:
                raise RuntimeError(f"no worker joined the Dask scheduler at {address} in {WAIT_FOR_WORKERS} s: start "
                                   "workers (the manual: docs/scale.md)") from None
            found = self.client.run(worker_sandbox, bubblewrap(settings))
            without = sorted(w for w, (mode, _) in found.items() if mode == "limits only")
            if settings.value(Grading, "sandbox") and without:
                raise SandboxUnavailable(
                    f"No sandbox can be made on the workers {', '.join(without)} ({found[without[0]][1]}), so they will "
                    "not run students' code: install bubblewrap on them, or, if you accept the risk, grade with "
                    "--no-sandbox (make autograde NO_SANDBOX=1).")
            self._mode = ", ".join(sorted({mode for mode, _ in found.values()}))
        except BaseException:
            self.client.close()
            raise

    def mode(self, settings: Settings) -> str:
        return self._mode

    def __call__(self, assignment: str, student: str, settings: Settings, staged: Path, limit: float) -> str | None:
        folder = staged / student / assignment
        notebooks = sorted(p.stem for p in folder.glob("*.ipynb"))
        future = self.client.submit(grade_staged, self.course, assignment, student, read_tree(folder), settings, limit,
                                    key=f"autograde-{assignment}-{student}-{uuid.uuid4().hex[:8]}", pure=False)
        try:
            graded = future.result()  # raises what the task raised, or KilledWorker: grade_one says "could not be graded"
        finally:
            future.release()
        if graded.error is not None:
            return graded.error
        with self._writing:  # one submission at a time: the single writer of the gradebook
            record(settings, assignment, student, graded, notebooks)
        return None

    def close(self) -> None:
        self.client.close()


def autograde(address: str, names: list[str] | None = None, settings: Settings | None = None,
              progress: bool = True, students: list[str] | None = None) -> Summary:
    """:func:`autograder.grading.grade.autograde` with nbgrader run on the workers of the scheduler at ``address``.

    Raises :class:`SandboxUnavailable` where a worker cannot make a sandbox and ``Grading.sandbox`` is True.
    """
    settings = settings or Settings.load(ROOT)
    jobs = [(a, s) for a, s in submissions(settings.root, names) if students is None or s in students]
    runner = ClusterRunner(address, sorted({a for a, _ in jobs}), settings) if jobs else None
    return grade_all(names, settings, progress, students, runner=runner)
