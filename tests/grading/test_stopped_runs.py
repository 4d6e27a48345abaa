"""A grading run stopped at any moment (SIGKILL) loses nothing: the next run cleans up after it and grades as
an uninterrupted one would (:mod:`autograder.grading.runs`)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from nbgrader.api import Gradebook

from autograder.course.settings import Grading, Settings
from autograder.engine import sandbox
from autograder.engine.sandbox import RUN_VARIABLE
from autograder.grading import grade, runs

from ..course_copy import fill, grading_settings, make_course, reference_answers, released, submit

A = "01_soft_lookup"
STUDENTS = ("ada", "bo", "cy")

#: A grading run in a process of its own, to be killed.
DRIVER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from autograder.course.settings import Settings
    from autograder.grading import grade
    grade.autograde([sys.argv[1]], Settings.load(Path(sys.argv[2]), {{"Grading.workers": 2, "Grading.sandbox": {sandbox}}}),
                    progress=False)
""")


def _marked(ident: str) -> list[psutil.Process]:
    """The live processes carrying the mark of run ``ident``."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if (proc.environ().get(RUN_VARIABLE) or "").startswith(f"{ident}:"):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _full_marks(course: Path) -> dict[str, bool]:
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        return {s: gb.find_submission(A, s).score == gb.find_submission(A, s).max_score > 0 for s in STUDENTS}


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["registered", "grading", "first graded"])
def test_a_run_killed_at_any_moment_is_cleaned_up_and_graded_again(tmp_path, moment):
    course = make_course(tmp_path, [A])
    rel, ref = released(course, A), reference_answers(A)
    for student in STUDENTS:
        submit(course, A, student, fill(rel, ref))
    settings = grading_settings(course, {"Grading.workers": 2})
    registry = course / runs.REGISTRY
    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(sandbox=settings.value(Grading, "sandbox")), A,
                               str(course)], cwd=course, start_new_session=True)
    try:
        def reached() -> bool:
            records = list(registry.glob("*")) if registry.is_dir() else []
            if moment == "registered" or not records:
                return bool(records)
            if moment == "grading":
                return len(_marked(records[0].name)) > 2  # the fork server and zygote, then nbgrader processes
            return any((course / "autograded" / s / A / f"{A}.ipynb").exists() for s in STUDENTS)
        assert _wait_for(reached, 300), f"the run never reached the moment {moment!r}"
        record = next(registry.glob("*"))
        assert _wait_for(lambda: record.read_text().strip(), 30)
        ident, folder = record.name, Path(json.loads(record.read_text())["folder"])
        assert folder.is_dir() and folder.parent == Path(tempfile.gettempdir())
        os.killpg(driver.pid, signal.SIGKILL)  # the run and whatever is in its session; not its sandboxes' own sessions
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()

    assert (registry / ident).exists(), "a stopped run leaves its record"
    summary = grade.autograde([A], settings, progress=False)
    assert not summary.failed and sorted(s for _, s in summary.graded) == list(STUDENTS), str(summary)
    assert _full_marks(course) == {s: True for s in STUDENTS}, "the grades are not an uninterrupted run's"
    assert not _marked(ident), [p.cmdline() for p in _marked(ident)]
    assert not list(registry.iterdir()), "a record of a run is left"
    assert not folder.exists(), "the stopped run's temporary folder is left"


def test_a_live_run_is_left_alone_and_a_record_cannot_remove_other_folders(tmp_path):
    """Two runs of one course at once (the service beside make autograde): neither cleans up the other; a
    forged record naming a folder that is not a run's folder removes nothing."""
    course = tmp_path / "course"
    course.mkdir()
    first = runs.start(course)
    try:
        second = runs.start(course)
        assert first.folder.is_dir() and (course / runs.REGISTRY / first.ident).exists()
        second.close()
        precious = tmp_path / "precious"
        precious.mkdir()
        (course / runs.REGISTRY / "forged").write_text(f'{{"folder": "{precious}"}}')
        assert runs.clean_stopped(course) == ["forged"]
        assert precious.is_dir() and first.folder.is_dir()
    finally:
        first.close()
    assert not first.folder.exists() and not list((course / runs.REGISTRY).iterdir())


