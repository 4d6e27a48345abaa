"""Parallel grading: the same grades as one at a time, every time, with nothing lost in the gradebook."""

from __future__ import annotations

import importlib
import json
import shutil
import threading
import zipfile
from concurrent.futures import ProcessPoolExecutor

import nbformat
import pytest
import sqlalchemy
from nbgrader.api import Gradebook

from autograder.course import settings
from autograder.course.repository import module_name, nbgrader
from autograder.course.settings import Settings
from autograder.grading import collect, grade

from ..course_copy import fill, grading_settings, make_course, mistake_source, reference_answers, released, submit
from ..demonstrations import release_without_demonstrations
from ..notebook_code import ROOT

A = "01_soft_lookup"


def export(course, name: str) -> bytes:
    """``nbgrader export`` of the course's gradebook, as bytes."""
    path = course / name
    nbgrader("export", "--to", str(path), f"--db={grade.db_url(Settings.load(course))}", "--log-level=WARN", root=course)
    return path.read_bytes()


def cell_grades(course) -> list[tuple[str, str, float | None]]:
    """Every (student, test cell, score) of the gradebook, sorted."""
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        return sorted(
            (student.id, g.name, g.score)
            for student in gb.students
            for g in gb.find_submission_notebook(A, A, student.id).grades
        )


@pytest.mark.slow
def test_parallel_equals_serial_and_repeats(tmp_path):
    course = make_course(tmp_path, [A])
    rel, ref = release_without_demonstrations(released(course, A), A), reference_answers(A)  # the grades: not the plots
    mistakes = importlib.import_module(f"autograder.hidden.{module_name(A)}").MISTAKES
    submit(course, A, "reference", fill(rel, ref))
    submit(course, A, "untouched", rel)
    for i, (exercise, catalogue) in enumerate(sorted(mistakes.items())[:2]):
        submit(course, A, f"mistake_{i}", fill(rel, dict(ref, **{exercise: mistake_source(catalogue[0], exercise)})))
    submit(course, A, "broken", fill(rel, dict(ref, soft_lookup="def soft_lookup(:\n    pass\n")))

    runs = []
    for workers in (1, 2):  # two gradings of the same class: serial, then parallel over it again
        summary = grade.autograde([A], grading_settings(course, {"Grading.workers": workers}), progress=False)
        assert not summary.failed, str(summary)
        assert len(summary.graded) == 5
        runs.append((export(course, f"grades-{len(runs)}.csv"), cell_grades(course)))
    (csv1, cells1), (csv2, cells2) = runs
    assert csv1 == csv2, "grading in parallel or twice changed the exported grades"
    assert cells1 == cells2
    assert csv1.count(b"\n") == 6  # a header and one row per student
    scores = {(s, g): v for s, g, v in cells1}
    assert all(v > 0 for (s, _), v in scores.items() if s == "reference")
    assert all(v == 0 for (s, _), v in scores.items() if s == "untouched")


def test_sqlite_gradebook_waits_instead_of_failing(tmp_path):
    for busy in (settings.Grading().sqlite_busy_timeout, 7):  # the default, then the course's own setting
        if busy == 7:
            (tmp_path / "nbgrader_config.py").write_text("c = get_config()\nc.Grading.sqlite_busy_timeout = 7\n")
        engine = sqlalchemy.create_engine(grade.db_url(Settings.load(tmp_path)))
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == busy * 1000
        engine.dispose()


def _write_submission(args) -> str:
    url, student = args
    with Gradebook(url) as gb:
        gb.update_or_create_student(student)
        submission = gb.update_or_create_submission("a", student)
        for notebook in submission.notebooks:
            for g in notebook.grades:
                g.auto_score = float(len(student))
        gb.db.commit()
    return student


