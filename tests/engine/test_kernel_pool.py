"""The warm kernel pool: one fresh kernel per submission, discarded when idle, the same grades as without it."""

from __future__ import annotations

import copy
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from traitlets.config import Config

from autograder.course.repository import module_name, nbgrader, tool_env
from autograder.course.settings import Settings
from autograder.engine import kernel_pool, sandbox, zygote
from autograder.engine.execute import ResilientExecute
from autograder.engine.kernel_manager import SandboxedKernelManager
from autograder.engine.notes import KERNEL_DIED
from autograder.grading import grade

from ..course_copy import fill, grading_settings, make_course, mistake_source, reference_answers, released, submit
from ..demonstrations import release_without_demonstrations

A = "01_soft_lookup"
needs_bwrap = pytest.mark.skipif(sandbox.mode() == "limits only", reason="the pool runs only in the bubblewrap sandbox")

# First cell of every submission: what the kernel holds before the student's code runs, then traces left behind
# (a global, a file in the working folder, in TMPDIR and in the home) for the next submission to find.
PROBE = """import os, sys
print("preloaded:", "torch" in sys.modules)
places = ["left.txt", os.path.join(os.environ["TMPDIR"], "left.txt"), os.path.expanduser("~/left.txt")]
print("seen:", "LEFT_BY_ANOTHER" in globals(), [p for p in places if os.path.exists(p)])
LEFT_BY_ANOTHER = 1
for p in places:
    open(p, "w").write("left")
"""
CRASH = "import os\nos._exit(3)"


def export(course: Path, name: str) -> bytes:
    path = course / name
    nbgrader("export", "--to", str(path), f"--db={grade.db_url(Settings.load(course))}", "--log-level=WARN", root=course)
    return path.read_bytes()


def graded(course: Path, student: str) -> nbformat.NotebookNode:
    return nbformat.read(course / "autograded" / student / A / f"{A}.ipynb", as_version=4)


@pytest.mark.slow
@needs_bwrap
def test_pooled_kernels_are_fresh_per_submission_and_grade_as_cold_ones(tmp_path, monkeypatch):
    course = make_course(tmp_path, [A])
    rel, ref = release_without_demonstrations(released(course, A), A), reference_answers(A)  # the pool: not the plots
    exercise, catalogue = sorted(importlib.import_module(f"autograder.hidden.{module_name(A)}").MISTAKES.items())[0]
    crashing = fill(rel, ref)
    first_test = next(i for i, c in enumerate(crashing.cells) if c.source.lstrip().startswith("from autograder.checks"))
    crashing.cells.insert(first_test + 1, nbformat.v4.new_code_cell(CRASH))
    for student, notebook in (("s1_reference", fill(rel, ref)), ("s2_crash", crashing),
                              ("s3_mistake", fill(rel, dict(ref, **{exercise: mistake_source(catalogue[0], exercise)}))),
                              ("s4_untouched", rel)):
        notebook.cells.insert(0, nbformat.v4.new_code_cell(PROBE))
        submit(course, A, student, notebook)

    runs = {}
    for pool in ("0", "1"):
        monkeypatch.setenv("AUTOGRADER_KERNEL_POOL", pool)
        summary = grade.autograde([A], grading_settings(course, {"Grading.workers": 1}), progress=False)
        assert not summary.failed, str(summary)
        runs[pool] = export(course, f"grades-{pool}.csv")
        probes = {s: "".join(o.get("text", "") for o in graded(course, s).cells[0].outputs)
                  for s in ("s1_reference", "s2_crash", "s3_mistake", "s4_untouched")}
        for student, printed in probes.items():
            assert "seen: False []" in printed, f"{student} found what another submission left: {printed}"
        # the others get a kernel started ahead (PyTorch imported); the first submission of a run, none: its kernel is
        # forked from the zygote (PyTorch imported too) where there is one, else it starts cold
        expected = {"0": [False] * 4, "1": [zygote.usable(), True, True, True]}[pool]
        assert [f"preloaded: {b}" in probes[s] for s, b in zip(sorted(probes), expected)] == [True] * 4, probes
        crashed = graded(course, "s2_crash")
        died = [c for c in crashed.cells if any(o.get("ename") == KERNEL_DIED for o in c.get("outputs", []))]
        assert [c.source for c in died] == [CRASH]
    assert runs["0"] == runs["1"], "the pool changed the grades"
    rows = runs["1"].decode().splitlines()
    assert len(rows) == 5
    score = {r.split(",")[header_index(rows, "student_id")]: float(r.split(",")[header_index(rows, "raw_score")])
             for r in rows[1:]}
    # the crash costs nothing: the kernel is restarted and grading goes on (the crashing cell scores no point)
    assert score["s1_reference"] == score["s2_crash"] > score["s3_mistake"]
    assert score["s4_untouched"] == 0