#: A run whose process ends (as when killed) while a child it forked still holds its record's file, in a session
#: of its own; prints the run's id and the child's pid.
ORPHANED_LOCK = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from autograder.grading import runs
    run = runs.start(Path(sys.argv[1]))
    child = os.fork()
    if child == 0:
        os.setsid()
        for fd in (0, 1, 2):  # the test reads the output to its end
            os.dup2(os.open(os.devnull, os.O_RDWR), fd)
        time.sleep(120)
        os._exit(0)
    print(run.ident, child, flush=True)
    os._exit(0)
""")


def test_a_run_whose_lock_outlives_its_process_is_cleaned_up(tmp_path):
    """A run's lock is held by every process holding its file, and a child forked by the run holds it until it
    execs or dies: killed with the run on a busy machine, it may not have died yet when the next run looks (seen in
    ``make test`` under load: a killed run's record and folder left). A run whose own process has ended is stopped,
    whoever still holds its lock; a live run is still left alone (the test above)."""
    course = tmp_path / "course"
    course.mkdir()
    done = subprocess.run([sys.executable, "-c", ORPHANED_LOCK, str(course)], capture_output=True, text=True,
                          timeout=120, check=True)
    ident, child = done.stdout.split()
    try:
        record = course / runs.REGISTRY / ident
        folder = Path(json.loads(record.read_text())["folder"])
        with open(record) as handle:  # the lock is held: by the child alone, its run's process has ended
            with pytest.raises(OSError):
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert runs.clean_stopped(course) == [ident]
        assert not record.exists() and not folder.exists()
    finally:
        os.kill(int(child), signal.SIGKILL)


def test_a_locked_record_of_another_machine_is_left_alone(tmp_path):
    """A course folder shared by two machines: a run's process is not among this machine's, and its lock is all
    that says whether it lives. Here the same record, its process ended, is cleaned up only when it is this
    machine's."""
    course = tmp_path / "course"
    registry = course / runs.REGISTRY
    registry.mkdir(parents=True)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    facts = {"pid": int(ended.stdout), "started": psutil.Process().create_time(), "host": "another-machine"}
    record = registry / ("1" * 32)
    record.write_text(json.dumps(facts))
    with open(record) as holder:  # its run, alive elsewhere, holds the lock
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert runs.clean_stopped(course) == [] and record.exists()
        record.write_text(json.dumps(dict(facts, host=socket.gethostname())))
        assert runs.clean_stopped(course) == [record.name] and not record.exists()


def test_a_process_born_while_the_leftovers_are_scanned_is_killed_too(tmp_path, monkeypatch):
    """A scan of the processes sees those that lived when it began: a stopped run's process that forks meanwhile
    leaves a child the scan never sees, which goes on making files in the folder being removed (seen once in
    ``make test``: a killed run's folder left, with a kernel's folder made after the clean-up). Here the child is
    born right after the first scan's list is taken; it is marked as its parent was, and must be killed too."""
    ident = "0" * 32
    env = dict(os.environ, **{RUN_VARIABLE: f"{ident}:run"})
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    born: list[subprocess.Popen] = []
    real = psutil.process_iter

    def scan_with_a_birth(*args, **kwargs):
        procs = list(real(*args, **kwargs))  # the list is taken: what starts now is not in it
        if not born:
            born.append(subprocess.Popen(sleeper, env=env))
            assert _wait_for(lambda: _marked(ident), 30)
        return iter(procs)

    parent = subprocess.Popen(sleeper, env=env)
    try:
        assert _wait_for(lambda: len(_marked(ident)) == 1, 30)
        monkeypatch.setattr(psutil, "process_iter", scan_with_a_birth)
        assert sandbox.kill_leftovers(f"{ident}:", RUN_VARIABLE, prefix=True) == 2
        assert parent.wait(timeout=30) == -signal.SIGKILL
        assert born[0].wait(timeout=30) == -signal.SIGKILL, "the process born during the scan lives on"
    finally:
        for proc in [parent, *born]:
            proc.kill()
            proc.wait()
