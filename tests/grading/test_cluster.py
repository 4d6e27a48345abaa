"""Grading on a Dask cluster: real scheduler and worker processes, one killed mid-run; the same grades as here."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course.repository import module_name, nbgrader
from autograder.course.settings import Settings
from autograder.engine import sandbox
from autograder.grading import grade

from ..course_copy import fill, grading_settings, make_course, mistake_source, reference_answers, released, submit
from ..notebook_code import ROOT

distributed = pytest.importorskip("distributed", reason="the Dask tests need `distributed` (make setup installs it)")
from autograder.grading import cluster  # noqa: E402 - only where distributed is there

A = "01_soft_lookup"
MARK = "AUTOGRADER_TEST_CLUSTER"  # in the environment of every process a test's workers start


# -- fast: what the submitting side does with a worker's answer -----------------------------------


class _Future:
    def __init__(self, outcome):
        self.outcome = outcome

    def result(self):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def release(self):
        pass


class _Client:
    """Stands in for a Dask client: every task's answer is ``outcome``; what was sent is kept."""

    def __init__(self, outcome):
        self.outcome, self.sent = outcome, []

    def submit(self, fn, *args, **kwargs):
        self.sent.append(args)
        return _Future(self.outcome)


def _remote(outcome, mode: str = "bwrap") -> cluster.ClusterRunner:
    remote = cluster.ClusterRunner.__new__(cluster.ClusterRunner)  # no scheduler: only what happens around a task
    remote.server, remote.course, remote.client, remote._mode = None, "course", _Client(outcome), mode
    remote._writing = threading.Lock()
    return remote


def test_a_task_that_raises_is_not_graded_and_gets_no_score(tmp_path):
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / f"{A}.ipynb", tmp_path / "notebooks" / f"{A}.ipynb")
    submit(tmp_path, A, "kim", nbformat.read(ROOT / "notebooks" / f"{A}.ipynb", as_version=4))
    remote = _remote(OSError("No space left on device"))  # raised by the task on its worker
    # The worker has bubblewrap (mode "bwrap"), whatever this machine has: the note names the worker's protection.
    outcome = grade.grade_one(A, "kim", Settings.load(tmp_path, {"Grading.sandbox": True}), remote)
    assert outcome.error is not None and outcome.error == "OSError: No space left on device"
    (course, assignment, student, files, _, _), = remote.client.sent
    assert (assignment, student) == (A, "kim") and f"{A}.ipynb" in files  # the staged copy was what went
    assert not (tmp_path / "gradebook.db").exists()  # no score, not even a 0
    kept = json.loads((tmp_path / "autograded" / "kim" / A / ".grading-notes.json").read_text())
    assert [n["kind"] for n in kept] == ["protection", "failed"] and "(bwrap)" in kept[0]["message"]


def test_a_worker_without_a_sandbox_refuses_to_grade(monkeypatch):
    monkeypatch.setenv("AUTOGRADER_SANDBOX", "off")
    with pytest.raises(grade.SandboxUnavailable, match="--no-sandbox"):
        cluster.grade_staged("no-such-course", A, "kim", {}, Settings.load(ROOT, {"Grading.sandbox": True}), 10)


def test_a_workers_copy_of_the_course_is_the_graders_alone(tmp_path, monkeypatch):
    """A worker grades in a copy of the course in its temporary folder (the gradebook, the submission): mode 0700
    as tempfile made it, not the course folder's 0755, which copytree copies onto it."""
    import contextlib
    import stat
    import types

    course = tmp_path / "course"
    (course / "courses" / A).mkdir(parents=True)
    (course / "courses" / A / "gradebook.db").write_bytes(b"")
    (course / "courses" / A).chmod(0o755)
    seen = {}

    def run(assignment, student, settings, staged, limit, server):
        private = settings.root
        seen.update(mode=stat.S_IMODE(private.stat().st_mode), private=private)
        return "stopped before nbgrader"

    monkeypatch.setattr(cluster, "course_folder", lambda name: course)
    monkeypatch.setattr(cluster, "_WORKER", types.SimpleNamespace(using=lambda *args: contextlib.nullcontext()))
    monkeypatch.setattr(cluster, "run_nbgrader", run)
    graded = cluster.grade_staged("c", A, "kim", {f"{A}.ipynb": b"{}"}, Settings.load(tmp_path, {"Grading.sandbox": False}), 10)
    assert graded.error == "stopped before nbgrader"
    assert oct(seen["mode"]) == oct(0o700) and not seen["private"].exists()