def test_many_writers_lose_no_row(tmp_path):
    url = grade.db_url(Settings.load(tmp_path))
    with Gradebook(url) as gb:
        gb.add_assignment("a")
        gb.add_notebook("n", "a")
        for i in range(3):
            gb.add_grade_cell(f"g{i}", "n", "a", max_score=1, cell_type="code")
    students = [f"student{'x' * (i % 5)}{i}" for i in range(48)]
    with ProcessPoolExecutor(max_workers=8) as pool:
        done = list(pool.map(_write_submission, [(url, s) for s in students]))
    assert sorted(done) == sorted(students)
    with Gradebook(url) as gb:
        assert len(gb.students) == len(students)
        for student in students:
            grades = gb.find_submission_notebook("n", "a", student).grades
            assert [g.auto_score for g in grades] == [float(len(student))] * 3


def test_workers_default_to_the_cores_and_the_run_reports(tmp_path, monkeypatch, capsys):
    for student in ("a", "b", "c", "d", "e"):
        (tmp_path / "submitted" / student / A).mkdir(parents=True)
    (tmp_path / "source" / A).mkdir(parents=True)
    (tmp_path / "source" / A / f"{A}.ipynb").write_text("{}")
    running, peak, lock, both = [0], [0], threading.Lock(), threading.Event()

    def fake_grade_one(assignment, student, settings, server):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            if running[0] == 2:
                both.set()
        both.wait(600)  # until two run at once, however slowly the second starts (one worker: never, and peak is 1)
        with lock:
            running[0] -= 1
        return grade.SubmissionResult(assignment, student, error="it broke" if student == "c" else None)

    monkeypatch.setattr(grade, "grade_one", fake_grade_one)
    monkeypatch.setattr(grade, "prepare_gradebook", lambda jobs, settings: [])
    monkeypatch.setattr(grade.os, "cpu_count", lambda: 2)
    no_server = {"Grading.forkserver": False}  # grade_one is a stand-in: nothing would run in the fork server
    summary = grade.autograde([A], grading_settings(tmp_path, no_server), progress=True)
    assert peak[0] == 2
    assert len(summary.graded) == 4 and summary.failed == [(A, "c", "it broke")]
    progress = capsys.readouterr().err
    assert "5/5 done (4 graded, 1 could not be)" in progress and "ETA" in progress
    text = str(summary)
    assert text.startswith("graded 4, could not be graded 1, in ") and "protection: " in text
    assert text.count("it broke") == 1 and "  01_soft_lookup / c: it broke" in text


def test_grading_refuses_to_run_student_code_without_a_sandbox(tmp_path, monkeypatch):
    """Where no sandbox can be made, grading stops and says how to get one, unless told --no-sandbox."""
    submit(tmp_path, A, "s", nbformat.v4.new_notebook())
    (tmp_path / "source" / A).mkdir(parents=True)
    monkeypatch.setenv("AUTOGRADER_SANDBOX", "off")
    graded = []
    monkeypatch.setattr(grade, "grade_one", lambda a, s, settings, server: graded.append(s) or grade.SubmissionResult(a, s))
    monkeypatch.setattr(grade, "prepare_gradebook", lambda jobs, settings: [])
    with pytest.raises(grade.SandboxUnavailable, match="bubblewrap") as refused:
        grade.autograde([A], Settings.load(tmp_path), progress=False)
    assert "--no-sandbox" in str(refused.value) and graded == []
    unsandboxed = {"Grading.sandbox": False, "Grading.forkserver": False}  # grade_one is a stand-in: no fork server
    summary = grade.autograde([A], Settings.load(tmp_path, unsandboxed), progress=False)
    assert graded == ["s"] and "WITHOUT a sandbox" in summary.protection


def test_a_fresh_gradebook_records_the_assignment_it_grades(tmp_path):
    """A clone has no gradebook: grading records the assignment from source/ instead of failing for everyone."""
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    shutil.copytree(ROOT / "source" / A, tmp_path / "source" / A)
    recorded = grade.prepare_gradebook([(A, "s")], Settings.load(tmp_path))
    assert recorded == [A]
    with Gradebook(grade.db_url(Settings.load(tmp_path))) as gb:
        assert [n.name for n in gb.find_assignment(A).notebooks] == [A]
    assert grade.prepare_gradebook([(A, "s")], Settings.load(tmp_path)) == []
    with pytest.raises(FileNotFoundError, match="make release"):
        grade.prepare_gradebook([("99_missing", "s")], Settings.load(tmp_path))


