"""``python -m autograder serve``: grade each submission as it arrives in the exchange, and release its feedback.

Each cycle (:meth:`Service.cycle`) looks at the exchange's ``inbound/`` (:mod:`.inbox`), records
every new submission in the state (:mod:`.state`), asks the fair queue what to grade now
(:mod:`.queue`), and hands that to ``GradingService.workers`` threads. A grading collects the
submission into ``submitted/`` and grades it with :func:`autograder.grading.grade.grade_one`, the
pipeline of ``make autograde`` (staging, the sandbox, the checks in the grader, a fork server
shared by every grading), so its grade is in the gradebook and its graded notebook in
``autograded/`` as if the instructor had graded it; its page is made by
:func:`autograder.grading.feedback.submission_pages` from a copy of the graded notebook whose
hidden checks show what :mod:`.visibility` allows, with the quota at its top, and released to that
student only (:mod:`~autograder.service.release`). A submission that could not be graded (not the student's doing)
is released as such, never with a score, and graded again (``GradingService.retries``). A student
is told, by a page of its own, when a submission waits for the quota, was replaced by a later one,
came after the due date or cannot be graded; and, the moment it arrives, that it is being graded
(or waits its turn), when its feedback should be ready (from this service's recent gradings), and
that the Assignment List shows it after its ⟳ button: nbgrader's list reloads only when it is
opened, on ⟳ and after its own buttons, so it never shows new feedback by itself.

What this does *not* do: collect a submission for the instructor's own ``make autograde`` (the
service's ``submitted/`` holds the last submission it graded; ``nbgrader collect`` still works),
or grade after the due date anything but the last submission before it.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import statistics
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nbformat

from ..course.repository import ROOT, assignments
from ..course.settings import CONFIG_FILE, GradingService, Settings
from ..engine import notes
from ..grading import feedback, grade
from . import inbox, queue, release, visibility
from .state import Record, State, Status

log = logging.getLogger("autograder.service")

#: Where the service keeps its state, in the course (beside the graded submissions, never committed).
STATE_FILE = Path("autograded") / ".grading-service" / "state.json"
#: Every page released to a student, by name, for the instructor: ``<student>/<assignment>/<submitted at>/``.
RELEASED = Path("released-feedback")
#: Statuses a student is told of by a page of its own (a graded submission's page is its feedback).
TOLD = (Status.WAITING, Status.SUPERSEDED, Status.LATE, Status.REFUSED, Status.FAILED)
TITLES = {
    Status.WAITING: "Received: waiting for your next official grading",
    Status.SUPERSEDED: "Received: replaced by a later submission",
    Status.LATE: "Received after the due date",
    Status.REFUSED: "This submission cannot be graded",
    Status.FAILED: "This submission could not be graded",
}
#: How a student sees a page released after the Assignment List was drawn (it does not reload by itself).
REFRESH = ("The Assignment List does not show new feedback by itself: click its ⟳ (refresh) button, then "
           "Fetch Feedback again; this page is then replaced by your feedback.")
#: How many recent gradings the estimate of when feedback is ready is taken from.
RECENT = 20
VISIBILITY_LINES = {
    "pass_fail": "Before the due date this page says of each hidden check only whether it passed; after it, "
                 "their messages too.",
    "nothing": "Before the due date this page shows nothing of the hidden checks but the total; after it, "
               "everything.",
}


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


class Service:
    """The grading service of the course at ``root``, watching ``exchange`` (default: the course's settings)."""

    def __init__(self, root: Path = ROOT, exchange: Path | None = None, course_id: str | None = None,
                 settings: Settings | None = None, runner: grade.Runner | None = None,
                 now: Callable[[], datetime] | None = None) -> None:
        """``settings``: the run's (default: :meth:`Settings.load` of ``root``); their ``GradingService.workers``
        submissions are graded at once."""
        if not (root / CONFIG_FILE).is_file() or not (root / "source").is_dir():
            raise ValueError(f"{root} is not a course: it has no {CONFIG_FILE} or no source/ folder")
        self.settings = settings or Settings.load(root)
        config = self.settings.config()
        self.root = root
        self.exchange = Path(exchange or config.Exchange.get("root", "/srv/nbgrader/exchange"))
        self.course_id = course_id or config.CourseDirectory.get("course_id", "")
        if not self.course_id:
            raise ValueError("the course has no id: set c.CourseDirectory.course_id in nbgrader_config.py")
        self.service = self.settings.make(GradingService)  # the service's own settings
        self.workers = self.service.workers or os.cpu_count() or 1
        self.now = now or (lambda: datetime.now(UTC))
        self.state = State(root / STATE_FILE)
        self.lock = threading.RLock()  # the state, and rendering (nbconvert's exporter is not thread-safe)
        self.running: dict[Future, Record] = {}
        self.assignments = set(assignments(root))
        self.me = pwd.getpwuid(os.getuid()).pw_name
        self._runner = runner
        self._exporter = None
        self._due: dict[str, datetime | None] = {}
        self._seconds: deque[float] = deque(maxlen=RECENT)  # how long the recent gradings took

    # -- the loop -------------------------------------------------------------------------

    @property
    def inbound(self) -> Path:
        return self.exchange / self.course_id / "inbound"

    def runner(self) -> grade.Runner:
        """The runner every grading shares: one run of the course (:mod:`autograder.grading.runs`: what a
        service stopped by ``SIGKILL`` left is cleaned up by the next run), its fork server started once."""
        with self.lock:  # two workers' first gradings must not start two
            if self._runner is None:
                self._runner = grade.Runner.start(self.settings)
            return self._runner

    def serve(self, stop: threading.Event | None = None, idle_exit: bool = False) -> None:
        """Grade until ``stop`` is set (or, with ``idle_exit``, until nothing is left to grade now)."""
        grade.require_sandbox(self.settings)
        share_with_the_instructor(self.root, grade.db_url(self.settings))
        stop = stop or threading.Event()
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="grading") as pool:
            try:
                while not stop.is_set():
                    started = self.cycle(pool)
                    if idle_exit and not started and not self.running:
                        break
                    if self.running:
                        done, _ = wait(list(self.running), timeout=self.service.poll_seconds,
                                       return_when=FIRST_COMPLETED)
                        self._finish(done)
                    else:
                        stop.wait(self.service.poll_seconds)
            finally:
                self._finish(wait(list(self.running)).done)
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def cycle(self, pool: ThreadPoolExecutor) -> int:
        """Look at the exchange once, update the state, start what may be graded now; how many were started."""
        with self.lock:
            self._finish([f for f in self.running if f.done()])
            now = self.now()
            for submission in inbox.scan(self.inbound, self.assignments):
                if submission.key not in self.state.records:
                    self._arrived(submission)
            busy = {(r.student, r.assignment) for r in self.running.values()}
            due = self.due_dates()
            ready = queue.plan(self.state, now, self.service.daily_quota, due, busy)
            started = 0
            for record in ready:
                if len(self.running) >= self.workers:
                    break
                if (record.student, record.assignment) in busy:
                    continue
                busy.add((record.student, record.assignment))
                record.status, record.graded_at = Status.GRADING, now.isoformat()
                self._tell_received(record, now)  # before its grading starts: its feedback must come after
                self.running[pool.submit(self._grade, record)] = record
                started += 1
            for record in self.state.records.values():
                if record.status == Status.QUEUED:
                    self._tell_received(record, now)
            self._tell()
            self.state.save()
            return started

    def _finish(self, done) -> None:
        with self.lock:
            for future in list(done):
                record = self.running.pop(future, None)
                if record is not None and future.exception() is not None:  # a bug of ours: graded again later
                    self._not_graded(record, f"{type(future.exception()).__name__}: {future.exception()}")
            self.state.save()

    # -- what arrives ---------------------------------------------------------------------

    def _arrived(self, submission: inbox.Submission) -> None:
        record = Record(submission.key, submission.student, submission.assignment, submission.time.isoformat())
        problem = submission.problem
        if not problem and submission.owner not in (submission.student, self.me, "root"):
            problem = f"it was submitted by the user {submission.owner!r} in the name of {submission.student!r}"
        if problem:
            record.status, record.reason = Status.REFUSED, problem
        self.state.add(record)
        log.info("new submission %s (%s)", submission.key, record.status)

    def due_dates(self) -> dict[str, datetime | None]:
        """Each assignment's due date from the gradebook (None: none, or not in the gradebook yet)."""
        from nbgrader.api import Gradebook, MissingEntry

        try:
            with Gradebook(grade.db_url(self.settings)) as gb:
                for name in self.assignments:
                    try:
                        self._due[name] = _utc(gb.find_assignment(name).duedate)
                    except MissingEntry:
                        self._due[name] = None
        except Exception as error:  # noqa: BLE001 - a busy gradebook: the dates read last time
            log.warning("could not read the due dates: %s", error)
        return dict(self._due)

    # -- grading one ----------------------------------------------------------------------

    def _grade(self, record: Record) -> None:
        """Collect, grade and release one submission (in a worker thread)."""
        path = self.inbound / record.key
        try:
            submission = inbox.parse(path, self.assignments)
        except OSError:
            submission = None
        if submission is None or submission.problem:
            with self.lock:
                record.status = Status.REFUSED
                record.reason = submission.problem if submission else "its folder is no longer in the exchange"
            return
        inbox.collect(submission, self.root)
        grade.prepare_gradebook([(record.assignment, record.student)], self.settings)
        outcome = grade.grade_one(record.assignment, record.student, self.settings, self.runner())
        if outcome.error is not None:
            with self.lock:
                self._not_graded(record, outcome.error)
            return
        with self.lock:
            self._seconds.append(outcome.seconds)
            record.status, record.reason, record.attempts = Status.GRADED, "", 0
            record.notified = Status.GRADED
            lines = self._graded_lines(record)
            mode = self._mode(record)
            pages = self.pages(record, outcome.notes, mode)
        for name, page in pages.items():
            for notebook_id in self._notebook_ids(submission) | {name}:
                self._release(record, submission.secret(), notebook_id, release.with_lines(page, lines))
        log.info("graded %s in %.1f s", record.key, outcome.seconds)

    def _not_graded(self, record: Record, why: str) -> None:
        record.attempts += 1
        again = record.attempts <= self.service.retries
        # The instructor's one place to learn why (the hub's log, where the service's output goes).
        log.error("could not grade %s (attempt %d of %d%s): %s", record.key, record.attempts, self.service.retries + 1,
                  "; it is graded again" if again else "; the service gives up on it", why)
        if again:
            record.status = Status.QUEUED
            record.reason = f"it could not be graded ({why}); it is graded again"
            self._release_message(record, TITLES[Status.FAILED], [
                f"Your submission of {_when(record.arrived)} could not be graded: {why}.",
                "That is not your doing, and no score was recorded: it is graded again in a moment."])
        else:
            record.status = Status.FAILED
            record.reason = f"it could not be graded ({why}); the reason is in the grading service's log for your instructor"

    def _mode(self, record: Record) -> str:
        deadline = self._due.get(record.assignment)
        if record.final or (deadline is not None and self.now() >= deadline):
            return "messages"
        return self.service.hidden_before_due

    def _graded_lines(self, record: Record) -> list[str]:
        if record.final:
            return [f"This is your final grade for {record.assignment}: your last submission before the due date "
                    f"(of {_when(record.arrived)}), graded with every check shown."]
        quota = self.service.daily_quota
        used = self.state.graded_today(record.student, record.assignment, self.now().date())
        lines = [f"Official grading of your submission of {_when(record.arrived)}: {used} of your {quota} official "
                 f"gradings of {record.assignment} today (UTC) used, {max(quota - used, 0)} left."]
        if self._mode(record) in VISIBILITY_LINES:
            lines.append(VISIBILITY_LINES[self._mode(record)])
        return lines

    def pages(self, record: Record, grading_notes: list[notes.Note], mode: str) -> dict[str, str]:
        """notebook name -> its feedback page, made by ``make feedback``'s code from a copy shown as ``mode`` allows."""
        graded = self.root / "autograded" / record.student / record.assignment
        work = Path(tempfile.mkdtemp(prefix="autograder-service-"))
        try:
            folder = work / "autograded" / record.student / record.assignment
            folder.mkdir(parents=True)
            for path in sorted(graded.glob("*.ipynb")):
                if path.is_file() and not path.is_symlink():
                    notebook = nbformat.read(path, as_version=4)
                    nbformat.write(visibility.shown(notebook, mode), folder / path.name)
            notes.write_notes(folder, grading_notes)
            if self._exporter is None:
                self._exporter = feedback.make_exporter(self.settings, grade.db_url(self.settings))
            run = feedback.FeedbackRun()
            feedback.submission_pages(self._exporter, work, record.assignment, folder, grade.db_url(self.settings), run)
            return {page.stem: page.read_text(encoding="utf-8") for page in run.pages}
        finally:
            shutil.rmtree(work, ignore_errors=True)

    @staticmethod
    def _notebook_ids(submission: inbox.Submission) -> set[str]:
        """The notebooks of the submission, by the names *Fetch Feedback* looks for."""
        try:
            return {p.stem for p in submission.path.glob("*.ipynb")}
        except OSError:
            return set()

    # -- telling the student --------------------------------------------------------------

    def _tell(self) -> None:
        """A page for each submission whose status the student has not been told of yet."""
        for record in self.state.records.values():
            if record.status in TOLD and record.notified != record.status:
                lines = [f"Your submission of {_when(record.arrived)} of {record.assignment}: {record.reason}."]
                if record.status == Status.FAILED:
                    lines.append("That is not your doing, and no score was recorded.")
                self._release_message(record, TITLES[record.status], lines)

    def _tell_received(self, record: Record, now: datetime) -> None:
        """When a submission is first seen queued, and when its grading starts: that it was received, when its feedback
        should be ready, and how the Assignment List shows it (a page that says it could not be graded and is
        graded again stays until that grading starts)."""
        if record.notified == record.status:
            return
        lines = [f"Your submission of {_when(record.arrived)} of {record.assignment} was received."]
        if record.status == Status.GRADING:
            title = "Received: being graded now"
            if self._seconds:
                typical = statistics.median(self._seconds)
                ready = now + timedelta(seconds=typical)
                lines.append(f"Its official grading started at {_when(now)}; gradings here have lately taken about "
                             f"{typical:.0f} s, so its feedback should be ready at about {_when(ready)}.")
            else:
                lines.append(f"Its official grading started at {_when(now)} (the first since the grading service "
                             "started: it takes longer than the next ones).")
        else:
            title = "Received: waiting for its official grading"
            lines.append("It is graded after the submissions ahead of it; its feedback is ready soon after.")
        self._release_message(record, title, [*lines, REFRESH])

    def _release_message(self, record: Record, title: str, lines: list[str]) -> None:
        path = self.inbound / record.key
        try:
            submission = inbox.parse(path, self.assignments)
            secret = submission.secret()
        except OSError as error:  # no secret to name the page by: only the instructor can be told
            log.warning("cannot tell %s about %s: %s", record.student, record.key, error)
            record.notified = record.status
            return
        page = release.message_page(title, lines)
        for notebook_id in self._notebook_ids(submission) | {record.assignment}:
            self._release(record, secret, notebook_id, page)
        record.notified = record.status

    def _release(self, record: Record, secret: str, notebook_id: str, page: str) -> None:
        """``page`` to the student (the exchange, by its secret name), and to the instructor by the student's name."""
        release.release(self.exchange, self.course_id, secret, notebook_id, page, record.student)
        stamp = record.arrived.astimezone(UTC).strftime("%Y-%m-%dT%H-%M-%SZ")
        feedback.write_text(self.root / RELEASED / record.student / record.assignment / stamp / f"{notebook_id}.html",
                            page, 0o640)