# Added to an answer cell, which runs in the notebook's kernel and then in the graded kernel: it leaves traces (a
# global, a file in the working folder, in TMPDIR and in the home), and an answer that finds one fails its checks
# saying so. The graded kernel must hold none: not the notebook kernel's, not another submission's.
LEAVES_TRACES = """
import os
places = ["left-by-a-kernel.txt", os.path.join(os.getenv("TMPDIR"), "left-by-a-kernel.txt"),
          os.path.expanduser("~/left-by-a-kernel.txt")]
try:
    LEFT_BY_A_KERNEL
    found = ["a global"]
except NameError:
    found = []
found += [p for p in places if os.path.exists(p)]
LEFT_BY_A_KERNEL = 1
for p in places:
    with open(p, "w") as f:
        f.write("left")
if found:
    def hard_lookup(query, keys, values):
        raise RuntimeError(f"this kernel holds what another one left: {found}")
"""


@pytest.mark.slow
@needs_bwrap
def test_a_graded_kernel_started_ahead_holds_nothing_of_the_notebooks_kernel_nor_of_another_submission(tmp_path):
    course = make_course(tmp_path, [A])
    rel, ref = release_without_demonstrations(released(course, A), A), reference_answers(A)  # the pool: not the plots
    students = ("s1", "s2", "s3")  # the first kernels of a run are forked or cold; the next submissions' come from the pool
    for student in students:
        submit(course, A, student, fill(rel, dict(ref, hard_lookup=ref["hard_lookup"] + LEAVES_TRACES)))
    summary = grade.autograde([A], grading_settings(course, {"Grading.workers": 1}), progress=False)
    assert not summary.failed, str(summary)
    for student in students:
        notebook = graded(course, student)
        answer = next(c for c in notebook.cells if "LEFT_BY_A_KERNEL" in c.source)
        assert not any(o.get("output_type") == "error" for o in answer.outputs), answer.outputs  # it ran, found none
        failed = {c.metadata.nbgrader["grade_id"]: [f"{o['ename']}: {o['evalue']}" for o in c.outputs
                                                    if o.get("output_type") == "error"]
                  for c in notebook.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")}
        assert not {g: e for g, e in failed.items() if e}, f"{student}: {failed}"


def header_index(rows: list[str], name: str) -> int:
    return rows[0].split(",").index(name)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _is_zygote(process: psutil.Process) -> bool:
    try:
        return any("autograder-zygote-" in a for a in process.cmdline())
    except psutil.Error:
        return False


def _kernel_folders(processes: list[psutil.Process]) -> set[str]:
    """The private folders of the sandboxed kernels among ``processes`` (from bwrap's arguments)."""
    found = set()
    for proc in processes:
        try:
            found |= {a for a in proc.cmdline() if Path(a).name.startswith("autograder-kernel-")}
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
@needs_bwrap
def test_a_kernel_waiting_past_the_limit_is_discarded_and_replaced(tmp_path):
    from autograder.engine.forkserver import ForkServer

    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\nc.KernelPool.max_idle = 4\n")
    server = ForkServer(Settings.load(tmp_path))
    try:
        code, _, _ = server.run(["--version"], tmp_path, tool_env(), 120, tmp_path)
        assert code == 0

        def waiting() -> tuple[set[int], set[str]]:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                children = _descendants(server.process.pid)
                folders = _kernel_folders(children)
                if folders:  # the server's waiting processes (its zygote, if any, stays: it is not a kernel)
                    return {p.pid for p in psutil.Process(server.process.pid).children()
                            if not _is_zygote(p)}, folders
                time.sleep(0.2)
            raise AssertionError("no kernel was started ahead")

        first, first_folders = waiting()
        assert any(_is_zygote(p) for p in psutil.Process(server.process.pid).children()) == zygote.usable()
        # past the limit (4 s) it is told to go; under load, ending its kernel and starting the next one takes a while
        deadline = time.monotonic() + 60
        while True:
            time.sleep(1)
            second, second_folders = waiting()
            if not first & second or time.monotonic() > deadline:
                break
        assert first and not first & second, "the waiting process outlived the limit by a minute"
        assert not first_folders & second_folders
        for folder in first_folders:
            assert not Path(folder).exists(), f"the discarded kernel's folder {folder} is left"
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                       for pid in first)
    finally:
        server.close()
    assert server.process.returncode == 0
    assert not any(Path(f).exists() for f in second_folders), "closing the server left a kernel's folder"