def test_an_lms_zip_lands_in_submitted(tmp_path):
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    (tmp_path / "build" / "release" / A).mkdir(parents=True)
    shutil.copy(ROOT / "notebooks" / f"{A}.ipynb", tmp_path / "build" / "release" / A / f"{A}.ipynb")
    notebook = (ROOT / "notebooks" / f"{A}.ipynb").read_bytes()
    archive = tmp_path / "submissions.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"doejane_1234_567890_{A}.ipynb", notebook)
        zf.writestr(f"roesmith_LATE_1235_567891_{A}-1.ipynb", notebook)  # late, resubmitted
        zf.writestr("kimlee_1236_567892_my homework.ipynb", notebook)  # renamed: graded as the notebook later
        zf.writestr(f".._1237_567893_{A}.ipynb", notebook)  # no student id may leave submitted/
        zf.writestr("readme.txt", "not a submission")
    collected = collect.collect_zip(A, archive, root=tmp_path)
    assert collected.students == ["doejane", "kimlee", "roesmith"] and collected.skipped == []
    submitted = tmp_path / "submitted"
    assert (submitted / "doejane" / A / f"{A}.ipynb").read_bytes() == notebook
    assert (submitted / "roesmith" / A / f"{A}.ipynb").is_file()
    assert (submitted / "kimlee" / A / "my homework.ipynb").is_file()
    # exchange/ is made by nbgrader_config.py itself, so that nbgrader's Assignment List finds it
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["nbgrader_config.py", "build", "submissions.zip", "downloaded", "submitted", "exchange"])


def test_the_fork_server_runs_nbgrader_like_a_new_process(tmp_path):
    from autograder.course.repository import tool_env
    from autograder.engine.forkserver import ForkServer

    server = ForkServer(Settings.load(ROOT))
    try:
        code, out, err = server.run(["--version"], tmp_path, tool_env(), 120, tmp_path)
        assert code == 0 and out.strip() == nbgrader("--version", root=tmp_path).stdout.strip()
        code, out, err = server.run(["autograde", "no_such_assignment", "--student", "x"], tmp_path, tool_env(), 120,
                                    tmp_path)
        assert code == 1 and "no_such_assignment" in err
    finally:
        server.close()
    assert server.process.returncode == 0


def test_the_fork_server_imports_the_checks_of_the_runs_assignments_only(tmp_path):
    """The checks a forked nbgrader finds imported are those of the run's assignments; another's it imports itself."""
    from autograder.course.repository import assignments, tool_env
    from autograder.engine.forkserver import ForkServer, checks_of

    every = checks_of(None)
    assert len(every) == 2 * len(assignments()) and checks_of(["01_soft_lookup"]) == [
        "autograder.checks.soft_lookup", "autograder.hidden.soft_lookup"]
    # nbgrader runs the course's nbgrader_config.py in the forked child (more than once): the first time, it says what
    # the child found imported, then imports another assignment's checks
    (tmp_path / "nbgrader_config.py").write_text(
        "import json, os, sys\n"
        "if not os.path.exists('imported.json'):\n"
        f"    found = sorted(m for m in {every!r} if m in sys.modules)\n"
        "    __import__('autograder.hidden.masking')\n"
        "    open('imported.json', 'w').write(json.dumps([found, 'autograder.hidden.masking' in sys.modules]))\n")
    server = ForkServer(Settings.load(ROOT), assignments=["01_soft_lookup"])
    try:
        code, _, err = server.run(["autograde", "no_such_assignment", "--student", "x"], tmp_path, tool_env(), 120,
                                  tmp_path)
    finally:
        server.close()
    assert code == 1 and "no_such_assignment" in err, err
    found, other = json.loads((tmp_path / "imported.json").read_text())
    assert found == sorted(checks_of(["01_soft_lookup"])) and other