def share_with_the_instructor(root: Path, db_url: str) -> None:
    """A root service of a course that another user owns (the instructor): from now on, everything it creates
    belongs to the course folder's group and is closed to every other user.

    The instructor rereads and rewrites what the service writes (Formgrader, ``make autograde``): the
    gradebook, ``submitted/``, ``autograded/``; no student may read them, whatever the folders around them
    allow. So the process's group becomes the course's and its umask 007, before anything is created; a
    SQLite gradebook (which SQLite would make readable, not writable, by the group) is made first, 0660.
    """
    if os.geteuid() != 0:
        return
    info = root.stat()
    if info.st_uid == 0:
        return  # root's own course: nothing to share
    os.setgid(info.st_gid)
    os.umask(0o007)
    if db_url.startswith("sqlite:///"):
        path = Path(db_url[len("sqlite:///"):].split("?")[0])
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o660))  # an empty file is an empty database
        except FileExistsError:
            pass


def summary(service: Service) -> str:
    """One line per submission the service knows, for the instructor."""
    lines = []
    for record in sorted(service.state.records.values(), key=lambda r: (r.arrived, r.key)):
        lines.append(f"{record.time}  {record.student} / {record.assignment}: {record.status}"
                     + (" (final)" if record.final else "") + (f": {record.reason}" if record.reason else ""))
    return "\n".join(notes.inert_text(line) for line in lines)


def wait_for(predicate: Callable[[], bool], timeout: float, step: float = 0.5) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds (for tests and the benchmark)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()