@pytest.mark.slow
@needs_bwrap
@pytest.mark.parametrize("checks_in_grader", [True, False])
def test_a_waiting_process_holds_a_kernel_for_the_notebook_and_one_for_the_graded_kernel(tmp_path, checks_in_grader):
    """Where the checks run in the grader, a submission has two kernels: both started ahead, each in its own sandbox."""
    from autograder.engine.forkserver import ForkServer

    (tmp_path / "nbgrader_config.py").write_text(
        f"c = get_config()\nc.ResilientExecute.checks_in_grader = {checks_in_grader}\n")
    server = ForkServer(Settings.load(tmp_path))
    expected = 2 if checks_in_grader else 1
    try:
        assert server.run(["--version"], tmp_path, tool_env(), 120, tmp_path)[0] == 0
        deadline = time.monotonic() + 90
        while len(folders := _kernel_folders(_descendants(server.process.pid))) < expected:
            assert time.monotonic() < deadline, f"{len(folders)} kernels were started ahead, not {expected}"
            time.sleep(0.2)
        time.sleep(2)  # no more than that
        waiting = [p for p in psutil.Process(server.process.pid).children() if not _is_zygote(p)]
        assert len(waiting) == 1 and len(_kernel_folders(_descendants(waiting[0].pid))) == expected
    finally:
        server.close()
    assert not any(Path(f).exists() for f in folders), "closing the server left a kernel's folder"


@pytest.mark.slow
@needs_bwrap
def test_the_zygote_can_be_switched_off(tmp_path):
    from autograder.engine.forkserver import ForkServer

    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\nc.KernelPool.zygote = False\n")
    server = ForkServer(Settings.load(tmp_path))
    try:
        assert server.run(["--version"], tmp_path, tool_env(), 120, tmp_path)[0] == 0
        deadline = time.monotonic() + 60
        while not _kernel_folders(_descendants(server.process.pid)):
            assert time.monotonic() < deadline, "no kernel was started ahead"
            time.sleep(0.2)
        assert not any(_is_zygote(p) for p in _descendants(server.process.pid))
    finally:
        server.close()


def test_the_pool_is_off_when_switched_off_or_without_bubblewrap(monkeypatch):
    from ..notebook_code import ROOT

    def wanted(env: dict[str, str]) -> bool:  # as the fork server decides, from the run's settings
        settings = Settings.load(ROOT, env=env)
        return kernel_pool.wanted(settings.make(kernel_pool.KernelPool),
                                  settings.value(SandboxedKernelManager, "bubblewrap"))

    monkeypatch.setattr(kernel_pool, "mode", lambda bubblewrap: "bwrap" if bubblewrap else "limits only")
    assert wanted({})
    assert not wanted({"AUTOGRADER_KERNEL_POOL": "0"})
    assert not wanted({"AUTOGRADER_SANDBOX": "off"})
    assert not kernel_pool.wanted(kernel_pool.KernelPool(config=Config({"KernelPool": {"enabled": False}})), True)
    monkeypatch.setattr(kernel_pool, "mode", lambda bubblewrap: "limits only")
    assert not wanted({})


def test_a_waiting_process_takes_only_requests_like_the_one_it_was_started_for(tmp_path):
    (r1, w1), (r2, w2) = os.pipe(), os.pipe()
    request = {"cwd": str(tmp_path), "env": {"A": "1", sandbox.RUN_VARIABLE: "run-1"}}
    pool = kernel_pool.Pool(kernel_pool.KernelPool(), enabled=True)
    pool.waiting.append(kernel_pool.Waiting(11, w1, kernel_pool.key(request)))
    other_run = dict(request, env={"A": "1", sandbox.RUN_VARIABLE: "run-2"})
    assert pool.take(other_run).pid == 11  # the run's own mark aside, the same environment
    os.close(w1)
    pool.waiting.append(kernel_pool.Waiting(12, w2, kernel_pool.key(request)))
    assert pool.take(dict(request, env={"A": "2"})) is None and pool.discarded == {12}
    assert os.read(r2, 1) == b"", "the discarded process was not told to go"
    pool.gone(12)
    assert pool.discarded == set()
    assert pool.missing(running=3) == min(3, kernel_pool.KernelPool().size)
    assert kernel_pool.Pool(kernel_pool.KernelPool(), enabled=False).missing(running=3) == 0
    os.close(r1)
    os.close(r2)


