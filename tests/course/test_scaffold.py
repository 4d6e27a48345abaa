"""`make new-notebook`: the files of a new notebook pass the test suite and grade as the others do."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from autograder.course import scaffold
from autograder.engine import sandbox

from ..notebook_code import ROOT

NAME = "10_row_weights"


def test_a_name_that_is_not_a_notebook_name_is_refused(tmp_path):
    for bad in ("10-row", "row_weights", "1_row", "10_Row", "10_row weights", "10_"):
        with pytest.raises(ValueError, match="not a notebook name"):
            scaffold.create(bad, root=tmp_path)
    assert not any(tmp_path.iterdir())


def test_nothing_is_overwritten(tmp_path):
    (tmp_path / "autograder" / "checks").mkdir(parents=True)
    (tmp_path / "autograder" / "checks" / "row_weights.py").write_text("# the author's work\n")
    with pytest.raises(FileExistsError, match="checks/row_weights.py"):
        scaffold.create(NAME, root=tmp_path)
    assert (tmp_path / "autograder" / "checks" / "row_weights.py").read_text() == "# the author's work\n"
    assert not (tmp_path / "source").exists()  # all or nothing
    (tmp_path / "source" / "07_row_weights").mkdir(parents=True)  # the module name is taken by another notebook
    with pytest.raises(FileExistsError, match="07_row_weights"):
        scaffold.create("11_row_weights", root=tmp_path)


GRADE = textwrap.dedent(f"""
    from pathlib import Path
    from nbgrader.api import Gradebook
    from autograder.course.settings import Settings
    from autograder.grading import grade
    from tests.course_copy import fill, grading_settings, make_course, reference_answers, released, submit

    Path("course").mkdir()
    course = make_course(Path("course").resolve(), ["{NAME}"])
    student = released(course, "{NAME}")
    submit(course, "{NAME}", "reference", fill(student, reference_answers("{NAME}")))
    submit(course, "{NAME}", "untouched", student)
    summary = grade.autograde(["{NAME}"], grading_settings(course, {{"Grading.workers": 2}}), progress=False)
    assert not summary.failed, str(summary)
    with Gradebook(grade.db_url(Settings.load(course))) as gb:
        reference = gb.find_submission("{NAME}", "reference")
        assert reference.max_score == 3 and reference.score == 3, reference.score
        assert gb.find_submission("{NAME}", "untouched").score == 0
    print("graded as expected")
""")


@pytest.mark.slow
@pytest.mark.skipif(sandbox.mode() == "limits only", reason=f"grading needs the sandbox: {sandbox.why_not()}")
def test_a_new_notebook_passes_the_suite_and_grades(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    for part in ("autograder", "tests"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for part in ("nbgrader_config.py", "pyproject.toml"):
        shutil.copy(ROOT / part, copy / part)
    (copy / "source").mkdir()
    written = scaffold.create(NAME, "Row weights", root=copy)
    assert {p.relative_to(copy).as_posix() for p in written} == {
        f"source/{NAME}/{NAME}.ipynb", "autograder/references/row_weights.py", "autograder/checks/row_weights.py",
        "autograder/hidden/row_weights.py", "autograder/hidden/mistakes/row_weights.toml",
        f"tests/checks/test_notebook_{NAME}.py"}
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONWARNINGS="ignore")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # every test that runs over the notebooks of source/ (here only the new one), and the new one's own file
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                            "-m", "not slow", "tests/checks/test_catalogue.py", f"tests/checks/test_notebook_{NAME}.py"],
                           cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and " failed" not in tests.stdout, tests.stdout[-500:]
    # through nbgrader, in the sandbox: the reference scores full marks, the untouched release 0
    graded = subprocess.run([sys.executable, "-c", GRADE], cwd=copy, env=env, capture_output=True, text=True,
                            timeout=600)
    assert graded.returncode == 0 and "graded as expected" in graded.stdout, graded.stdout[-2000:] + graded.stderr[-3000:]