@pytest.mark.parametrize("name", ["../outside", "/etc/passwd", "a/../../b", "a//b", "", "./a"])
def test_no_file_is_written_outside_the_submission(tmp_path, name):
    with pytest.raises(ValueError, match="not a file inside"):
        cluster.write_tree(tmp_path / "autograded", {"fine.txt": b"x", name: b"y"})
    assert not (tmp_path / "autograded").exists()


def test_a_planted_link_is_replaced_never_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "autograded").symlink_to(elsewhere)
    cluster.write_tree(tmp_path / "autograded", {"sub/a.ipynb": b"{}"})
    assert list(elsewhere.iterdir()) == [] and (tmp_path / "autograded" / "sub" / "a.ipynb").read_bytes() == b"{}"
    assert not (tmp_path / "autograded").is_symlink()
    assert cluster.read_tree(tmp_path / "autograded") == {"sub/a.ipynb": b"{}"}


def test_a_manual_score_asks_for_review_and_lateness_costs_as_nbgrader_does(tmp_path):
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    with (tmp_path / "nbgrader_config.py").open("a") as config:
        config.write('\nc.LateSubmissionPlugin.penalty_method = "zero"\n')
    with Gradebook(grade.db_url(Settings.load(tmp_path))) as gb:
        gb.add_assignment("a", duedate=datetime(2029, 12, 31))  # only this gradebook knows it
        gb.add_notebook("n", "a")
        gb.add_notebook("missing", "a")
        for notebook in ("n", "missing"):
            gb.add_grade_cell("g", notebook, "a", max_score=2, cell_type="code")
            gb.add_solution_cell("s", notebook, "a")
        gb.add_student("kim")
        gb.add_submission("a", "kim")
        for notebook in ("n", "missing"):
            gb.find_grade("g", notebook, "a", "kim").manual_score = 1.0
        gb.db.commit()
    graded = cluster.Graded(files={"n.ipynb": b"{}"}, timestamp=datetime(2030, 1, 1),
                            grades=[("n", "g", 2.0, False), ("missing", "g", 0.0, False)],
                            comments=[("n", "s", "No response."), ("missing", "s", "not mine to set")])
    cluster.record(Settings.load(tmp_path), "a", "kim", graded, ["n"])
    with Gradebook(grade.db_url(Settings.load(tmp_path))) as gb:
        assert gb.find_submission("a", "kim").timestamp == datetime(2030, 1, 1)
        graded_cell, missing_cell = (gb.find_grade("g", n, "a", "kim") for n in ("n", "missing"))
        assert (graded_cell.auto_score, graded_cell.needs_manual_grade) == (2.0, True)  # graded again: review it
        assert (missing_cell.auto_score, missing_cell.needs_manual_grade) == (0.0, False)
        assert gb.find_comment("s", "n", "a", "kim").auto_comment == "No response."
        assert gb.find_comment("s", "missing", "a", "kim").auto_comment is None
        late = gb.find_submission_notebook("n", "a", "kim")
        assert late.score == 1.0 and late.late_submission_penalty == 1.0  # the manual score, all of it
    assert (tmp_path / "autograded" / "kim" / "a" / "n.ipynb").read_bytes() == b"{}"


