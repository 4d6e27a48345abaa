"""A term's commands, typed as docs/term.md says, on one small class in a fresh clone.

The grading service is started on the new course first. Then a learning platform's zip of three students
of notebook 01 (its reference answers, the notebook as released, and catalogued mistakes) is collected
with ``make collect-zip``, graded with ``make autograde``, then ``make feedback``, ``make grades``,
``make report`` and ``make similarity`` run on it: once, in one module fixture, so the class is graded
once; each test asserts on what its command gave the instructor (exit status, message, files and their
content).
"""

from __future__ import annotations

import contextlib
import csv
import html
import os
import re
import signal
import subprocess
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.engine import sandbox

from ..course_copy import depends_on, fill, mistake_source, mistake_submissions, reference_answers
from . import user
from .test_make_targets import free_port

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("frontdoor-term"),
              pytest.mark.skipif(bool(user.why_not()), reason=user.why_not() or "-")]

A = "01_soft_lookup"
#: student id -> Canvas user id, as the platform names each upload.
CANVAS = {"reference": "1001", "untouched": "1002", "mistaken": "1003"}
#: The term's commands, in order (docs/term.md); NO_SANDBOX=1 is added where no sandbox can be made (the manual's advice).
COMMANDS = {
    # the grading service on a course with no gradebook yet (docs/jupyterhub.md: "Without a hub, ..."), an empty exchange
    "python -m autograder serve": ["-m", "autograder", "serve", "--until-idle", "--exchange", "served-exchange"],
    "collect-zip": ["collect-zip", "ZIP=submissions.zip", f"ASSIGNMENTS={A}"],
    "autograde": ["autograde", f"ASSIGNMENTS={A}"],
    # docs/term.md's command line, with its limits (01's cells take well under a second each): graded again
    "python -m autograder autograde": ["-m", "autograder", "autograde", A, "--cell-timeout", "60",
                                       "--notebook-timeout", "600"],
    # docs/scale.md's "By hand": a scheduler, a worker in the course's .venv, then make autograde CLUSTER=...
    "autograde on a cluster": ["autograde", f"ASSIGNMENTS={A}"],
    "feedback": ["feedback"],
    "grades": ["grades"],
    "report": ["report"],
    "similarity": ["similarity"],
}


def mistakes() -> dict:
    return mistake_submissions(A)[0]


def platform_zip(course: Path) -> Path:
    """The three students' uploads, named as Canvas names them in its zip of submissions."""
    released = nbformat.read(course / "notebooks" / f"{A}.ipynb", as_version=4)
    reference = reference_answers(A)
    needed = set().union(*(depends_on(A, e, m) for e, m in mistakes().items()))
    notebooks = {
        "reference": fill(released, reference),
        "untouched": released,
        "mistaken": fill(released, {e: reference[e] for e in needed} | {e: mistake_source(m, e)
                                                                         for e, m in mistakes().items()}),
    }
    path = course / "submissions.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for student, notebook in notebooks.items():
            archive.writestr(f"{student}_{CANVAS[student]}_9{CANVAS[student]}_{A}.ipynb", nbformat.writes(notebook))
    return path


@pytest.fixture(scope="module")
def term():
    """The clone, and what each of the term's commands gave (run in order, each once)."""
    course = user.clone()
    try:
        platform_zip(course)
        done: dict[str, subprocess.CompletedProcess] = {}
        for name, args in COMMANDS.items():
            if name.startswith("python"):
                args = [*args, *(["--no-sandbox"] if sandbox.mode() == "limits only" else [])]
                (course / "served-exchange").mkdir(exist_ok=True)
                done[name] = subprocess.run([str(user.VENV / "bin" / "python"), *args], cwd=course, env=user.user_env(),
                                            capture_output=True, text=True, timeout=user.HANG, stdin=subprocess.DEVNULL)
                continue
            if name.startswith("autograde") and sandbox.mode() == "limits only":
                args = [*args, "NO_SANDBOX=1"]
            if name == "autograde on a cluster":
                if sandbox.mode() != "limits only" or os.geteuid() == 0:  # else its test says why it is skipped
                    done[name] = on_a_cluster(course, args)
                continue
            done[name] = user.make(course, *args)
        yield course, done
    finally:
        user.remove(course)


