"""Every target of ``make help``, typed in a fresh clone as README.md and the manual say.

:data:`FRONT_DOORS` names the test of each target, and the first test fails when ``make help``
lists a target it does not name (or names a test that does not exist): a new target cannot be
added untested. A term's commands on a graded class are in :mod:`tests.frontdoor.test_a_term`.
Where a target cannot run whole in a test (it needs root, a browser, hours, or it is this suite
itself), its test runs it as far as it can and its docstring says why.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.course.repository import assignments

from ..course_copy import fill, reference_answers
from ..notebook_code import ROOT
from . import user

pytestmark = pytest.mark.skipif(bool(user.why_not()), reason=user.why_not() or "-")

HERE = "tests.frontdoor.test_make_targets"
TERM = "tests.frontdoor.test_a_term"
#: make target -> the test that types it.
FRONT_DOORS = {
    "help": f"{HERE}::test_every_target_of_make_help_has_a_front_door_test",
    "setup": f"{HERE}::test_make_setup_finds_its_environment_and_refuses_an_old_python",
    "exchange": f"{HERE}::test_make_exchange_makes_the_folder",
    "lab": f"{HERE}::test_make_lab_serves_the_course",
    "test": f"{HERE}::test_make_test_runs_the_suite_it_is_part_of",
    "test-fast": f"{HERE}::test_make_test_runs_the_suite_it_is_part_of",
    "test-versions": f"{HERE}::test_make_test_runs_the_suite_it_is_part_of",
    "lint": f"{HERE}::test_make_lint_passes",
    "release": f"{HERE}::test_make_release_regenerates_what_is_committed",
    "new-notebook": f"{HERE}::test_make_new_notebook_writes_and_releases_it",
    "settings": f"{HERE}::test_make_settings_prints_the_table",
    "docs": "tests.course.test_docs::test_make_docs_builds_the_manual_without_a_warning",
    "collect-zip": f"{TERM}::test_make_collect_zip_puts_each_student_in_submitted",
    "autograde": f"{TERM}::test_make_autograde_grades_the_class",
    "feedback": f"{TERM}::test_make_feedback_names_the_mistake_and_hides_the_hidden_tests",
    "grades": f"{TERM}::test_make_grades_writes_both_csvs_with_every_student",
    "report": f"{TERM}::test_make_report_counts_the_named_mistakes",
    "similarity": f"{TERM}::test_make_similarity_finds_the_answers_that_match_the_reference",
    "student-bundle": f"{HERE}::test_make_student_bundle_and_the_students_commands",
    "hub": f"{HERE}::test_make_hub_refuses_what_it_cannot_serve",
    "gradescope": f"{HERE}::test_make_gradescope_builds_an_autograder_zip",
    "bench": f"{HERE}::test_the_benchmarks_start",
    "bench-similarity": f"{HERE}::test_the_benchmarks_start",
    "bench-hub": f"{HERE}::test_the_benchmarks_start",
    "bench-grading": f"{HERE}::test_the_benchmarks_start",
    "bench-memory": f"{HERE}::test_the_benchmarks_start",
    "clean": f"{HERE}::test_make_clean_removes_what_it_says_and_nothing_else",
}


@pytest.fixture(scope="module")
def course():
    """One clone for the targets that only read it or write their own files."""
    folder = user.clone()
    yield folder
    user.remove(folder)


@pytest.fixture
def own_clone():
    """A clone for one test that changes it."""
    folder = user.clone()
    yield folder
    user.remove(folder)


def test_every_target_of_make_help_has_a_front_door_test(course):
    done = user.make(course, "help")
    assert done.returncode == 0, user.said(done)
    listed = re.findall(r"^  make (\S+)", done.stdout, re.M)
    assert "help" in listed and "grades" in listed, done.stdout
    untested = sorted(set(listed) - set(FRONT_DOORS))
    assert not untested, f"targets of make help without a front-door test (add one to FRONT_DOORS): {untested}"
    gone = set(FRONT_DOORS) - set(listed)
    assert not gone, f"FRONT_DOORS names targets make help does not list: {gone}"
    for target, test in FRONT_DOORS.items():
        module, name = test.split("::")
        assert callable(getattr(importlib.import_module(module), name, None)), f"make {target}: {test} does not exist"


def test_make_setup_finds_its_environment_and_refuses_an_old_python(course):
    done = user.make(course, "setup")
    assert done.returncode == 0, user.said(done)
    assert f"make: Python {user.VERSION}" in done.stdout and "pip install" not in done.stdout, user.said(done)
    old = next((p for p in sorted(Path("~/.pyenv/versions").expanduser().glob("3.10.*/bin/python3.10"))), None)
    if old is None:
        pytest.skip("no Python 3.10 here to see make setup refuse it")
    refused = user.make(course, "setup", f"PYTHON={old}", "VENV=.venv-old", pinned=False)
    assert refused.returncode != 0 and "is not Python 3.11 or newer" in refused.stdout, user.said(refused)
    assert not (course / ".venv-old").exists()


def test_make_exchange_makes_the_folder(own_clone):
    done = user.make(own_clone, "exchange")
    assert done.returncode == 0 and (own_clone / "exchange").is_dir(), user.said(done)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def served(command: list[str], cwd: Path, env: dict[str, str], path: str) -> tuple[int, str, str]:
    """Start a JupyterLab as ``command``, read ``path`` from it with the token it printed, stop it: status, page, log."""
    port = free_port()
    env = env | {"JUPYTER_PORT": str(port), "BROWSER": "true"}  # BROWSER: no browser is opened on this machine
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, stdin=subprocess.DEVNULL)
    log = []
    try:
        for line in process.stdout:  # until it says where it listens (or ends)
            log.append(line)
            found = re.search(rf"(http://(?:127\.0\.0\.1|localhost|\[::1\]):{port})/\S*token=(\w+)", line)
            if found:
                break
        else:
            return process.wait(), "", "".join(log)
        while True:  # the address is printed a moment before the server listens there: until it answers or ends
            try:
                with urllib.request.urlopen(f"{found.group(1)}{path}?token={found.group(2)}", timeout=user.HANG) as page:
                    return page.status, page.read().decode(), "".join(log)
            except urllib.error.URLError as refused:
                if process.poll() is not None or not isinstance(refused.reason, ConnectionRefusedError):
                    raise
                time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=user.HANG)


def test_make_lab_serves_the_course(own_clone):
    """`make lab` started, its page read (JupyterLab, with Formgrader's server extension), then stopped: no browser here."""
    status, page, log = served(["make", "lab", *user.CHOSEN], own_clone, user.user_env(), "/lab/tree/notebooks")
    assert status == 200 and "JupyterLab" in page, log
    assert (own_clone / "exchange").is_dir()
    assert "formgrader" in log.lower() or "nbgrader" in log.lower(), log


def test_make_test_runs_the_suite_it_is_part_of(course):
    """`make test` and `make test-fast` are this suite: run inside it they would run themselves; `make test-versions`
    runs a test of this suite with environments of their own (PyPI's PyTorch, GBs each). Here `make -n` shows what
    each runs, in the clone's environment; CI (.ci/run) types `make test` whole."""
    for target, expected in (("test", ["ruff check autograder tests bench", "pytest -n 2", "tests solutions"]),
                             ("test-fast", ['-m "not slow" tests']),
                             ("test-versions", ['COURSE_TEST_VERSIONS="oldest newest"', "pytest tests/course/"])):
        done = user.make(course, "-n", target)
        assert done.returncode == 0, user.said(done)
        assert "pip install" not in done.stdout, f"make {target} would install again: {done.stdout}"
        for part in expected:
            assert part in done.stdout, f"make {target}: {part!r} not in {done.stdout}"


def test_make_lint_passes(course):
    done = user.make(course, "lint")
    assert done.returncode == 0 and "All checks passed" in done.stdout, user.said(done)


@pytest.mark.slow
def test_make_release_regenerates_what_is_committed(own_clone):
    first = assignments()[0]
    done = user.make(own_clone, "release", f"ASSIGNMENTS={first}")
    assert done.returncode == 0, user.said(done)
    released = own_clone / "notebooks" / f"{first}.ipynb"
    assert released.read_bytes() == (ROOT / "notebooks" / f"{first}.ipynb").read_bytes(), "make release changed it"
    assert (own_clone / "gradebook.db").is_file()  # it records the assignment


@pytest.mark.slow
def test_make_new_notebook_writes_and_releases_it(own_clone):
    refused = user.make(own_clone, "new-notebook")
    assert refused.returncode != 0 and "say NAME=NN_name" in refused.stdout, user.said(refused)
    done = user.make(own_clone, "new-notebook", "NAME=12_row_weights", "TITLE=Row weights")
    assert done.returncode == 0, user.said(done)
    for made in ("source/12_row_weights/12_row_weights.ipynb", "autograder/checks/row_weights.py",
                 "autograder/hidden/row_weights.py", "notebooks/12_row_weights.ipynb"):
        assert (own_clone / made).is_file(), made


def test_make_settings_prints_the_table(course):
    done = user.make(course, "settings")
    assert done.returncode == 0, user.said(done)
    assert re.search(r"\| `ResilientExecute.notebook_timeout` \| \d+ \|", done.stdout), done.stdout[-2000:]


@pytest.mark.slow
def test_make_student_bundle_and_the_students_commands(own_clone, tmp_path):
    """`make student-bundle`, then what its README tells a student to type, with this environment
    (`--python`: installing requirements.txt is tests/course/test_validate.py's, COURSE_TEST_BUNDLE_SETUP=1)."""
    done = user.make(own_clone, "student-bundle")
    assert done.returncode == 0, user.said(done)
    with zipfile.ZipFile(own_clone / "dist" / "attention-course.zip") as archive:
        archive.extractall(tmp_path)
    folder = tmp_path / "attention-course"
    readme = (folder / "README.md").read_text()
    assert "python3 course.py validate 01_soft_lookup.ipynb" in readme and '--python "$(which python)"' in readme
    python = str(user.VENV / "bin" / "python")
    env = user.user_env()
    checked = subprocess.run(["python3", "course.py", "--python", python, "setup"], cwd=folder, env=env,
                             capture_output=True, text=True, timeout=user.HANG)
    assert checked.returncode == 0 and "ready: python3 course.py opens JupyterLab" in checked.stdout, user.said(checked)
    validated = subprocess.run(["python3", "course.py", "--python", python, "validate", "01_soft_lookup.ipynb"],
                               cwd=folder, env=env, capture_output=True, text=True, timeout=user.HANG)
    out = validated.stdout + validated.stderr
    # the released notebook, unanswered: every check says so, and the exit status too
    assert validated.returncode == 1 and "VALIDATION FAILED ON" in out and "is not written yet" in out, out[-3000:]
    answered = folder / "answered.ipynb"
    nbformat.write(fill(nbformat.read(folder / "01_soft_lookup.ipynb", as_version=4), reference_answers("01_soft_lookup")),
                   answered)
    validated = subprocess.run(["python3", "course.py", "--python", python, "validate", answered.name],
                               cwd=folder, env=env, capture_output=True, text=True, timeout=user.HANG)
    assert validated.returncode == 0 and "Success" in validated.stdout, user.said(validated)
    status, page, log = served(["python3", "course.py", "--python", python], folder, env, "/lab/tree/01_soft_lookup.ipynb")
    assert status == 200 and "JupyterLab" in page, log


def test_make_hub_refuses_what_it_cannot_serve(course):
    """`make hub` for real needs root, Linux users and a browser: tests/service/test_hub.py starts the hub as make
    does. Here: it says who may log in, and, typed by a user who is not root, that it needs root."""
    done = user.make(course, "hub")
    if os.geteuid() == 0:
        assert done.returncode == 2 and "say who may log in" in done.stdout, user.said(done)
        setpriv = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "make", "hub",
                                  "COURSE_STUDENTS=alice", *user.CHOSEN], cwd=course, env=user.user_env(),
                                 capture_output=True, text=True, timeout=user.HANG)
        done = setpriv
    assert done.returncode == 2 and "make hub: run it as root" in done.stdout, user.said(done)
    assert not (course / "hub" / "node_modules").exists()  # refused before installing anything