def test_a_worker_switches_course_only_between_tasks(tmp_path, monkeypatch):
    """A task of another course (another archive) waits until the running ones are done, then gets its PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # the switch sets it; the test puts it back
    worker, order = cluster._Worker(), []
    first, second = tmp_path / "course-1", tmp_path / "course-2"
    no_server = Settings.load(tmp_path, {"Grading.forkserver": False})

    def other_course():
        with worker.using(second, no_server):
            order.append(("second", os.environ["PYTHONPATH"].split(os.pathsep)[0]))

    with worker.using(first, no_server):
        waiting = threading.Thread(target=other_course)
        waiting.start()
        time.sleep(0.5)
        order.append(("first", os.environ["PYTHONPATH"].split(os.pathsep)[0]))
    waiting.join(600)  # a busy machine may be slow to wake it; the order is the verdict, not the time
    assert order == [("first", str(first)), ("second", str(second))]


# -- slow: a real scheduler, two real workers, one of them killed -------------------------------


def _dask(*args: str, log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([str(Path(sys.executable).parent / "dask"), *args], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass
    process.wait()


@pytest.fixture
def dask_cluster(tmp_path):
    """(address, {worker name: process}): ``dask scheduler`` and two ``dask worker`` of one thread, on localhost."""
    if sandbox.mode() == "limits only" and os.geteuid() != 0:
        pytest.skip(f"no sandbox here ({sandbox.why_not()}) and not root: the workers would run student code as you")
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark}  # each worker's own value below: what a killed one left is killed with it
    folder = tmp_path / "dask"
    folder.mkdir()
    file = folder / "scheduler.json"
    scheduler = _dask("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", str(file),
                      log=folder / "scheduler.log", env=env)
    workers = {}
    try:
        deadline = time.monotonic() + 60
        while not file.is_file() and time.monotonic() < deadline and scheduler.poll() is None:
            time.sleep(0.2)
        assert file.is_file(), (folder / "scheduler.log").read_text()
        address = json.loads(file.read_text())["address"]
        for name in ("w0", "w1"):
            workers[name] = _dask("worker", address, "--name", name, "--nthreads", "1", "--nworkers", "1", "--no-nanny",
                                  "--no-dashboard", "--local-directory", str(folder / name), log=folder / f"{name}.log",
                                  env=env | {MARK: f"{mark}-{name}"})
        with distributed.Client(address, set_as_default=False, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
        yield address, workers, mark
    finally:
        for process in [*workers.values(), scheduler]:
            _stop(process)
        sandbox.kill_leftovers(mark, MARK, prefix=True)  # what a killed worker's nbgrader was still doing


def _class(course: Path) -> None:
    """A small class; ``reference`` submitted after the due date, which costs it every point (penalty "zero")."""
    rel, ref = released(course, A), reference_answers(A)
    mistakes = importlib.import_module(f"autograder.hidden.{module_name(A)}").MISTAKES
    exercise, catalogue = sorted(mistakes.items())[0]
    submit(course, A, "reference", fill(rel, ref))
    submit(course, A, "untouched", rel)
    submit(course, A, "mistake", fill(rel, dict(ref, **{exercise: mistake_source(catalogue[0], exercise)})))
    (course / "submitted" / "nothing" / A).mkdir(parents=True)
    (course / "submitted" / "nothing" / A / "answers.txt").write_text("no notebook")
    for student, stamp in (("reference", "2030-01-02 00:00:00.000000 UTC"), ("untouched", "2029-12-31 00:00:00.000000 UTC")):
        (course / "submitted" / student / A / "timestamp.txt").write_text(stamp)
    with (course / "nbgrader_config.py").open("a") as config:
        config.write('\nc.LateSubmissionPlugin.penalty_method = "zero"\n')
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        gb.update_or_create_assignment(A, duedate=datetime(2030, 1, 1))


def _without_times(data: bytes) -> dict:
    """A graded notebook without the times its cells ran at."""
    notebook = json.loads(data)
    for cell in notebook["cells"]:
        cell["metadata"].pop("execution", None)
    return notebook


def _graded(course: Path) -> dict:
    """What grading left: the export, every cell's score, and each submission's autograded files (notes included)."""
    url = grade.db_url(Settings.load(course))
    nbgrader("export", "--to", str(course / "grades.csv"), f"--db={url}", "--log-level=WARN", root=course)
    with Gradebook(url) as gb:
        cells = sorted((s.id, g.name, g.auto_score, g.needs_manual_grade) for s in gb.students
                       for g in gb.find_submission_notebook(A, A, s.id).grades)
    files = {p.relative_to(course / "autograded").as_posix(): _without_times(p.read_bytes()) if p.suffix == ".ipynb"
             else p.read_bytes() for p in sorted((course / "autograded").rglob("*")) if p.is_file()}
    return {"export": (course / "grades.csv").read_text(), "cells": cells, "files": files}


def _difference(there, here, where: str = "") -> list[str]:
    """Where two gradings' records differ, leaf by leaf (the whole records run to megabytes)."""
    if isinstance(there, dict) and isinstance(here, dict):
        return [line for key in sorted(set(there) | set(here), key=str)
                for line in _difference(there.get(key), here.get(key), f"{where}[{key!r}]")]
    if isinstance(there, list) and isinstance(here, list) and len(there) == len(here):
        return [line for i, (a, b) in enumerate(zip(there, here)) for line in _difference(a, b, f"{where}[{i}]")]
    return [] if there == here else [f"{where}: there {there!r:.1500} here {here!r:.1500}"]