def on_a_cluster(course: Path, args: list[str]) -> subprocess.CompletedProcess:
    """docs/scale.md's guide typed as written, on this machine: `.venv/bin/dask scheduler --port P`, `.venv/bin/dask
    worker tcp://host:P --nworkers 1 --nthreads 1` (one worker where the guide starts 8 a machine, and a free port
    for 8786: this machine has 2 cores and other tests), `make autograde CLUSTER=...`."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = str(user.VENV / "bin" / "dask")
    started = [subprocess.Popen(command, cwd=course, env=user.user_env(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
               for command in ([dask, "scheduler", "--port", str(port)],
                               [dask, "worker", address, "--nworkers", "1", "--nthreads", "1"])]
    try:
        return user.make(course, *args, f"CLUSTER={address}")
    finally:
        for process in reversed(started):  # the worker (its nanny and its process), then the scheduler
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def page_text(path: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", path.read_text()))


def test_python_m_autograder_serve_starts_on_a_new_course_as_typed(term):
    """Typed as `.venv/bin/python -m autograder ...`: nothing has put the environment's commands on PATH, yet
    nbgrader runs `alembic` by name to create the gradebook."""
    _, done = term
    served = done["python -m autograder serve"]
    assert served.returncode == 0, user.said(served)
    assert "alembic" not in served.stderr and "could not" not in served.stderr, user.said(served)


def test_make_collect_zip_puts_each_student_in_submitted(term):
    course, done = term
    assert done["collect-zip"].returncode == 0, user.said(done["collect-zip"])
    assert sorted(p.name for p in (course / "submitted").iterdir()) == sorted(CANVAS)
    for student in CANVAS:
        assert (course / "submitted" / student / A / f"{A}.ipynb").is_file(), student


def test_make_autograde_grades_the_class(term):
    course, done = term
    assert done["autograde"].returncode == 0, user.said(done["autograde"])
    assert "graded 3, could not be graded 0" in done["autograde"].stdout, user.said(done["autograde"])
    for student in CANVAS:
        assert (course / "autograded" / student / A / f"{A}.ipynb").is_file(), student


@pytest.mark.skipif(sandbox.mode() == "limits only" and os.geteuid() != 0,
                    reason="no sandbox here and not root: a Dask worker would run student code as you")
def test_make_autograde_on_a_cluster_as_the_manual_starts_one(term):
    _, done = term
    graded = done["autograde on a cluster"]
    assert graded.returncode == 0 and "graded 3, could not be graded 0" in graded.stdout, user.said(graded)


def test_python_m_autograder_autograde_grades_it_again_with_its_limits(term):
    _, done = term
    again = done["python -m autograder autograde"]
    assert again.returncode == 0 and "graded 3, could not be graded 0" in again.stdout, user.said(again)


def test_make_feedback_names_the_mistake_and_hides_the_hidden_tests(term):
    course, done = term
    assert done["feedback"].returncode == 0, user.said(done["feedback"])
    page = page_text(course / "feedback" / "mistaken" / A / f"{A}.html")
    for mistake in mistakes().values():
        assert mistake.name in page, mistake.name
    assert "BEGIN HIDDEN TESTS" not in page and "autograder.hidden" not in page


def test_make_grades_writes_both_csvs_with_every_student(term):
    course, done = term
    assert done["grades"].returncode == 0, user.said(done["grades"])
    assert "grades.csv, grades-canvas.csv: 3 students" in done["grades"].stdout, user.said(done["grades"])
    with open(course / "grades.csv", newline="") as handle:
        rows = {row["student_id"]: row for row in csv.DictReader(handle)}
    assert set(rows) == set(CANVAS)
    assert float(rows["reference"]["score"]) == float(rows["reference"]["max_score"]) > 0
    assert float(rows["untouched"]["score"]) == 0
    assert float(rows["mistaken"]["score"]) < float(rows["mistaken"]["max_score"])
    with open(course / "grades-canvas.csv", newline="") as handle:
        canvas = list(csv.reader(handle))
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", A]
    assert canvas[1][0] == "Points Possible" and float(canvas[1][5]) == float(rows["reference"]["max_score"])
    assert {row[3]: row[1] for row in canvas[2:]} == CANVAS  # each student's Canvas id, from the zip's names
    assert {row[3]: float(row[5]) for row in canvas[2:]} == {s: float(rows[s]["score"]) for s in CANVAS}


def test_make_report_counts_the_named_mistakes(term):
    course, done = term
    assert done["report"].returncode == 0, user.said(done["report"])
    assert "report/index.html: 3 graded submissions of 1 assignments" in done["report"].stdout, user.said(done["report"])
    page = page_text(course / "report" / "index.html")
    for mistake in mistakes().values():
        assert mistake.name in page, mistake.name
    assert (course / "report" / f"{A}-scores.png").stat().st_size > 0


def test_make_similarity_finds_the_answers_that_match_the_reference(term):
    course, done = term
    assert done["similarity"].returncode == 0, user.said(done["similarity"])
    said = done["similarity"].stdout
    assert "similarity: report/similarity/index.html: 3 submissions of 1 assignments" in said, user.said(done["similarity"])
    matching = int(re.search(r"(\d+) answers matching the reference solution", said).group(1))
    assert matching >= len(reference_answers(A)), said  # the reference student's answers, at least
    assert "reference" in page_text(course / "report" / "similarity" / "index.html")