def test_a_kernel_started_ahead_is_adopted_only_for_its_command_and_limits():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE)
    kernel = kernel_pool.PreparedKernel(process, Path("/nonexistent"), "token", None, sandbox.Limits(), time.monotonic())
    try:
        cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "kernel.json"]
        assert kernel.fits(cmd, sandbox.Limits())
        assert not kernel.fits(cmd, sandbox.Limits(memory_mb=100))
        assert not kernel.fits(["/usr/bin/python3", *cmd[1:]], sandbox.Limits())
        kernel.stop()
        assert not kernel.fits(cmd, sandbox.Limits())
    finally:
        process.kill()
        process.wait()


def test_each_manager_of_its_submission_adopts_the_next_kernel_started_ahead_once(tmp_path):
    """The kernels reach nbgrader's kernel managers through the configuration, not copied: the notebook's manager
    takes the first, the graded kernel's the second, any later manager none; each is adopted once."""
    processes = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE)
                 for _ in range(2)]
    kernels = [kernel_pool.PreparedKernel(p, tmp_path / f"started-ahead-{i}", f"token-{i}", None, sandbox.Limits(), 0.0)
               for i, p in enumerate(processes)]
    # as the fork server's child passes them to nbgrader, whose application copies its configuration
    started = kernel_pool.StartedAhead(kernels)
    app_config = copy.deepcopy(Config({"SandboxedKernelManager": {"started_ahead": started, "memory_mb": 1234}}))
    made = []
    try:
        execute = ResilientExecute(config=app_config)
        assert execute.kernel_manager_class is SandboxedKernelManager
        made.append(execute.kernel_manager_class(config=execute.config))  # as nbclient makes it
        made.append(execute.kernel_manager_class(config=execute.config))  # as the graded kernel's is made
        assert [(km.private, km.token) for km in made] == [(k.private, k.token) for k in kernels]
        assert [km.take_started_ahead() for km in made] == kernels
        assert [km.take_started_ahead() for km in made] == [None, None]  # a restart does not adopt it again
        assert made[0].limits.memory_mb == 1234
        made.append(SandboxedKernelManager(config=execute.config))  # a third manager (a measured call's kernel)
        made.append(SandboxedKernelManager())
        assert [km.private in {k.private for k in kernels} or km.token in {k.token for k in kernels}
                for km in made[2:]] == [False, False]
        assert [km.take_started_ahead() for km in made[2:]] == [None, None]
        kernels[0].launched = True  # adopted: its manager's provisioner ends it
        started.discard()  # what the grading process does at its end with the kernels no manager launched
        assert [p.poll() is None for p in processes] == [True, False]
    finally:
        for process in processes:
            process.kill()
            process.wait()
        for km in made[2:]:
            shutil.rmtree(km.private, ignore_errors=True)


def test_a_kernel_started_ahead_is_told_its_arguments_then_its_stdin_closes():
    reader = "import sys; print(sys.stdin.readline().strip()); print(repr(sys.stdin.read()))"
    process = subprocess.Popen([sys.executable, "-c", reader], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    kernel = kernel_pool.PreparedKernel(process, Path("/nonexistent"), "token", None, sandbox.Limits(), 0.0)
    kernel.go([sys.executable, "-m", "ipykernel_launcher", "-f", "/run/k.json"])
    out = process.stdout.read()
    process.wait(timeout=60)
    assert out.decode().splitlines() == [json.dumps(["-f", "/run/k.json"]), "''"]


def test_the_limits_are_traits_and_the_environment_overrides_them(monkeypatch):
    """The traits set the limits; the environment overrides them where the run's settings are read, and only there."""
    from ..notebook_code import ROOT

    config = Config({"SandboxedKernelManager": {"memory_mb": 1000, "processes": 7}})
    made = [SandboxedKernelManager(config=config)]
    try:
        assert made[0].limits == sandbox.Limits(memory_mb=1000, processes=7)
        monkeypatch.setenv("AUTOGRADER_MEMORY_MB", "2000")
        assert made[0].limits == sandbox.Limits(memory_mb=1000, processes=7)  # a manager reads no environment
        made.append(Settings.load(ROOT).make(SandboxedKernelManager))
        assert made[1].limits.memory_mb == 2000
    finally:
        for km in made:
            shutil.rmtree(km.private, ignore_errors=True)


def test_the_course_config_sets_the_limits_and_the_pool():
    from autograder.course.settings import course_config

    from ..notebook_code import ROOT

    config = course_config(ROOT)
    assert set(config.SandboxedKernelManager) == set(sandbox.Limits.__dataclass_fields__)
    assert Settings.load(ROOT).make(kernel_pool.KernelPool).max_idle == config.KernelPool.max_idle