@pytest.mark.slow
def test_make_gradescope_builds_an_autograder_zip(own_clone):
    """The zip's own scripts (setup.sh, run_autograder) run in tests/grading/test_gradescope.py, as Gradescope runs them."""
    first = assignments()[0]
    done = user.make(own_clone, "gradescope", f"ASSIGNMENTS={first}")
    assert done.returncode == 0, user.said(done)
    with zipfile.ZipFile(own_clone / "dist" / "gradescope" / f"{first}.zip") as archive:
        names = set(archive.namelist())
    assert {"setup.sh", "run_autograder"} <= names, sorted(names)


#: Starts each script given as typed (``python bench/x.py --help``), one after the other in one Python, so that their
#: imports (PyTorch, nbgrader) are paid once, not once a script; prints each one's exit status and output.
START_EACH = """
import contextlib, io, runpy, sys
for script in sys.argv[1:]:
    sys.argv, out = [script, "--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code or 0
    print(f"== {script} {code}", out.getvalue(), sep="\\n")
"""


def test_the_benchmarks_start(course):
    """A benchmark takes minutes to hours and its figures are not a verdict: each bench target's scripts are listed
    by `make -n` and each answers --help (it starts, with its imports, in the clone), or compiles where it has no
    options."""
    scripts = set()
    for target in ("bench", "bench-similarity", "bench-hub", "bench-grading", "bench-memory"):
        done = user.make(course, "-n", target)
        assert done.returncode == 0, user.said(done)
        listed = re.findall(r"python (bench/\S+\.py)", done.stdout)
        assert listed, done.stdout
        scripts |= set(listed)
    # a script without options would start measuring at --help: Python compiles it instead
    helped = sorted(s for s in scripts if "ArgumentParser" in (course / s).read_text())
    python = str(user.VENV / "bin" / "python")
    compiled = subprocess.run([python, "-m", "py_compile", *sorted(scripts - set(helped))], cwd=course,
                              env=user.user_env(), capture_output=True, text=True, timeout=user.HANG)
    assert compiled.returncode == 0, user.said(compiled)
    started = subprocess.run([python, "-c", START_EACH, *helped], cwd=course, env=user.user_env(), capture_output=True,
                             text=True, timeout=user.HANG)
    assert started.returncode == 0, user.said(started)
    answers = dict(re.findall(r"^== (\S+) (.*)$", started.stdout, re.M))
    assert sorted(answers) == helped, user.said(started)
    for script in helped:
        said = started.stdout.split(f"== {script} ", 1)[1].split("\n== ", 1)[0]
        assert answers[script] == "0" and "usage" in said, f"{script}: {said}"


def test_make_clean_removes_what_it_says_and_nothing_else(own_clone):
    """In the clone, with its own .venv (VENV's default), so that the environment of these tests stays."""
    made = [".venv/bin", "build/x", "autograded/a", "feedback/a", "report/x", "docs/_build/html"]
    for folder in made:
        (own_clone / folder).mkdir(parents=True)
    for file in ("gradebook.db", "grades.csv", "grades-canvas.csv"):
        (own_clone / file).write_text("x")
    tracked = sorted(p.relative_to(own_clone) for p in own_clone.rglob("*") if p.is_file())
    done = user.make(own_clone, "clean", pinned=False)
    assert done.returncode == 0, user.said(done)
    for name in (".venv", "build", "autograded", "feedback", "report", "docs/_build", "gradebook.db", "grades.csv"):
        assert not (own_clone / name).exists(), name
    assert (own_clone / "source").is_dir() and (own_clone / "Makefile").is_file()
    left = {p.relative_to(own_clone) for p in own_clone.rglob("*") if p.is_file()}
    assert {p for p in tracked if p.parts[0] not in {"gradebook.db", "grades.csv", "grades-canvas.csv"}} <= left