@pytest.mark.slow
def test_a_cluster_grades_like_here_when_a_worker_dies(tmp_path, dask_cluster, monkeypatch):
    """The same records (export, scores, graded notebooks and notes) from the cluster, one worker killed, as here.

    No verdict depends on the machine's speed: both run under the tests' unhurried limits
    (:data:`tests.course_copy.UNHURRIED`), so that a busy moment (the other pytest worker grades beside) cannot
    stop a cell in one run and not in the other; the killed worker's nbgrader is killed with it.
    """
    address, workers, mark = dask_cluster
    (tmp_path / "here").mkdir()
    here = make_course(tmp_path / "here", [A])
    _class(here)
    there = tmp_path / "there"
    shutil.copytree(here, there)

    recorded, killed = Counter(), []
    original = cluster.record

    def record_then_kill_a_busy_worker(root, assignment, student, graded, notebooks):
        if not recorded:  # the first result is in: kill a worker that is grading another submission
            with distributed.Client(address, set_as_default=False) as client:
                names = {a: w["name"] for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
                busy = sorted(names[a] for a, keys in client.processing().items() if keys)
            if busy:
                _stop(workers[busy[0]])
                sandbox.kill_leftovers(f"{mark}-{busy[0]}", MARK)  # its nbgrader, as a dead machine's would be
                killed.append(busy[0])
        recorded[(assignment, student)] += 1
        original(root, assignment, student, graded, notebooks)

    monkeypatch.setattr(cluster, "record", record_then_kill_a_busy_worker)
    remote = cluster.autograde(address, [A], grading_settings(there), progress=False)
    local = grade.autograde([A], grading_settings(here, {"Grading.workers": 2}), progress=False)

    assert killed, "no worker was grading when the first result came: nothing was lost"
    assert not remote.failed and not local.failed, (str(remote), str(local))
    assert remote.graded == local.graded and len(local.graded) == 4, (str(remote), str(local))
    assert recorded == Counter({(A, s): 1 for s in ("reference", "untouched", "mistake")}), recorded  # "nothing": here
    assert remote.protection == local.protection, (remote.protection, local.protection)
    remote_files, local_files = _graded(there), _graded(here)
    assert remote_files == local_files, "\n".join(_difference(remote_files, local_files))
    with Gradebook(grade.db_url(Settings.load(there))) as gb:
        late = gb.find_submission(A, "reference")
        assert late.score > 0 and late.late_submission_penalty == late.score  # graded for real, then the penalty
